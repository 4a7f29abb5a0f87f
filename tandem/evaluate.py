"""Evaluate a senior: ``python -m tandem.evaluate [overrides]``.

Composes ``conf/evaluate.yaml`` with Hydra, checks the whole config before anything loads, then
for every eval set (``eval=[tiny]``, ``eval=[aime24,aime25,amc23]``, ...) measures solo pass@k,
handoff pass@k under the handoff sampler (``sampler=step`` by default), drift (KL to the junior)
and legibility (the junior's cross-entropy and overlap) on the senior's solo outputs::

    python -m tandem.evaluate senior=outputs/run/checkpoints/last.ckpt eval=[aime24,amc23]

Writes ``results.json`` / ``results.csv`` (one row per set and the macro average) and
``generations/<set>.jsonl`` (every rollout with its authors and per-token log-probs) to
``output_dir``, logs the tables to Aim when ``aim=true``, and prints them rounded. The senior is
labelled by its training run's name (``outputs/<run>/senior`` -> ``<run>``). ``with_base=true``
also evaluates the senior's base with the same settings (into ``<output_dir>/base``) and prints
it beside the senior::

    python -m tandem.evaluate senior=outputs/<run>/senior with_base=true

What this file leaves out: the evaluation itself (``tandem.evaluation``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from tandem.assets import resolve
from tandem.config import ConfigError, exit_config_error, run_command
from tandem.engine import build_backend
from tandem.evaluation.config import handoff_sampler, validate_eval_config
from tandem.evaluation.models import load_pair, senior_base
from tandem.evaluation.records import RecordWriter
from tandem.evaluation.results import format_tables, log_to_aim, write_results
from tandem.evaluation.runner import Evaluator
from tandem.evaluation.sets import build_sets
from tandem.modules.export import check_senior
from tandem.registry import REWARDS
from tandem.runs import RunRefused
from tandem.runs import stop as stop_signals
from tandem.runs.checkpoints import is_distributed_checkpoint, verify
from tandem.runs.report import run_label

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Validate, load, evaluate every set; returns what ``results.json`` holds."""
    validate_eval_config(cfg)
    # a stop a training run in this process asked for (a notebook's, a test's) is not this one's
    stop_signals.clear()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(cfg.threads or threads)
        torch.manual_seed(cfg.seed)
        results = _run(cfg)
        evaluated = [results]
        base = base_config(cfg, results) if cfg.get("with_base") else None
        if base is not None and resolve(base.senior) == resolve(results["senior_path"]):
            log.warning("with_base: senior=%s is its own base; evaluated once", cfg.senior)
        elif base is not None:
            torch.manual_seed(cfg.seed)  # the same draws as the senior's
            evaluated.append(_run(base))
            results["base"] = {k: evaluated[1][k] for k in ("label", "senior", "output_dir")}
            results["base"]["macro"] = evaluated[1]["macro"]
            write_results(cfg.output_dir, results["sets"], _meta(results))
    finally:
        # the setting is process-wide: give it back to whoever called (tests, notebooks)
        torch.set_num_threads(threads)
    log.info("results in %s\n%s", cfg.output_dir, format_tables(evaluated))
    return results


def default_label(senior: str) -> str:
    """The name of the training run a senior comes from: ``outputs/<run>/senior`` -> ``<run>``,
    ``outputs/<run>/checkpoints/step-40.ckpt`` -> ``<run>:step-40``, a job of a sweep
    (``multirun/<sweep>/<n>/senior``) -> ``<sweep>/<n>``; else the senior's own name."""
    path = Path(str(senior)).expanduser()
    folder = path.parent if path.name == "senior" else None
    if path.parent.name == "checkpoints":
        folder = path.parent.parent
    if folder is None or not folder.name:
        return path.name or str(senior)
    name = run_label(folder)
    return name if folder == path.parent else f"{name}:{path.stem}"


