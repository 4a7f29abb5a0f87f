"""What a run tells its user as it goes and when it ends.

``RunReport`` is a callback of the launching process: every ``trainer.log_every_n_steps`` steps
it writes one line of the step's metrics to ``train.log`` (with the mean reward of the last
steps, which one batch's reward is too noisy to show), every ``CONSOLE_EVERY`` steps the same
line to the console, and every validation one line with its accuracies (the console and
``train.log``), which it also appends to ``validation.jsonl`` in the run folder, so that a
resumed run still knows the base's figure. ``closing_summary`` is what ``tandem.train`` prints
at the end: the base against the final validation accuracy, where the run's outputs are, what to run
next. ``run_label`` names a run by its folder, for Aim and the evaluation's tables;
``aim_arguments`` and ``link_aim_run`` give a run's Aim run that name and its folder, and let a
resumed run continue the Aim run it started (its hash is kept in ``aim_run.json``).

What this file leaves out: what is measured (``tandem.modules.grpo``) and the progress bar
(``tandem.modules.progress``).
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from pathlib import Path
from typing import Any

import lightning as L

from tandem.runs.start import AIM_RUN

log = logging.getLogger(__name__)

RECORD = "validation.jsonl"
# how many steps the reward's running mean covers
WINDOW = 10
# a step's line reaches the console every this many steps (train.log: every log_every_n_steps)
CONSOLE_EVERY = 10
# the training metrics of a step's line, short name -> logged key
STEP_KEYS = {
    "reward": "train/reward",
    "senior share": "train/senior_share",
    "handoffs": "train/handoffs_per_rollout",
    "length": "train/response_length",
    "loss": "train/loss",
    "kl": "train/kl",
    "s/step": "time/step",
}
PASSES = {"tandem": "senior + junior", "solo": "senior alone"}


class RunReport(L.Callback):
    """Metrics in ``train.log`` and on the console, and a record of every validation (rank 0).

    Every ``trainer.log_every_n_steps`` steps a line of the step's metrics goes to
    ``train.log``; every ``CONSOLE_EVERY`` steps, and at the last, the same line goes to the
    console too (above the progress bar where there is one).

    Args:
        folder: the run's folder (``validation.jsonl`` goes there).
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.rewards: deque[float] = deque(maxlen=WINDOW)
        # train.log alone (the lines the console also gets go through the root logger, once)
        self.steps = logging.getLogger("tandem.steps")
        files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
        self.steps.handlers = files
        self.steps.propagate = not files

    def on_train_batch_end(self, trainer: L.Trainer, *_: Any) -> None:
        metrics = _floats(trainer.callback_metrics)
        if "train/reward" in metrics:
            self.rewards.append(metrics["train/reward"])
        step = trainer.global_step
        every = max(1, int(trainer.log_every_n_steps or 1))
        last = 0 < trainer.max_steps <= step
        console = step % CONSOLE_EVERY == 0 or last
        if trainer.global_rank != 0 or (step % every and not console):
            return
        shown = [f"{name} {metrics[k]:.3g}" for name, k in STEP_KEYS.items() if k in metrics]
        if self.rewards:
            mean = sum(self.rewards) / len(self.rewards)
            shown.insert(1, f"reward over the last {len(self.rewards)} steps {mean:.3f}")
        total = f"/{trainer.max_steps}" if trainer.max_steps and trainer.max_steps > 0 else ""
        (log if console else self.steps).info("step %d%s: %s", step, total, ", ".join(shown))

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank != 0 or trainer.sanity_checking:
            return
        metrics = _floats(trainer.callback_metrics)
        accuracy = {
            p: metrics[f"val/{p}/accuracy"] for p in PASSES if f"val/{p}/accuracy" in metrics
        }
        if not accuracy:
            return
        entry = {"step": trainer.global_step, **{f"{p}_accuracy": a for p, a in accuracy.items()}}
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / RECORD).open("a") as f:
            f.write(json.dumps(entry) + "\n")
        shown = ", ".join(f"{p} ({PASSES[p]}) {a:.3f}" for p, a in accuracy.items())
        log.info("validation at step %d: accuracy %s", trainer.global_step, shown)


class LoggedStep(L.Callback):
    """Every metric logged at the training step it belongs to, as the run's own lines count
    steps: a training step's metrics at its number (1 for the first), a validation's at the
    steps done before it (0 for the base's).

    Lightning would log a training step's metrics at the number of steps done before it and an
    interval's validation one step early, so the CSV and Aim put the validation of step 20 at
    19; a logged ``step`` is what Lightning's loggers take as the step instead.
    """

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        step = float(trainer.global_step)
        pl_module.log("step", step, on_step=True, on_epoch=False, batch_size=1)

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any, **__: Any
    ) -> None:
        step = float(trainer.global_step)
        pl_module.log("step", step, on_step=False, on_epoch=True, batch_size=1)


