"""The paper's four claims, measured on finished training runs: ``python -m tandem.analysis.study``.

Reads every finished run under a sweep folder (``multirun/tiny_world`` by default, as written by
``python -m tandem.train --config-name reproduce``), evaluates each run's senior (by default the
checkpoint validation selected, ``checkpoint: selected``; ``last``: the last step's) and the
base once with ``tandem.evaluate`` (skipping evaluations already on disk, so an interrupted
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

A run is finished when its exported senior (``<run>/senior/config.json``, the last step's)
exists; a run with no selected checkpoint is evaluated at its last step, with a warning. Every
figure on the page comes from the runs it names.

What this file leaves out: training (``tandem.train``) and the metrics (``tandem.evaluation``).
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import logging
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from tandem.analysis.claims import MARGIN
from tandem.analysis.page import (  # noqa: F401  (the page's parts, as they were reached here)
    curves_section,
    drift_section,
    render,
    validation_curves,
)

log = logging.getLogger(__name__)

CONF = Path(__file__).resolve().parents[2] / "conf"
CHECKPOINTS = ("selected", "last")
# where each run's evaluation goes, by which senior it evaluates: two choices never share one
EVAL_FOLDERS = {"selected": "eval", "last": "eval_last"}


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
    killed study leaves no half-written results behind. Two studies that need the same
    evaluation (the base's, say) take turns on ``<out>.lock``: the second waits, then reads the
    first one's results; a killed holder's lock goes with its process.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another study evaluating %s into %s", senior, out)
            fcntl.flock(lock, fcntl.LOCK_EX)
        return _evaluate_locked(senior, out, overrides)


def _evaluate_locked(senior: str, out: Path, overrides: Sequence[str]) -> dict[str, Any]:
    done = out / "results.json"
    if done.is_file():
        return json.loads(done.read_text())
    if out.exists():
        raise FileExistsError(f"{out} exists without results.json: remove it and rerun.")
    from hydra import compose, initialize_config_dir

    from tandem.evaluate import run as run_evaluation

    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)  # a killed evaluation's; no one else writes it
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
        "--compare",
        help="the study whose GRPO drift this one's is set against (default: the study's "
        "compare; none: no such section, which saves evaluating the other world's runs)",
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
    if args.compare is not None:
        study = dataclasses.replace(study, compare=None if args.compare == "none" else args.compare)
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
