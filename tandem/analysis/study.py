"""The paper's four claims, measured on finished training runs: ``python -m tandem.analysis.study``.

Reads every finished run under a sweep folder (``multirun/tiny_world`` by default, as written by
``python -m tandem.train --config-name reproduce``), evaluates each run's senior (by default the
checkpoint validation selected, ``checkpoint: selected``; ``last``: the last step's) and the
base once with ``tandem.evaluate`` (skipping evaluations already on disk, so an interrupted
study resumes), measures what the page needs (``tandem.analysis.measure``: per-problem summaries
of every evaluation and the pull-back of every run against every GRPO seed), writes those inputs
to ``docs/results/data/<page>/`` (kilobytes, committed with the page: ``tandem.analysis.inputs``)
and renders the page from them (``tandem.analysis.page``).

``python -m tandem.analysis.study --from-results docs/results/data/<page>`` renders the page
from its committed inputs alone, with no run on disk: byte for byte the page the measuring run
wrote.

The claims (Tandem RL, ``trl``, against vanilla GRPO, ``grpo``, and GRPO with a KL penalty
toward the junior, ``kl_reg``): 1. solo accuracy on par with GRPO; 2. better accuracy when the
senior hands off to the junior under the reasoning-step schedule; 3. lower drift from the base
(KL per token) and the items GRPO displaced most pulled back toward the base; 4. higher
legibility to the junior (lower junior cross-entropy, higher overlap). How each is read:
``tandem.analysis.claims``, from one model of seed and problem variance
(``tandem.analysis.mixed``), with margins stated in ``conf/study/<name>.yaml`` before the data.

A study with ``compare`` (``conf/study/notation.yaml``: ``compare: tiny``) also sets GRPO's drift
from the base against the other study's world, read from that study's committed inputs at the
same checkpoint.

A run is finished when its exported senior (``<run>/senior/config.json``, the last step's)
exists; a run with no selected checkpoint is evaluated at its last step, with a warning.

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

from tandem.provenance import record_start

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
        margins: per claim metric, its equivalence margin in the metric's units and the
            reason for its size (``{metric: {margin, reason}}``), stated before the data.
        top_share: the share of the vocabulary that is "most displaced" (the pull-back).
        name: the study's name (its ``conf/study`` file).
        data: where the page's inputs go (default ``docs/results/data/<page's stem>``).
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
    margins: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    top_share: float = 0.05
    name: str = "tiny"
    data: Path | None = None

    def __post_init__(self) -> None:
        if self.checkpoint not in CHECKPOINTS:
            raise ValueError(
                f"checkpoint ({self.checkpoint!r}) must be one of {CHECKPOINTS}: the senior "
                "validation selected, or the last step's."
            )
        if not self.sets:
            raise ValueError("sets names no eval set: the claims need at least one.")
        from tandem.analysis.claims import METRICS, Margin

        missing = [m for m in METRICS if m not in self.margins]
        if missing:
            raise ValueError(
                f"margins lacks {missing}: state each claim metric's equivalence margin and its "
                "reason (margins.<metric>: {margin: ..., reason: ...}) before reading the data."
            )
        for metric, spec in self.margins.items():
            try:
                Margin(**spec)
            except (TypeError, ValueError) as e:
                raise ValueError(
                    f"margins.{metric} ({spec!r}) is not a margin: {e} Give a positive margin "
                    "in the metric's units and its reason: {margin: 0.02, reason: ...}."
                ) from None

    @property
    def inputs(self) -> Path:
        """The folder of the page's committed inputs."""
        return self.data or Path("docs/results/data") / self.out.stem

    @classmethod
    def load(cls, name: str) -> Study:
        """The study ``conf/study/<name>.yaml``."""
        path = CONF / "study" / f"{name}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in (CONF / "study").glob("*.yaml"))
            raise FileNotFoundError(f"no study {name!r}: the studies are {known}.")
        spec = OmegaConf.to_container(OmegaConf.load(path))
        spec.update(runs=Path(spec["runs"]), out=Path(spec["out"]), name=name)
        if spec.get("data"):
            spec["data"] = Path(spec["data"])
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
    record_start(staging, 0, evaluation=list(overrides))  # the commit it was evaluated at
    staging.rename(out)
    log.info("evaluated %s in %.0f s", senior, time.perf_counter() - started)
    return json.loads(done.read_text())


def command_line() -> argparse.ArgumentParser:
    """The study's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="?", type=Path, help="sweep folder (default: the study's)")
    parser.add_argument(
        "--study", default="tiny", help="conf/study/<name>.yaml: tiny (default), notation or paper"
    )
    parser.add_argument(
        "--from-results",
        type=Path,
        metavar="FOLDER",
        help="render the page from its committed inputs (docs/results/data/<page>) alone",
    )
    parser.add_argument("--out", type=Path, help="the page (default: the study's)")
    parser.add_argument(
        "--data",
        type=Path,
        help="where the page's inputs go (default: docs/results/data/<page's stem>)",
    )
    parser.add_argument("--base", help="the base the runs started from (default: the study's)")
    parser.add_argument(
        "--checkpoint", choices=CHECKPOINTS, help="which senior of each run (default: the study's)"
    )
    parser.add_argument(
        "--compare",
        help="the study whose GRPO drift this one's is set against (default: the study's "
        "compare; none: no such section)",
    )
    parser.add_argument(
        "--eval",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a tandem.evaluate override, e.g. --eval eval.tiny.limit=100 (repeatable)",
    )
    return parser


def main(argv: list[str] | None = None) -> Path:
    parser = command_line()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from tandem.analysis.measure import measure, render_folder

    if args.from_results is not None:
        try:
            out = render_folder(args.from_results)
        except FileNotFoundError as e:
            parser.error(str(e))
        print(f"wrote {out}")
        return out
    study = Study.load(args.study)
    given = {"runs": args.runs, "out": args.out, "base": args.base, "checkpoint": args.checkpoint}
    given["data"] = args.data
    study = dataclasses.replace(study, **{k: v for k, v in given.items() if v is not None})
    if args.compare is not None:
        study = dataclasses.replace(study, compare=None if args.compare == "none" else args.compare)
    command = " ".join(
        ["python -m tandem.analysis.study", *(sys.argv[1:] if argv is None else argv)]
    )
    try:
        measure(study, args.eval, command)
    except FileNotFoundError as e:
        parser.error(str(e))
    out = render_folder(study.inputs)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
