"""Measuring a study's inputs from its runs, and rendering a page from its inputs.

``measure`` evaluates what is not yet evaluated (``tandem.analysis.study.evaluate``), then reads
each evaluation into kilobytes (its figures, per-problem summaries, the commits it was trained
and evaluated at, its validation curve), runs the pull-back of every run against every GRPO seed
on that seed's solo texts (cached in the GRPO seed's evaluation folder as ``pullback.json``), and
writes the page's inputs (``tandem.analysis.inputs``). ``render_folder`` turns inputs into the
page; the measuring run and ``--from-results`` both go through it, so both write the same bytes.

What this file leaves out: the intervals and verdicts (``tandem.analysis.estimates``), the page's
wording (``tandem.analysis.page``) and the evaluations themselves (``tandem.evaluate``).
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tandem.analysis import inputs as stored
from tandem.analysis.displacement import displacement
from tandem.analysis.estimates import null_seeds
from tandem.analysis.problems import summarize
from tandem.analysis.pullback import halves, problem_probabilities, pullback
from tandem.analysis.study import Run, Study, evaluate, find_runs
from tandem.provenance import run_commits, source_commit

log = logging.getLogger(__name__)
VALIDATION_KEYS = ("val/solo/accuracy", "val/tandem/accuracy")


def measure(study: Study, overrides: Sequence[str], command: str) -> Path:
    """Evaluate and measure every finished run of ``study``; write its inputs folder."""
    runs, unfinished = find_runs(study.runs)
    for folder in unfinished:
        log.warning("skipping %s: not finished (no exported senior yet)", folder)
    if not runs:
        raise FileNotFoundError(
            f"no finished training run under {study.runs}: run python -m tandem.train "
            "--config-name reproduce first (or pass the folder of your sweep)."
        )
    merged = study.overrides(overrides)
    base_folder = study.runs / "eval_base"
    base = _evaluation(study, study.base, base_folder, merged)
    seniors, folders, found = {}, {}, []
    for run in runs:
        source, seniors[run.path], folders[run.path] = run.evaluated(study.checkpoint)
        got = _evaluation(study, source, folders[run.path], merged)
        found.append(
            stored.RunInputs(
                run.arm,
                run.seed,
                str(run.path),
                run.steps,
                [list(x) for x in run_commits(run.path)],
                got["evaluated"],
                got["metrics"],
                got["problems"],
                validation(run.path),
            )
        )
    moved = measure_pullback(study, runs, seniors, folders)
    stored.write(study.inputs, settings(study, command), base, found, moved)
    return study.inputs


def settings(study: Study, command: str) -> dict[str, Any]:
    """What the page needs of the study, with the command and commit that measured it."""
    compare = None
    if study.compare:
        other = Study.load(study.compare)
        suffix = "_last" if study.checkpoint == "last" else ""
        compare = f"{other.out.stem}{suffix}"  # the sibling folder of the other page's inputs
    return {
        "study": study.name,
        "title": study.title,
        "out": str(study.out),
        "runs": str(study.runs),
        "base": study.base,
        "sets": list(study.sets),
        "greedy": study.greedy,
        "checkpoint": study.checkpoint,
        "describes": study.describes,
        "compare": study.compare,
        "compare_data": compare,
        "data": str(study.inputs),
        "margins": study.margins,
        "top_share": study.top_share,
        "command": command,
        "measured_at": source_commit(),
    }


def _evaluation(study: Study, senior: str, folder: Path, overrides: list[str]) -> dict:
    results = evaluate(senior, folder, overrides)
    commits = run_commits(folder)
    return {
        "evaluated": commits[0][0] if commits else "unrecorded",
        "metrics": flatten(results, study),
        "problems": summarize(folder / "generations", study.sets),
    }


def flatten(results: dict[str, Any], study: Study) -> dict[str, float]:
    """``results.json`` as one table: each metric's mean over the study's sets (the paper's
    macro mean; the set's own value for one set), the greedy set's under ``greedy/``."""
    tables = [results["sets"].get(name, {}) for name in study.sets]
    shared = set.intersection(*(set(t) for t in tables))
    out = {k: sum(float(t[k]) for t in tables) / len(tables) for k in sorted(shared)}
    for key, value in results["sets"].get(study.greedy, {}).items():
        out[f"greedy/{key}"] = float(value)
    return out


def validation(folder: Path) -> dict[str, dict[str, float]]:
    """The validation accuracies a run logged (``csv/version_*/metrics.csv``, resumed versions
    in order), ``{key: {step: value}}``."""
    seen: dict[str, dict[str, float]] = {}
    for path in sorted(folder.glob("csv/version_*/metrics.csv")):
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                for key in VALIDATION_KEYS:
                    if row.get(key):
                        seen.setdefault(key, {})[str(int(row["step"]))] = float(row[key])
    return seen


def measure_pullback(
    study: Study, runs: list[Run], seniors: dict[Path, Path], folders: dict[Path, Path]
) -> dict[str, Any]:
    """Per GRPO seed, the pull-back of its seed's other arms and of the next GRPO seeds
    (``tandem.analysis.estimates.null_seeds``)."""
    grpo = {r.seed: r for r in runs if r.arm == "grpo"}
    out: dict[str, Any] = {"top_share": study.top_share, "references": {}}
    for seed, reference in sorted(grpo.items()):
        others = [r for r in runs if r.seed == seed and r.arm != "grpo"]
        others += [grpo[s] for s in null_seeds(seed, list(grpo))]
        cache = folders[reference.path] / "pullback.json"
        found = json.loads(cache.read_text()) if cache.is_file() else {}
        if found.get("top_share") != study.top_share:
            found = {"top_share": study.top_share, "runs": {}}
        pending = [r for r in others if r.path.name not in found["runs"]]
        if pending:
            texts = [folders[reference.path] / "generations" / f"{s}.jsonl" for s in study.sets]
            seniors_of = {r.path.name: seniors[r.path] for r in pending}
            found["runs"].update(_pullbacks(study, seniors[reference.path], seniors_of, texts))
            cache.write_text(json.dumps(found, indent=1) + "\n")
        found["runs"] = {r.path.name: found["runs"][r.path.name] for r in others}
        out["references"][str(seed)] = found
    return out


def _pullbacks(
    study: Study, grpo: Path, others: dict[str, Path], texts: Sequence[Path]
) -> dict[str, dict[str, Any]]:
    """Each of ``others`` read against ``grpo`` on ``texts`` (one model loaded at a time)."""
    from tandem.evaluation.records import read_records
    from tandem.modules.models import load_causal_lm

    records = [r for path in texts for r in read_records(path) if r["mode"] == "solo"]

    def sums(model: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
        got, positions, _ = problem_probabilities([load_causal_lm(str(model)).eval()], records)
        return got, positions

    base, positions = sums(study.base)
    reference, _ = sums(grpo)
    first = halves(len(positions))
    found = {}
    for name, senior in others.items():
        other, _ = sums(senior)
        got = pullback(torch.cat([base, reference, other]), positions, first, study.top_share)
        means = torch.cat([base, reference, other]).sum(1) / positions.sum()  # [3, V]
        raw = displacement(means[0], means[1], means[2], got.items)
        found[name] = {
            "value": got.value,
            "top": got.top,
            "rest": got.rest,
            "items": got.items,
            "pulled_back": raw.pulled_back,
            "pullback_rho": raw.pullback_rho,
            "spearman_top": raw.spearman_top,
            "influence": [float(f"{x:.5g}") for x in got.influence.tolist()],
        }
        log.info("pull-back of %s against %s: %+.3f", name, grpo, got.value)
    return found


def render_folder(folder: str | Path) -> Path:
    """Render the page of the inputs in ``folder`` to the page its study names."""
    from tandem.analysis.page import render

    inputs = stored.read(folder)
    compared = None
    other = inputs.study.get("compare_data")
    if other and (Path(folder).parent / other / stored.STUDY).is_file():
        compared = stored.read(Path(folder).parent / other)
    out = Path(inputs.study["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(inputs, compared))
    return out
