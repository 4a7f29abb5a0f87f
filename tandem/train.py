"""Train the senior: ``python -m tandem.train [overrides]``.

Composes ``conf/train.yaml`` with Hydra, checks the whole config before anything loads, then
builds the data module, the LightningModule, the junior callback, checkpointing and loggers, and
runs ``Trainer.fit``. Sweeps are Hydra multiruns::

    python -m tandem.train -m sampler=word,token,sentence sampler.p=0.25,0.5,0.75

Each run writes to its own folder (``outputs/<run_name>`` or ``multirun/<run_name>/<job>``),
which it locks for its whole life; all runs share one Aim repository. A killed run resumes with
the same ``run_name`` and ``ckpt_path=last`` (``tandem.runs``: what a start checks and records).

A start is refused before torch, Lightning and transformers are imported whenever the config alone
shows the problem (``tandem.config.check_before_imports``: every key of every component, read
from the source) or the folder is held, and before Lightning is imported whenever the models'
folders, the data's files, the memory plan or a resume's checkpoint show it: those imports take
seconds, many more on a busy machine. A refused start leaves no run folder behind that holds
nothing, and a start refused as its data loads takes its records back
(``tandem.runs.start.undo_start``).

Exit status: 0 for a finished run, 2 for a refused start (one message on stderr, no traceback:
a config error, ``tandem.config``'s or Hydra's own such as an override of a key that does not
exist; a held folder; a resume that would change what the checkpoint means), 1 for a full disk,
128 + the signal (143 for SIGTERM, 130 for SIGINT) for a run a signal stopped
(``tandem.runs.signals``). The process ends within a second of its last line
(``tandem.runs.leave``).

What this file leaves out: the training step (``tandem.modules.grpo``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from tandem.config import (
    ConfigError,
    check_before_imports,
    exit_config_error,
    run_command,
)
from tandem.runs import DiskFull, RunInterrupted, RunRefused, RunStopped
from tandem.runs import stop as stop_signals
from tandem.runs.lock import discard_unused, hold_folder, is_launcher

if TYPE_CHECKING:
    import lightning as L

    from tandem.data.datamodule import PromptDataModule
    from tandem.modules.grpo import TandemGRPO
    from tandem.runs.signals import StopOnSignal

log = logging.getLogger(__name__)


def world_size(cfg: DictConfig) -> int:
    """Processes the trainer config will start (devices x nodes, 1 for ``auto``)."""
    devices = cfg.trainer.get("devices", 1)
    devices = len(devices) if isinstance(devices, list | tuple) else devices
    devices = devices if isinstance(devices, int) and devices > 0 else 1
    return devices * int(cfg.trainer.get("num_nodes", 1) or 1)


def build(
    cfg: DictConfig, resuming: bool = False, stop: StopOnSignal | None = None
) -> tuple[L.Trainer, TandemGRPO, PromptDataModule, StopOnSignal]:
    """Everything ``fit`` needs, from a validated config; ``resuming``: from a checkpoint (an
    Aim logger then continues the Aim run this run started); ``stop``: the run's signal
    callback (a new one if None)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tandem.data.datamodule import PromptDataModule, prompt_token_cap
    from tandem.modules.export import ExportSenior
    from tandem.modules.junior import JuniorCallback
    from tandem.modules.models import context_length, load_tokenizer
    from tandem.modules.progress import StepProgressBar
    from tandem.runs.atomic import AtomicCheckpointIO
    from tandem.runs.report import LoggedStep, RunReport, aim_arguments
    from tandem.runs.signals import StopOnSignal
    from tandem.runs.steps import StepCheckpoint

    out = Path(cfg.output_dir)
    c = OmegaConf.to_container(cfg, resolve=True)
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    source = dict(c["data"])
    context = context_length(cfg.model.name_or_path)
    max_new = cfg.generation.max_new_tokens
    data = PromptDataModule(
        source=source,
        tokenizer=tokenizer,
        batch_size=cfg.batch_size // cfg.group_size,
        val_size=cfg.validation.size,
        seed=cfg.seed,
        **c["prompt"],
        max_prompt_tokens=prompt_token_cap(source.pop("max_prompt_tokens", None), context, max_new),
    )
    # plain containers, not DictConfigs: the module saves its arguments in every checkpoint
    module = hydra.utils.instantiate(cfg.module, _convert_="all")
    junior = cfg.model.junior_name_or_path or cfg.model.name_or_path
    ckpt_dir = out / "checkpoints"
    stop = StopOnSignal() if stop is None else stop
    callbacks = [
        JuniorCallback(junior, dtype=cfg.model.dtype, device=cfg.model.get("junior_device")),
        stop,
        ModelCheckpoint(
            dirpath=ckpt_dir,
            filename="best-{step}",
            monitor=cfg.validation.monitor,
            mode="max",
            save_top_k=1,
            auto_insert_metric_name=False,
            # only after a validation: at the end of a run a signal stopped, there is no metric
            save_on_train_epoch_end=False,
        ),
        StepCheckpoint(ckpt_dir, cfg.checkpoint_every_n_steps, cfg.keep_checkpoints, stop),
        LoggedStep(),
        ExportSenior(out / "senior", stop),
    ]
    # a bar redraws itself with terminal escapes: into a file or a pipe, the step lines alone
    bar = bool(cfg.trainer.get("enable_progress_bar", True)) and sys.stdout.isatty()
    if bar:
        callbacks.append(StepProgressBar())
    if is_launcher():
        callbacks.append(RunReport(out))
    loggers = [
        hydra.utils.instantiate(spec, **aim_arguments(spec, out, resuming)) for spec in cfg.logger
    ]
    trainer = hydra.utils.instantiate(
        cfg.trainer,
        callbacks=callbacks,
        logger=loggers,
        # every checkpoint is whole or absent, with its checksum beside it
        plugins=[AtomicCheckpointIO()],
        default_root_dir=str(out),
        enable_progress_bar=bar,
        # a training step is one batch of rollouts, whatever optimizer steps it makes
        val_check_interval=cfg.validation.every_n_steps,
        check_val_every_n_epoch=None,
    )
    return trainer, module, data, stop


