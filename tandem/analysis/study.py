"""The paper's four claims, measured on finished training runs: ``python -m tandem.analysis.study``.

Reads every finished run under a sweep folder (``multirun/tiny_world`` by default, as written by
``python -m tandem.train --config-name reproduce``), evaluates each run's exported senior and
the base once with ``tandem.evaluate`` (skipping evaluations already on disk, so an interrupted
study resumes), runs the displacement analysis per seed, and writes a Markdown page with one
table per claim: each arm's mean and 95% t-interval over seeds, the paper's figure beside it,
and a verdict per metric (``tandem.analysis.claims``: a directional claim reproduces when the
interval of the difference is clear of zero the paper's way; "on par" is an equivalence test
within ``--margin``).

The claims (Tandem RL, ``trl``, against vanilla GRPO, ``grpo``, and GRPO with a KL penalty
toward the junior, ``kl_reg``):

1. solo accuracy on par with GRPO;
2. better accuracy when the senior hands off to the junior under the reasoning-step schedule;
3. lower drift from the base (KL per token), and most of the tokens GRPO displaced most pulled
   back toward the base (the share, and the Spearman correlation of GRPO's displacement with
   Tandem RL's shift from GRPO);
4. higher legibility to the junior (lower junior cross-entropy, higher overlap).

Every Tandem-RL-minus-GRPO figure is also read against a null, GRPO seed minus GRPO seed over
the pairs of GRPO seeds the study has (``tandem.analysis.claims.null_verdict``; the displacement
analysis of every GRPO seed against every other, ``tandem.analysis.displacement``), and the page
gives each claim's verdict before and after the null. Beside the seed-level intervals, a paired
bootstrap over problems and each arm's coverage (``tandem.analysis.problems``).

A study with ``compare`` (``conf/study/notation.yaml``: ``compare: tiny``) also sets GRPO's drift
from the base (KL, the junior's cross-entropy, the drop from solo to handoff accuracy) against the
other study's world, with Welch's interval of the difference: can this world tell?

A run is finished when its exported senior (``<run>/senior/config.json``) exists; the exported
senior is the last step's. Every figure on the page comes from the runs it names.

What this file leaves out: training (``tandem.train``) and the metrics (``tandem.evaluation``).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import logging
import math
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from tandem.analysis.claims import (
    CLAIMS,
    MARGIN,
    Claim,
    difference_interval,
    null_verdict,
    reading,
    seed_pair_differences,
    seed_tests,
    t_interval,
    verdict,
)
from tandem.analysis.problems import problem_section
from tandem.provenance import run_commits, source_commit

log = logging.getLogger(__name__)

ARMS = ("grpo", "trl", "kl_reg")
VALIDATION_KEYS = ("val/solo/accuracy", "val/tandem/accuracy")
CONF = Path(__file__).resolve().parents[2] / "conf"
CHECKPOINTS = ("selected", "last")
# where each run's evaluation goes, by which senior it evaluates: two choices never share one
EVAL_FOLDERS = {"selected": "eval", "last": "eval_last"}
# GRPO's drift from the base, as another world's page is set against: (key, what it is); a drop
# is the solo figure minus the handoff figure of the same seed
DRIFT = (
    ("drift/kl", "KL to the base (nats per token)"),
    ("legibility/junior_ce", "the junior's cross-entropy on the senior's text (nats per token)"),
    ("drop", "solo minus handoff pass@1"),
    ("greedy/drop", "greedy solo minus handoff accuracy"),
)
# what the paper reports (Tandem RL vs GRPO); None where it states a direction, not a figure
PAPER = {
    "drift/kl": {"trl": 0.022, "grpo": 0.026},
    "legibility/junior_ce": {"trl": 0.122, "grpo": 0.132},
    "legibility/overlap": {"trl": 0.973, "grpo": 0.960},
    "pulled_back": {"trl": 0.87},
}


@dataclass(frozen=True)
class Study:
    """What a study measures (``conf/study/<name>.yaml``; keys as below).

    Attributes:
        title: the page's heading.
        runs: the sweep folder of the training runs.
        out: where the page goes.
        base: the model the runs started from (the junior too).
        sets: the eval sets the claims are measured on (their mean over sets when several).
        greedy: a greedy eval set, the accuracy a run is judged by (None: none).
        checkpoint: ``selected`` (the checkpoint validation picked) or ``last``.
        eval: more ``tandem.evaluate`` overrides.
        describes: what the evaluation is, in a sentence for the page.
        compare: another study (a ``conf/study`` name) whose GRPO runs this one's GRPO drift is
            set against, on the page (None: none).
    """

    title: str
    runs: Path
    out: Path
    base: str
    sets: tuple[str, ...]
    greedy: str | None = None
    checkpoint: str = "selected"
    eval: tuple[str, ...] = ()
    describes: str = ""
    compare: str | None = None

    def __post_init__(self) -> None:
        if self.checkpoint not in CHECKPOINTS:
            raise ValueError(
                f"checkpoint ({self.checkpoint!r}) must be one of {CHECKPOINTS}: the senior "
                "validation selected, or the last step's."
            )
        if not self.sets:
            raise ValueError("sets names no eval set: the claims need at least one.")

    @classmethod
    def load(cls, name: str) -> Study:
        """The study ``conf/study/<name>.yaml``."""
        path = CONF / "study" / f"{name}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in (CONF / "study").glob("*.yaml"))
            raise FileNotFoundError(f"no study {name!r}: the studies are {known}.")
        spec = OmegaConf.to_container(OmegaConf.load(path))
        spec.update(runs=Path(spec["runs"]), out=Path(spec["out"]))
        return cls(**{**spec, "sets": tuple(spec["sets"]), "eval": tuple(spec.get("eval", ()))})

    def overrides(self, extra: Sequence[str] = ()) -> list[str]:
        """``tandem.evaluate`` overrides: the eval sets, the study's, then ``extra``; a key
        given twice keeps its last value."""
        sets = [*self.sets, *([self.greedy] if self.greedy else [])]
        merged: dict[str, str] = {"eval": f"eval=[{','.join(sets)}]"}
        for override in (*self.eval, *extra):
            merged[override.split("=", 1)[0]] = override
        return list(merged.values())


@dataclass(frozen=True)
class Run:
    """A finished training run: its folder, arm (``experiment_name``), seed and config."""

    path: Path
    arm: str
    seed: int
    steps: int

    @property
    def senior(self) -> Path:
        """The exported senior of the last step."""
        return self.path / "senior"

    def selected(self) -> Path | None:
        """The checkpoint validation picked (``best-*.ckpt``), if there is one."""
        found = list((self.path / "checkpoints").glob("best-*.ckpt"))
        if len(found) > 1:  # validation keeps one best checkpoint: more is a leftover
            log.warning("%s has %d best checkpoints: taking the latest", self.path, len(found))
        return max(found, key=lambda p: int(p.name[len("best-") : -len(".ckpt")]), default=None)

    def evaluated(self, checkpoint: str) -> tuple[str, Path, Path]:
        """What the study evaluates (``checkpoint``: ``selected`` or ``last``), the model folder
        it becomes (an evaluated checkpoint is exported under its evaluation's ``senior``) and
        the evaluation's folder."""
        out = self.path / EVAL_FOLDERS[checkpoint]
        chosen = self.selected() if checkpoint == "selected" else None
        if chosen is None:
            if checkpoint == "selected":
                log.warning("%s has no selected checkpoint: evaluating its last step", self.path)
            return str(self.senior), self.senior, out
        return str(chosen), out / "senior", out


def find_runs(root: str | Path) -> tuple[list[Run], list[Path]]:
    """Finished runs under ``root`` (sorted by arm, seed) and the folders of unfinished ones."""
    runs, unfinished = [], []
    for config in sorted(Path(root).rglob(".hydra/config.yaml")):
        folder = config.parent.parent
        cfg = OmegaConf.load(config)
        if "experiment_name" not in cfg or "seed" not in cfg:
            continue  # not a training run (an evaluation's own folder, say)
        if not (folder / "senior" / "config.json").is_file():
            unfinished.append(folder)
            continue
        steps = int(OmegaConf.select(cfg, "trainer.max_steps", default=-1))
        runs.append(Run(folder, str(cfg.experiment_name), int(cfg.seed), steps))
    runs.sort(key=lambda r: (r.arm, r.seed, str(r.path)))
    return runs, unfinished


def evaluate(senior: str, out: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """``tandem.evaluate`` of ``senior`` into ``out``; reuses a finished ``results.json``.

    The evaluation writes to ``<out>.partial`` and is renamed to ``out`` only when whole, so a
    killed study leaves no half-written results behind.
    """
    done = out / "results.json"
    if done.is_file():
        return json.loads(done.read_text())
    if out.exists():
        raise FileExistsError(f"{out} exists without results.json: remove it and rerun.")
    from hydra import compose, initialize_config_dir

    from tandem.evaluate import run as run_evaluation

    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose(
            "evaluate",
            overrides=[f"senior={senior}", f"output_dir={staging}", "aim=false", *overrides],
        )
    started = time.perf_counter()
    run_evaluation(cfg)
    staging.rename(out)
    log.info("evaluated %s in %.0f s", senior, time.perf_counter() - started)
    return json.loads(done.read_text())


def displacement_for_seed(
    base: str,
    grpo: Path,
    others: dict[Path, Path],
    texts: Sequence[Path],
    top: int = 500,
) -> dict[Path, dict[str, float]]:
    """Per run folder of ``others`` (run -> its evaluated senior; the seed's other arms and the
    other GRPO seeds, the null): ``pair_statistics`` against the ``grpo`` senior on ``texts``
    (the GRPO senior's own solo outputs, one file per eval set), by run folder.

    The base's and the GRPO senior's mean probabilities are computed once for all the other
    arms of the seed, and at most two models are loaded at a time.
    """
    from tandem.analysis.displacement import (
        mean_probabilities,
        pair_statistics,
        records_to_tensors,
    )
    from tandem.evaluation.records import read_records
    from tandem.modules.models import load_causal_lm

    records = [r for path in texts for r in read_records(path) if r["mode"] == "solo"]
    tensors = records_to_tensors(records)

    def means(paths: Sequence[str | Path]) -> tuple[Any, int]:
        models = [load_causal_lm(str(p)).eval() for p in paths]
        return mean_probabilities(models, *tensors)

    (base_means, grpo_means), count = means([base, grpo])
    found = {}
    for folder, senior in others.items():
        (run_means,), _ = means([senior])
        found[folder] = pair_statistics(base_means, grpo_means, run_means, top)
        found[folder]["positions"] = float(count)
    return found


def collect(
    study: Study, overrides: Sequence[str] = (), pullback: bool = True
) -> tuple[dict[str, dict[str, list[float]]], dict[str, Any], list[Run]]:
    """Evaluate everything needed; returns ``values[arm][metric] -> per-seed list``, the base's
    table and the runs used. ``pullback``: also the displacement analysis per seed (claim 3)."""
    root, base = study.runs, study.base
    runs, unfinished = find_runs(root)
    for folder in unfinished:
        log.warning("skipping %s: not finished (no exported senior yet)", folder)
    if not runs:
        raise FileNotFoundError(
            f"no finished training run under {root}: run python -m tandem.train "
            "--config-name reproduce first (or pass the folder of your sweep)."
        )
    overrides = study.overrides(overrides)
    base_results = evaluate(base, root / "eval_base", overrides)
    values: dict[str, dict[str, list[float]]] = {}
    seniors: dict[Path, Path] = {}
    folders: dict[Path, Path] = {}
    for run in runs:
        source, seniors[run.path], folders[run.path] = run.evaluated(study.checkpoint)
        results = evaluate(source, folders[run.path], overrides)
        arm = values.setdefault(run.arm, {})
        for key, value in flatten(results, study).items():
            arm.setdefault(key, []).append(value)
        arm.setdefault("seed", []).append(float(run.seed))
    grpo_by_seed = {r.seed: r for r in runs if r.arm == "grpo"} if pullback else {}
    for seed, grpo in sorted(grpo_by_seed.items()):
        # the seed's other arms, and every other GRPO seed: the null
        others = [r for r in runs if r.seed == seed and r.arm != "grpo"]
        others += [g for s, g in sorted(grpo_by_seed.items()) if s != seed]
        cache = folders[grpo.path] / "displacement.json"
        found = json.loads(cache.read_text()) if cache.is_file() else {}
        pending = {r.path: seniors[r.path] for r in others if not _cached(found, r.path.name)}
        if pending:
            generations = folders[grpo.path] / "generations"
            texts = [generations / f"{s}.jsonl" for s in study.sets]
            measured = displacement_for_seed(base, seniors[grpo.path], pending, texts)
            found.update({folder.name: stats for folder, stats in measured.items()})
            cache.write_text(json.dumps(found, indent=2) + "\n")
        for run in others:
            prefix = "null/" if run.arm == "grpo" else ""
            for key, value in found[run.path.name].items():
                values.setdefault(run.arm, {}).setdefault(prefix + key, []).append(value)
    return values, flatten(base_results, study), runs


def _cached(found: dict[str, Any], name: str) -> bool:
    """A displacement result of run ``name`` with every field the page reads (older ones lack
    the role-swapped statistics and are redone)."""
    return "pulled_back_asymmetry" in found.get(name, {})


def flatten(results: dict[str, Any], study: Study) -> dict[str, float]:
    """``results.json`` as one table: each metric's mean over the study's sets (the paper's
    macro mean; the set's own value for one set), the greedy set's under ``greedy/``."""
    tables = [results["sets"].get(name, {}) for name in study.sets]
    shared = set.intersection(*(set(t) for t in tables))
    out = {k: sum(float(t[k]) for t in tables) / len(tables) for k in sorted(shared)}
    for key, value in results["sets"].get(study.greedy, {}).items():
        out[f"greedy/{key}"] = float(value)
    return out


# -- the page ----------------------------------------------------------------------------------
def _fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _cell(values: Sequence[float] | None) -> str:
    if not values:
        return "n/a"
    mean, lo, hi = t_interval(values)
    if math.isnan(lo):
        return f"{_fmt(mean)} (n={len(values)})"
    return f"{_fmt(mean)} [{_fmt(lo)}, {_fmt(hi)}]"


def render(
    values: dict[str, dict[str, list[float]]],
    base: dict[str, Any],
    runs: list[Run],
    study: Study,
    command: str,
    margin: float = MARGIN,
    against: Sequence[str] = (),
) -> str:
    """The Markdown page; ``margin`` is the equivalence margin of claim 1 (absolute accuracy);
    ``against``: the section setting GRPO's drift against another world's (``drift_section``)."""
    arms = [a for a in ARMS if a in values] + sorted(set(values) - set(ARMS))
    seeds = {a: sorted(r.seed for r in runs if r.arm == a) for a in arms}
    steps = sorted({r.steps for r in runs})
    commit = source_commit()
    senior = {"selected": "selected checkpoint", "last": "last senior"}[study.checkpoint]
    sets = ", ".join(f"`{s}`" for s in study.sets)
    lines = [
        f"# {study.title}",
        "",
        f"Generated by `{command}` from {len(runs)} finished runs under `{study.runs}` "
        f"({', '.join(f'{a}: seeds {seeds[a]}' for a in arms)}; {steps} optimizer steps each), "
        f"at commit `{commit}`. Do not edit by hand: rerun the command.",
        "",
        "Each cell is the mean over seeds with its 95% Student-t interval in brackets. The "
        f"evaluation is {study.describes} on each run's {senior} (sets: {sets}); drift and "
        "legibility are measured on the senior's own solo outputs against the base "
        "(the junior); the junior's cross-entropy is per chain of thought, then averaged "
        "(`legibility/junior_ce_pooled` in `results.json` pools tokens instead).",
        "",
        "Verdicts compare Tandem RL (`trl`) with GRPO (`grpo`) by Welch's t-interval of the "
        "difference of the means. A better-than claim reproduces when the 95% interval is clear "
        "of zero in the paper's direction; an interval containing zero is no detectable "
        "difference. The on-par claim is an equivalence test with a stated margin: "
        f"equivalent within ±{margin:g} (absolute accuracy) when the 90% interval lies inside "
        f"[-{margin:g}, +{margin:g}] (two one-sided tests at the 5% level). The pulled-back "
        "share and the pull-back correlation are Tandem RL's own, judged by their 95% interval "
        "against 50% and zero.",
        "",
        "**Against the null.** Every figure is also computed for GRPO seed against GRPO seed, "
        "over the pairs of GRPO seeds, and each claim is read against that null: it reproduces "
        "only where the interval of Tandem RL minus GRPO lies wholly beyond the null's spread "
        "(the largest difference between two GRPO seeds) in the paper's direction, and is on "
        "par where the 90% interval lies inside it. The pull-back statistics pick GRPO's most "
        "moved items and so read any other model as pulled back (regression to the mean); "
        "they are computed for every ordered pair of GRPO seeds as well, and both ways round "
        "(each model in GRPO's place): the pull-back is the asymmetry, and it must lie beyond "
        "the spread of the GRPO pairs' asymmetries (`tandem/analysis/displacement.py`).",
        "",
    ]
    lines += summary_section(values, arms, margin)
    lines += training_section(values, base, arms, runs, study.greedy)
    lines += list(against)
    for claim in CLAIMS:
        lines += claim_section(claim, values, base, arms, margin)
    lines += problem_section(
        {a: [(r.seed, r.evaluated(study.checkpoint)[2]) for r in runs if r.arm == a] for a in arms},
        study.runs / "eval_base",
        study.sets,
        [m for c in CLAIMS[:2] for m in c.metrics],
    )
    lines += [
        "## Runs",
        "",
        "The code each run was trained under: the commit of each start and the step it started "
        "from (`unrecorded`: steps run before runs recorded their commit).",
        "",
        "| arm | seed | folder | trained at |",
        "| --- | --- | --- | --- |",
        *[f"| {r.arm} | {r.seed} | `{r.path}` | {_commits(r.path)} |" for r in runs],
        "",
    ]
    return "\n".join(lines)


def by_seed(values: dict[str, list[float]], metric: str) -> dict[int, float]:
    """An arm's per-seed values of ``metric`` by seed (empty when not one per seed)."""
    got, seeds = values.get(metric, []), values.get("seed", [])
    return {int(s): v for s, v in zip(seeds, got, strict=True)} if len(got) == len(seeds) else {}


def pair_stats(values: dict[str, list[float]], prefix: str = "") -> list[dict[str, float]]:
    """The pull-back statistics stored under ``prefix`` as one dict per pair of models (none
    where the study ran no displacement analysis)."""
    keys = [k for key in ("pulled_back", "pullback_rho") for k in (key, f"{key}_asymmetry")]
    if not all(prefix + k in values for k in keys):
        return []
    columns = [values[prefix + k] for k in keys]
    return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]


def readings(
    claim: Claim, metric: str, values: dict[str, dict[str, list[float]]], margin: float
) -> tuple[str, str]:
    """One metric's verdict before the null (against zero, the margin or a reference) and
    against the GRPO-seed-against-GRPO-seed null."""
    from tandem.analysis.displacement import pullback_against_null

    trl, grpo = values.get("trl", {}), values.get("grpo", {})
    before = verdict(claim, metric, trl.get(metric, []), grpo.get(metric, []), margin)
    if metric in ("pulled_back", "pullback_rho"):
        fmt = "{:+.0%}" if metric == "pulled_back" else "{:+.3f}"
        found = pullback_against_null(pair_stats(trl), pair_stats(grpo, "null/"), metric)
        after = found.sentence(fmt)
        return before, after[0].upper() + after[1:]
    return before, null_verdict(claim, metric, by_seed(trl, metric), by_seed(grpo, metric))


def null_cell(grpo: dict[str, list[float]], metric: str) -> str:
    """The null's column: the spread of GRPO seed pair differences, or the pull-back
    statistic's mean over ordered GRPO pairs."""
    if f"null/{metric}" in grpo:
        return _cell(grpo[f"null/{metric}"])
    pairs = seed_pair_differences(by_seed(grpo, metric))
    if not pairs:
        return "n/a"
    return f"±{max(abs(d) for d in pairs):.3f} ({len(pairs)} pairs)"


def claim_section(
    claim: Claim,
    values: dict[str, dict[str, list[float]]],
    base: dict[str, Any],
    arms: list[str],
    margin: float,
) -> list[str]:
    """One claim: a table of its metrics per arm beside the null and the paper's, then each
    metric's verdict before and against the null."""
    lines = [f"## {claim.title}", "", f"Paper: {claim.paper}", ""]
    header = ["metric", "base", *arms, "GRPO seed pairs (null)", "paper (trl / grpo)"]
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    shown = list(claim.metrics)
    if "pullback_rho" in shown:  # the informative raw figure stays on the page, no verdict
        shown.append("spearman_top")
    grpo = values.get("grpo", {})
    for metric in shown:
        paper = PAPER.get(metric, {})
        paper_cell = (
            " / ".join(_fmt(paper[a]) if a in paper else "-" for a in ("trl", "grpo"))
            if paper
            else "direction only"
        )
        base_cell = _fmt(base.get(metric, math.nan)) if metric in base else "-"
        cells = [_cell(values.get(a, {}).get(metric)) for a in arms]
        row = [f"`{metric}`", base_cell, *cells, null_cell(grpo, metric), paper_cell]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    trl_values = values.get("trl", {})
    for metric in claim.metrics:
        before, after = readings(claim, metric, values, margin)
        line = f"- `{metric}`: before the null: {before}"
        if metric == "pullback_rho" and trl_values.get(metric):
            tests = [trl_values.get(k, []) for k in ("pullback_rho", "pullback_p", "pullback_n")]
            line += f" Per seed: {seed_tests(*tests)}."
        lines += [line, f"  Against the null: {after}"]
    return [*lines, ""]


def summary_section(
    values: dict[str, dict[str, list[float]]], arms: list[str], margin: float
) -> list[str]:
    """Each claim's metrics with the verdict before the null and against it, one line each."""
    lines = [
        "## Verdicts before and after the null",
        "",
        "| claim | metric | before the null | against the null |",
        "| --- | --- | --- | --- |",
    ]
    for claim in CLAIMS:
        for metric in claim.metrics:
            before, after = readings(claim, metric, values, margin)
            short = claim.title.split(" ", 1)[0].rstrip(".")
            lines.append(f"| {short} | `{metric}` | {reading(before)} | {reading(after)} |")
    return [*lines, ""]


def validation_curves(runs: list[Run]) -> dict[str, dict[tuple[str, int], list[float]]]:
    """Per arm, ``(key, step) -> per-seed values`` of the validation accuracies logged during
    training (``csv/version_*/metrics.csv``; a resumed run's versions are read in order)."""
    curves: dict[str, dict[tuple[str, int], list[float]]] = {}
    for run in runs:
        seen: dict[tuple[str, int], float] = {}
        for path in sorted(run.path.glob("csv/version_*/metrics.csv")):
            with path.open(newline="") as f:
                for row in csv.DictReader(f):
                    for key in VALIDATION_KEYS:
                        if row.get(key):
                            seen[(key, int(row["step"]))] = float(row[key])
        arm = curves.setdefault(run.arm, {})
        for point, value in seen.items():
            arm.setdefault(point, []).append(value)
    return curves


def curves_section(runs: list[Run], arms: list[str]) -> list[str]:
    """Validation accuracy over training, solo and handing off, mean over seeds per arm."""
    curves = validation_curves(runs)
    steps = sorted({step for arm in curves.values() for _, step in arm})
    if not steps:
        return []
    lines = [
        "Validation accuracy during training (greedy, the validation split, logged by "
        "`tandem.train`): the senior alone / handing off to the junior under the word sampler "
        "at p=0.5, mean over seeds.",
        "",
        "| step | " + " | ".join(arms) + " |",
        "|" + " --- |" * (len(arms) + 1),
    ]
    for step in steps:
        cells = []
        for arm in arms:
            pair = [curves.get(arm, {}).get((key, step)) for key in VALIDATION_KEYS]
            cells.append(" / ".join(_fmt(sum(v) / len(v)) if v else "n/a" for v in pair))
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def training_section(
    values: dict[str, dict[str, list[float]]],
    base: dict[str, float],
    arms: list[str],
    runs: list[Run],
    greedy: str | None,
) -> list[str]:
    """What training did: greedy accuracy on the held-out problems, alone and handing off;
    and the validation curves."""
    if greedy is None:
        return ["## What training did", "", *curves_section(runs, arms)]
    keys = ("greedy/solo/pass@1", "greedy/handoff/pass@1")
    lines = [
        "## What training did",
        "",
        f"Greedy accuracy on the held-out test problems (`conf/eval/{greedy}.yaml`), the "
        "senior alone and handing off to the junior under the step schedule.",
        "",
        "| metric | base | " + " | ".join(arms) + " |",
        "|" + " --- |" * (len(arms) + 2),
    ]
    for key in keys:
        cells = [_cell(values.get(a, {}).get(key)) for a in arms]
        lines.append(f"| `{key}` | {_fmt(base.get(key, math.nan))} | " + " | ".join(cells) + " |")
    lines.append("")
    for arm in arms:
        got = values.get(arm, {}).get(keys[0])
        if not got or keys[0] not in base:
            continue
        mean, lo, hi = t_interval([v - base[keys[0]] for v in got])
        interval = "" if math.isnan(lo) else f", 95% interval [{100 * lo:+.1f}, {100 * hi:+.1f}]"
        seeds = f"{len(got)} seeds{interval}"
        gain = f"{100 * mean:+.1f} points"
        lines.append(f"- `{arm}`: solo greedy accuracy {gain} over the base ({seeds}).")
    return [*lines, "", *curves_section(runs, arms)]


def grpo_drift(values: dict[str, dict[str, list[float]]]) -> dict[str, list[float]]:
    """GRPO's per-seed drift measures (``DRIFT``), the drops from each seed's pair of figures."""
    grpo = values.get("grpo", {})
    out = {key: list(grpo.get(key, [])) for key, _ in DRIFT if "drop" not in key}
    for prefix in ("", "greedy/"):
        solo, handoff = (
            grpo.get(f"{prefix}solo/pass@1", []),
            grpo.get(f"{prefix}handoff/pass@1", []),
        )
        out[f"{prefix}drop"] = [s - h for s, h in zip(solo, handoff, strict=True)]
    return out


def drift_section(
    ours: dict[str, dict[str, list[float]]],
    theirs: dict[str, dict[str, list[float]]],
    study: Study,
    other: Study,
) -> list[str]:
    """GRPO's drift from the base on this study's world against ``other``'s: each measure's
    mean and interval per world, and Welch's 95% interval of the difference."""
    lines = [
        f"## GRPO's drift here and in `{other.runs}`",
        "",
        f"Can this world tell? GRPO's drift from its base, per seed, on this page's runs and on "
        f"those of the `{study.compare}` study (`{other.runs}`, its {other.checkpoint} "
        "checkpoints, its own evaluation), with Welch's 95% interval of the difference of the "
        "means. A drop is a seed's solo figure minus its handoff figure (the step schedule).",
        "",
        f"| measure | here | `{other.runs}` | difference |",
        "| --- | --- | --- | --- |",
    ]
    mine, yours = grpo_drift(ours), grpo_drift(theirs)
    verdicts = []
    for key, what in DRIFT:
        a, b = mine.get(key, []), yours.get(key, [])
        if not a or not b:
            lines.append(f"| {what} | {_cell(a)} | {_cell(b)} | n/a |")
            verdicts.append(f"- {what}: not measured: a world has no GRPO runs with it.")
            continue
        diff, lo, hi = difference_interval(a, b)
        interval = "n/a" if math.isnan(lo) else f"[{lo:+.3f}, {hi:+.3f}]"
        lines.append(f"| {what} | {_cell(a)} | {_cell(b)} | {diff:+.3f} {interval} |")
        if math.isnan(lo):
            said = "no interval with one seed"
        elif lo > 0:
            said = "larger here, the interval clear of zero"
        elif hi < 0:
            said = "smaller here, the interval clear of zero"
        else:
            said = "no detectable difference, the interval contains zero"
        verdicts.append(f"- {what}: {said} ({diff:+.3f}, 95% interval {interval}).")
    return [*lines, "", *verdicts, ""]


def against(study: Study, values: dict, overrides: Sequence[str]) -> list[str]:
    """The section setting GRPO's drift against the ``compare`` study's world (evaluating its
    runs where they are not yet), or a line saying why it could not."""
    if not study.compare:
        return []
    other = dataclasses.replace(Study.load(study.compare), checkpoint=study.checkpoint)
    try:
        theirs, _, _ = collect(other, overrides, pullback=False)
    except FileNotFoundError as e:
        return [f"## GRPO's drift here and in `{other.runs}`", "", f"Not measured: {e}", ""]
    return drift_section(values, theirs, study, other)


def _commits(folder: Path) -> str:
    starts = run_commits(folder)
    parts = [f"`{commit}` from step {step}" for commit, step in starts]
    if not starts or starts[0][1] > 0:
        parts.insert(0, "unrecorded" + (f" to step {starts[0][1]}" if starts else ""))
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="?", type=Path, help="sweep folder (default: the study's)")
    parser.add_argument(
        "--study", default="tiny", help="conf/study/<name>.yaml: tiny (default), notation or paper"
    )
    parser.add_argument("--out", type=Path, help="the page (default: the study's)")
    parser.add_argument("--base", help="the base the runs started from (default: the study's)")
    parser.add_argument(
        "--checkpoint", choices=CHECKPOINTS, help="which senior of each run (default: the study's)"
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=MARGIN,
        help="equivalence margin of the on-par claim, in absolute accuracy (default %(default)s)",
    )
    parser.add_argument(
        "--eval",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a tandem.evaluate override, e.g. --eval eval.tiny.limit=100 (repeatable)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    study = Study.load(args.study)
    given = {"runs": args.runs, "out": args.out, "base": args.base, "checkpoint": args.checkpoint}
    study = dataclasses.replace(study, **{k: v for k, v in given.items() if v is not None})
    values, base, runs = collect(study, args.eval)
    compared = against(study, values, args.eval)
    command = " ".join(
        ["python -m tandem.analysis.study", *(sys.argv[1:] if argv is None else argv)]
    )
    study.out.parent.mkdir(parents=True, exist_ok=True)
    study.out.write_text(render(values, base, runs, study, command, args.margin, compared))
    print(f"wrote {study.out}")
    return study.out


if __name__ == "__main__":
    main()
