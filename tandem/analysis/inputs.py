"""A study page's inputs, committed beside it: what the page is rendered from, and nothing else.

``docs/results/data/<page>/`` holds, in kilobytes:

- ``study.json``: the study's settings (title, sets, checkpoint, margins with their reasons, the
  pull-back's top share, the world it is compared with), the command that measured the inputs
  and the commit it ran at;
- ``base.json``: the base's evaluation (its figures and per-problem summaries);
- ``runs/<arm>-seed<seed>.json``: each run's folder, optimizer steps, the commits it was trained
  and evaluated at, its evaluation's figures (``results.json`` flattened over the study's sets),
  its per-problem summaries (``tandem.analysis.problems.summarize``) and its validation curve;
- ``pullback.json``: per GRPO seed, each other run's pull-back against it on its texts
  (``tandem.analysis.pullback``, with each problem's influence) and the paper's own statistics.

``python -m tandem.analysis.study --from-results docs/results/data/<page>`` renders the page from
these alone, byte for byte the page the measuring run wrote (``tests/analysis/test_pages.py``).
Lists are written on one line each, so a file stays small and a diff stays readable.

What this file leaves out: measuring the inputs (``tandem.analysis.study``) and the page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STUDY, BASE, RUNS, PULLBACK = "study.json", "base.json", "runs", "pullback.json"


@dataclass(frozen=True)
class RunInputs:
    """One run's committed inputs (``runs/<arm>-seed<seed>.json``).

    Attributes:
        arm, seed: the run's arm (``experiment_name``) and seed.
        folder: where the run was, as the page names it.
        steps: its optimizer steps (``trainer.max_steps``).
        trained: ``[commit, from step]`` of each start (``tandem.provenance.run_commits``).
        evaluated: the commit its evaluation ran at (``unrecorded`` where none was kept).
        metrics: its evaluation's figures over the study's sets (``greedy/`` for the greedy set).
        problems: per set, per-problem summaries.
        validation: per validation key, ``{step: accuracy}``.
    """

    arm: str
    seed: int
    folder: str
    steps: int
    trained: list[list[Any]]
    evaluated: str
    metrics: dict[str, float]
    problems: dict[str, dict[str, Any]]
    validation: dict[str, dict[str, float]]

    @property
    def name(self) -> str:
        return f"{self.arm}-seed{self.seed}"


@dataclass(frozen=True)
class Inputs:
    """A page's inputs, as read from its folder."""

    folder: Path
    study: dict[str, Any]
    base: dict[str, Any]
    runs: list[RunInputs]
    pullback: dict[str, Any]

    def arm(self, name: str) -> list[RunInputs]:
        """The runs of one arm, by seed."""
        return sorted((r for r in self.runs if r.arm == name), key=lambda r: r.seed)

    @property
    def arms(self) -> list[str]:
        """The arms, GRPO, Tandem RL and kl_reg first."""
        found = {r.arm for r in self.runs}
        first = [a for a in ("grpo", "trl", "kl_reg") if a in found]
        return first + sorted(found - set(first))


def dump(value: Any, indent: int = 0) -> str:
    """JSON with dicts indented and every list on one line."""
    if isinstance(value, dict) and value:
        pad = " " * (indent + 2)
        items = [f"{pad}{json.dumps(str(k))}: {dump(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    return json.dumps(value, separators=(",", ":"))


def write(folder: Path, study: dict, base: dict, runs: list[RunInputs], pullback: dict) -> None:
    """Write a page's inputs to ``folder`` (its ``runs/`` emptied first)."""
    folder = Path(folder)
    (folder / RUNS).mkdir(parents=True, exist_ok=True)
    for old in (folder / RUNS).glob("*.json"):
        old.unlink()
    (folder / STUDY).write_text(dump(study) + "\n")
    (folder / BASE).write_text(dump(base) + "\n")
    (folder / PULLBACK).write_text(dump(pullback) + "\n")
    for run in runs:
        fields = {k: getattr(run, k) for k in RunInputs.__dataclass_fields__}
        (folder / RUNS / f"{run.name}.json").write_text(dump(fields) + "\n")


def read(folder: str | Path) -> Inputs:
    """A page's inputs from ``folder``; a missing file is named with how to make it."""
    folder = Path(folder)
    if not (folder / STUDY).is_file():
        raise FileNotFoundError(
            f"{folder / STUDY} is missing: {folder} holds no study inputs. Measure them with "
            "python -m tandem.analysis.study (it writes docs/results/data/<page>/)."
        )
    load = lambda name: json.loads((folder / name).read_text())  # noqa: E731
    runs = [RunInputs(**json.loads(p.read_text())) for p in sorted((folder / RUNS).glob("*.json"))]
    runs.sort(key=lambda r: (r.arm, r.seed))
    pullback = load(PULLBACK) if (folder / PULLBACK).is_file() else {}
    return Inputs(folder, load(STUDY), load(BASE), runs, pullback)