def run(cfg: DictConfig) -> dict[str, Any]:
    """Validate, build and fit; returns the final logged metrics. Raises ``ConfigError`` or
    ``RunRefused`` for a start that is refused, ``RunInterrupted`` when a signal stopped the run.
    """
    check_before_imports(cfg, world_size(cfg))
    # SIGTERM / SIGINT from here on stop the run resumably (tandem.runs.stop), in any phase
    with hold_folder(cfg), stop_signals.catching():
        return _fit(cfg)


def _fit(cfg: DictConfig) -> dict[str, Any]:
    """``run`` once the config's own checks passed and the folder is held."""
    from tandem.config import validate_train_config
    from tandem.plan import check_plan
    from tandem.plan.__main__ import one_line
    from tandem.plan.report import summary
    from tandem.runs.start import begin, undo_start

    validate_train_config(cfg, world_size(cfg))
    # every byte each device will hold, from config.json alone: a run that cannot fit is
    # refused here (PlanError, exit 2), not by an out-of-memory error hours in
    plan = check_plan(cfg, world_size(cfg))
    if is_launcher():
        # one line: every term is in run_info.json, and python -m tandem.plan prints the table
        log.info("%s (every term: run_info.json, or python -m tandem.plan)", one_line(plan))
    # the last refusals (a resume that would change what its checkpoint means) come before
    # Lightning's seconds of imports
    ckpt = begin(cfg, plan=summary(plan))
    if ckpt is None and is_launcher():
        say_interrupted_beside(cfg)
    try:
        return _fit_begun(cfg, ckpt)
    except (ConfigError, InstantiationException, RunRefused):
        if is_launcher():  # refused as the data loaded: the start's records go with it
            undo_start(cfg.output_dir)
        raise


def _fit_begun(cfg: DictConfig, ckpt: str | None) -> dict[str, Any]:
    """``_fit`` once the start is recorded: build, validate the base, fit."""
    import lightning as L
    import torch
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from tandem.runs.quiet import quiet_libraries
    from tandem.runs.report import link_aim_run
    from tandem.runs.signals import StopOnSignal

    quiet_libraries()  # again, now that Lightning has set its loggers up
    stop = StopOnSignal()
    try:
        if cfg.get("threads"):
            torch.set_num_threads(cfg.threads)
        L.seed_everything(cfg.seed, workers=True)
        trainer, module, data, _ = build(cfg, resuming=ckpt is not None, stop=stop)
        if is_launcher():
            link_aim_run(trainer.loggers, list(cfg.logger), cfg.output_dir)
        if trainer.global_rank == 0:
            log.info("run folder %s; resume with: %s", cfg.output_dir, resume_hint(cfg))
        stop_signals.stop_point()
        metrics = _train(cfg, trainer, module, data, ckpt, stop)
    except stop_signals.StopNow as err:
        raise RunInterrupted(stopped_message(cfg, stop.where, err.signum), err.signum) from None
    except SIGTERMException:  # Lightning's own, where a SIGTERM came before ours took it back
        raise RunInterrupted(
            stopped_message(cfg, stop.where, signal.SIGTERM), signal.SIGTERM
        ) from None
    if stop.stopping:
        raise RunInterrupted(
            f"stopped by {signal.Signals(stop.exit_code - 128).name} at the end of step "
            f"{trainer.global_step}, its checkpoint saved; resume with: {resume_hint(cfg)}",
            stop.exit_code - 128,
        )
    return metrics


