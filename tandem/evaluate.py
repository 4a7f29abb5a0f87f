"""Evaluate a senior: ``python -m tandem.evaluate [overrides]``.

Composes ``conf/evaluate.yaml`` with Hydra, checks the whole config before anything loads, then
for every eval set (``eval=[tiny]``, ``eval=[aime24,aime25,amc23]``, ...) measures solo pass@k,
handoff pass@k under the handoff sampler (``sampler=step`` by default), drift (KL to the junior)
and legibility (the junior's cross-entropy and overlap) on the senior's solo outputs::

    python -m tandem.evaluate senior=outputs/run/checkpoints/last.ckpt eval=[aime24,amc23]

Writes ``results.json`` / ``results.csv`` (one row per set and the macro average) and
``generations/<set>.jsonl`` (every rollout with its authors and per-token log-probs) to
``output_dir``, and logs the tables to Aim when ``aim=true``.

What this file leaves out: the evaluation itself (``tandem.evaluation``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from tandem.engine import build_backend
from tandem.evaluation.config import validate_eval_config
from tandem.evaluation.models import load_pair
from tandem.evaluation.records import RecordWriter
from tandem.evaluation.results import log_to_aim, write_results
from tandem.evaluation.runner import Evaluator
from tandem.evaluation.sets import build_sets
from tandem.registry import REWARDS

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Validate, load, evaluate every set; returns what ``results.json`` holds."""
    validate_eval_config(cfg)
    torch.manual_seed(cfg.seed)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(cfg.threads or threads)
        return _run(cfg)
    finally:
        # the setting is process-wide: give it back to whoever called (tests, notebooks)
        torch.set_num_threads(threads)


def _run(cfg: DictConfig) -> dict[str, Any]:
    c = OmegaConf.to_container(cfg, resolve=True)
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
        backend=build_backend(
            c.get("backend", "torch"), pair.senior, pair.junior, pair.tokenizer, seed=cfg.seed
        ),
    )
    tables, reports = {}, {}
    try:
        for eval_set in sets:
            tables[eval_set.name], problems = evaluator.run(eval_set)
            reports[eval_set.name] = {**vars(problems.report), "problems": len(problems)}
            log.info("%s: %s", eval_set.name, tables[eval_set.name])
    finally:
        writer.close()
        if hasattr(reward, "close"):
            reward.close()
    meta = {
        "label": cfg.label or Path(str(cfg.senior)).name,
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
    log.info("results in %s; macro average %s", out, results["macro"])
    return results


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> float | None:
    results = run(cfg)
    # returned for sweepers that optimise a metric
    return results["macro"].get("solo/pass@1")


if __name__ == "__main__":
    main()