def base_config(cfg: DictConfig, results: dict[str, Any]) -> DictConfig:
    """``cfg`` for the senior's base: the same sets, samples and junior, its own folder."""
    base = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    base.senior = senior_base(str(cfg.senior))
    base.junior = results["junior"]
    base.label = f"{default_label(base.senior)} (base)"
    base.output_dir = str(Path(cfg.output_dir) / "base")
    base.with_base = False
    return base


def check_senior_input(senior: str) -> None:
    """Refuse (``RunRefused``) a senior folder that is not whole (a cut-short export) and a
    checkpoint that fails its checksum, before anything loads."""
    path = Path(str(senior)).expanduser()
    problem = None
    if path.is_dir() and not is_distributed_checkpoint(path):
        problem = check_senior(path)
    elif path.exists() and Path(f"{path}.sha256").is_file():
        problem = verify(path)
    if problem:
        raise RunRefused(
            f"senior={senior}: {problem}. Export it again (python -m tandem.train "
            f"run_name=<its run> ckpt_path=last re-exports a finished run), or give another senior."
        )


def _run(cfg: DictConfig) -> dict[str, Any]:
    check_senior_input(cfg.senior)
    c = OmegaConf.to_container(cfg, resolve=True)
    c["sampler"] = handoff_sampler(c)  # the authors' rounds, in the sampler's steps
    out = Path(cfg.output_dir)
    sets = build_sets(c["eval"])
    pair = load_pair(cfg.senior, cfg.junior, out, cfg.dtype, cfg.device, cfg.get("junior_device"))
    reward_spec = dict(c["reward"])
    reward = REWARDS.build(reward_spec.pop("name"), **reward_spec)
    writer = RecordWriter(out / "generations")
    evaluator = Evaluator(
        pair.senior,
        pair.junior,
        pair.tokenizer,
        reward,
        c["sampler"],
        batch_size=cfg.batch_size,
        forcing_batch_size=cfg.forcing_batch_size,
        seed=cfg.seed,
        solo=cfg.solo,
        handoff=cfg.handoff,
        drift=cfg.drift,
        writer=writer,
        progress=cfg.progress,
        metrics=c["metrics"],
        backend=build_backend(
            c.get("backend", "torch"),
            pair.senior,
            pair.junior,
            pair.tokenizer,
            junior_tokenizer=pair.junior_tokenizer,
            seed=cfg.seed,
        ),
        junior_tokenizer=pair.junior_tokenizer,
        base=pair.base,
    )
    tables, reports = {}, {}
    try:
        for eval_set in sets:
            tables[eval_set.name], problems = evaluator.run(eval_set)
            reports[eval_set.name] = {**vars(problems.report), "problems": len(problems)}
            log.info("%s: %d problems evaluated", eval_set.name, len(problems))
    finally:
        writer.close()
        if hasattr(reward, "close"):
            reward.close()
    meta = {
        "label": cfg.label or default_label(cfg.senior),
        "senior": str(cfg.senior),
        "senior_path": pair.senior_path,
        "junior": pair.junior_path,
        "sampler": c["sampler"],
        "output_dir": str(out),
        "reports": reports,
        "config": c,
    }
    results = write_results(out, tables, meta)
    if cfg.aim:
        meta["aim_run"] = log_to_aim(cfg.aim_repo, cfg.experiment_name, results, c)
        results = write_results(out, tables, meta)
    return results


def _meta(results: dict[str, Any]) -> dict[str, Any]:
    """What ``write_results`` takes back from what it wrote."""
    return {k: v for k, v in results.items() if k not in ("sets", "macro")}


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> float | None:
    try:
        results = run(cfg)
    except ConfigError as err:
        # leaving here, not through Hydra's handler, keeps the message to itself: no traceback
        exit_config_error(err)
    except RunRefused as err:
        # the user's to act on: one line, no traceback, exit status 2
        print(f"tandem.evaluate: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    # returned for sweepers that optimise a metric
    return results["macro"].get("solo/pass@1")


def cli() -> None:
    """``python -m tandem.evaluate``: a config problem is one message and exit status 2."""
    from tandem.runs.quiet import quiet_libraries

    quiet_libraries()
    run_command(main)


if __name__ == "__main__":
    cli()