def _train(
    cfg: DictConfig,
    trainer: L.Trainer,
    module: TandemGRPO,
    data: PromptDataModule,
    ckpt: str | None,
    stop: StopOnSignal,
) -> dict[str, Any]:
    """The base's validation, ``fit`` and the final validation; the closing summary."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    from tandem.runs.checkpoints import clean_temporaries, disk_full_message, out_of_space
    from tandem.runs.report import closing_summary

    # under a progress bar, the console's lines are written above it, not into it
    bar = trainer.progress_bar_callback is not None
    try:
        with logging_redirect_tqdm() if bar else contextlib.nullcontext():
            metrics = _fit_and_validate(cfg, trainer, module, data, ckpt, stop)
    except (OSError, RuntimeError) as err:  # any other write of the run: the export, logs
        full = out_of_space(err)
        if full is None:
            raise
        out = Path(cfg.output_dir)
        folder = Path(full.filename).parent if full.filename else out
        # what the failed write left (a half export) holds space the message would not count
        clean_temporaries(out, out / "checkpoints")
        raise DiskFull(disk_full_message(folder, None, out / "checkpoints")) from None
    if not stop.stopping and is_launcher():
        log.info(
            "%s", closing_summary(cfg.output_dir, cfg, trainer.global_step, evaluate_hint(cfg))
        )
    return metrics


def _fit_and_validate(
    cfg: DictConfig,
    trainer: L.Trainer,
    module: TandemGRPO,
    data: PromptDataModule,
    ckpt: str | None,
    stop: StopOnSignal,
) -> dict[str, float]:
    """The base's validation (a fresh start), ``fit``, the final senior's validation (where no
    interval ended on the last step); the metrics of the last training step and validation."""
    at_ends = cfg.validation.get("at_start_and_end", False)
    if at_ends and ckpt is None:
        trainer.validate(module, datamodule=data, verbose=False)  # the base's figure
    trainer.fit(module, datamodule=data, ckpt_path=ckpt)
    # a validation starts its metrics afresh: keep the training's beside the final ones
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # the interval's own validation came at a multiple of it (every rank knows the same)
    last_validated = trainer.global_step % cfg.validation.every_n_steps == 0
    if at_ends and not stop.stopping and not last_validated:
        trainer.validate(module, datamodule=data, verbose=False)  # the final senior's
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
    return metrics


def stopped_message(cfg: DictConfig, where: str, signum: int) -> str:
    """What a run a signal stopped inside a step says: what was under way, where a resume
    starts, the command."""
    from tandem.runs.checkpoints import STEP, step_checkpoints

    saved = sorted(
        step_checkpoints(Path(cfg.output_dir) / "checkpoints"),
        key=lambda p: int(STEP.match(p.name)[1]),
    )
    start = (
        f"a resume starts from the newest checkpoint, {saved[-1].name}"
        if saved
        else "no step checkpoint was written yet, so a resume starts from the beginning"
    )
    return (
        f"stopped by {signal.Signals(signum).name} during {where}, which is not saved; {start}. "
        f"Resume with: {resume_hint(cfg)}"
    )


def say_interrupted_beside(cfg: DictConfig) -> None:
    """A fresh start beside a run that was stopped before it finished says how to resume that
    one instead (a rerun of the same command starts a new run: its name is the time)."""
    from tandem.runs.start import interrupted_beside

    if _multirun():
        return  # a sweep's jobs are resumed by the sweep's command
    found = interrupted_beside(cfg.output_dir)
    if found is None:
        return
    name, step = found
    log.warning(
        "this is a new run; %s beside it was stopped before it finished (its newest checkpoint "
        "is step %d). To resume that one instead: python -m tandem.train run_name=%s "
        "ckpt_path=last",
        Path(cfg.output_dir).parent / name,
        step,
        name,
    )


def _multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # not started by Hydra (a test, a notebook)
        return False


def evaluate_hint(cfg: DictConfig) -> str:
    """The command that scores this run's senior beside its base."""
    return (
        f"python -m tandem.evaluate senior={Path(cfg.output_dir) / 'senior'} with_base=true"
        "   (pass@k, drift, legibility; the base beside it)"
    )


def resume_hint(cfg: DictConfig) -> str:
    """The command that resumes this run: its own, or its sweep's for a job of a multirun."""
    if _multirun():
        return "the sweep's own command again, with ckpt_path=last (as the study configs set it)"
    return f"python -m tandem.train run_name={cfg.run_name} ckpt_path=last"


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        metrics = run(cfg)
    except (ConfigError, InstantiationException) as err:
        # leaving here, not through Hydra's handler, keeps the message to itself: no traceback,
        # no "Error executing job" line; an object the config builds refused its arguments
        discard_unused(cfg.output_dir)
        exit_config_error(err)
    except RunStopped as err:
        # the user's to act on: one line, no traceback
        if isinstance(err, RunRefused):
            discard_unused(cfg.output_dir)
        print(f"tandem.train: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    # returned for sweepers that optimise a metric
    return metrics.get(cfg.validation.monitor)


def cli() -> None:
    """``python -m tandem.train``: a config problem is one message and exit status 2."""
    # before torch loads its OpenMP runtime, which reads it once: waiting threads sleep instead
    # of spinning, so a second busy process on the machine no longer slows every step many times
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from tandem.runs.quiet import quiet_libraries

    quiet_libraries()
    run_command(main)


if __name__ == "__main__":
    cli()