def validations(folder: str | Path) -> list[dict[str, Any]]:
    """Every validation of the run in ``folder``, oldest first (one per step: the latest)."""
    path = Path(folder) / RECORD
    by_step: dict[int, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
                by_step[int(entry["step"])] = entry
            except (ValueError, KeyError, TypeError):
                continue  # a line a kill cut short
    return [by_step[s] for s in sorted(by_step)]


def closing_summary(folder: str | Path, cfg: Any, step: int, evaluate_hint: str) -> str:
    """The lines ``tandem.train`` prints when a run ends: base against final validation
    accuracy, where the outputs are, and what to run next."""
    folder = Path(folder)
    records = validations(folder)
    size = cfg.validation.size or "all"
    temperature = cfg.validation.temperature
    how = "greedy" if not temperature else f"temperature {temperature}"
    lines = [f"run finished at step {step}: {folder}"]
    if records:
        first, last = records[0], records[-1]
        lines.append(
            f"validation accuracy ({size} prompts of the validation split, {how}): "
            f"step {first['step']}{' (the base)' if first['step'] == 0 else ''} -> "
            f"step {last['step']}"
        )
        for p, who in PASSES.items():
            a, b = first.get(f"{p}_accuracy"), last.get(f"{p}_accuracy")
            if a is not None and b is not None:
                lines.append(f"  {p:<6} ({who}): {a:.3f} -> {b:.3f} ({b - a:+.3f})")
    else:
        lines.append("no validation ran (validation.at_start_and_end=false and no interval hit)")
    lines += [
        f"the senior: {folder / 'senior'}; checkpoints: {folder / 'checkpoints'}; "
        f"every validation: {folder / RECORD}; metrics: train.log, "
        + ("`aim up`" if _uses_aim(cfg) else f"{folder / 'csv'}"),
        f"next: {evaluate_hint}",
        "      python -m tandem.train experiment=grpo   (vanilla GRPO, the arm to compare with)",
    ]
    return "\n".join(lines)


def run_label(folder: str | Path) -> str:
    """A run's name from its folder: ``outputs/<run>`` -> ``<run>``, a job of a sweep
    (``multirun/<sweep>/<job>``, beside Hydra's ``multirun.yaml``) -> ``<sweep>/<job>``, where a
    job's folder that is only its number (``0``, ``1``) is named by the overrides Hydra recorded
    for it (``<sweep>/sampler=word,sampler.p=0.25``), as the notebook names it."""
    folder = Path(folder).expanduser().absolute()
    if not (folder.parent / "multirun.yaml").is_file():
        return folder.name
    job = folder.name
    overrides = folder / ".hydra" / "overrides.yaml"
    if job.isdigit() and overrides.is_file():
        items = [line[2:].strip() for line in overrides.read_text().splitlines()]
        items = [i for i in items if i and not i.startswith(("hydra.", "output_dir="))]
        job = ",".join(items) or job
    return f"{folder.parent.name}/{job}"


def _is_aim(spec: Any) -> bool:
    return str(spec.get("_target_", "")).endswith("AimLogger")


def aim_arguments(spec: Any, folder: str | Path, resuming: bool) -> dict[str, Any]:
    """What ``tandem.train`` adds to a logger spec: for Aim, the run's name, and on a resume
    the hash of the Aim run this run started (in the same repository), so that it continues."""
    if not _is_aim(spec):
        return {}
    extra: dict[str, Any] = {"run_name": run_label(folder)}
    try:
        previous = json.loads((Path(folder) / AIM_RUN).read_text())
    except (OSError, ValueError):
        previous = None
    if resuming and isinstance(previous, dict) and previous.get("repo") == _repo(spec):
        extra["run_hash"] = previous.get("hash")
    return extra


def link_aim_run(loggers: list[Any], specs: list[Any], folder: str | Path) -> None:
    """Record the Aim logger's run in the run folder (``aim_run.json``) and the folder in the
    Aim run (``output_dir``), so that either leads to the other. ``specs``: the loggers'
    configs, in order. Call it in the launching process only."""
    for logger, spec in zip(loggers, specs, strict=True):
        if _is_aim(spec):
            run = logger.experiment
            run["output_dir"] = str(Path(folder).absolute())
            record = {"hash": run.hash, "repo": _repo(spec)}
            (Path(folder) / AIM_RUN).write_text(json.dumps(record) + "\n")


def _repo(spec: Any) -> str:
    return str(Path(str(spec.get("repo") or ".aim")).expanduser().absolute())


def _uses_aim(cfg: Any) -> bool:
    return any("aim" in str(spec.get("_target_", "")).lower() for spec in cfg.logger or [])


def _floats(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[key] = number
    return out
