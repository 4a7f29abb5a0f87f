"""The study's pages: rendered from their inputs alone, byte for byte."""

from __future__ import annotations

from pathlib import Path

from tandem.analysis import inputs
from tandem.analysis.measure import render_folder
from tandem.analysis.page import render


def test_a_page_renders_the_same_from_its_written_inputs(synthetic_inputs: Path) -> None:
    first = render(inputs.read(synthetic_inputs))
    out = render_folder(synthetic_inputs)
    assert out.read_text() == first
    # the synthetic Tandem RL takes back half of GRPO's move: its pull-back reproduces
    assert "| 3 | `pullback` | ±0.25 | +" in first and "| Reproduces | holds" in first
    assert "## Calibration: GRPO seeds against GRPO seeds" in first
