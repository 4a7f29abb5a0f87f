"""The study's pages: rendered from their inputs alone, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

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


ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
# every study page in docs/results (README.md and memory.md are written by hand and by
# benchmarks/memory.py); pages whose runs are not yet read by this procedure wait in superseded/
PAGES = sorted(p.stem for p in RESULTS.glob("*.md") if p.stem not in ("README", "memory"))


def test_every_page_has_its_inputs_committed() -> None:
    data = RESULTS / "data"
    folders = sorted(p.name for p in data.iterdir() if p.is_dir()) if data.is_dir() else []
    assert folders == PAGES, "a page in docs/results without its inputs, or inputs without a page"


@pytest.mark.parametrize("page", PAGES)
def test_each_committed_page_is_its_committed_inputs_rendered(page: str, monkeypatch) -> None:
    """``python -m tandem.analysis.study --from-results docs/results/data/<page>`` rewrites the
    committed page byte for byte, from kilobytes of committed inputs, at a clean commit."""
    monkeypatch.chdir(ROOT)
    folder = Path("docs/results/data") / page
    got = inputs.read(folder)
    assert got.study["out"] == f"docs/results/{page}.md" and got.study["data"] == str(folder)
    assert not got.study["measured_at"].endswith("+dirty"), "measured from a clean commit"
    assert sum(p.stat().st_size for p in folder.rglob("*.json")) < 400_000
    other = got.study.get("compare_data")
    compared = inputs.read(folder.parent / other) if other else None
    assert render(got, compared) == (ROOT / "docs" / "results" / f"{page}.md").read_text()


def test_a_folder_without_inputs_is_named_with_the_fix(tmp_path: Path, capsys) -> None:
    from tandem.analysis.study import main

    with pytest.raises(SystemExit):
        main(["--from-results", str(tmp_path / "nothing")])
    said = capsys.readouterr().err
    assert "nothing/study.json is missing" in said and "python -m tandem.analysis.study" in said
