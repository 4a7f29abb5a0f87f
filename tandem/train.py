"""Train the senior: ``python -m tandem.train [overrides]``.

Composes ``conf/train.yaml`` with Hydra, checks the whole config before anything loads, then
builds the data module, the LightningModule, the junior callback, checkpointing and loggers, and
runs ``Trainer.fit``. Sweeps are Hydra multiruns::

    python -m tandem.train -m sampler=word,token,sentence sampler.p=0.25,0.5,0.75

Each run writes to its own folder (``outputs/<run_name>`` or ``multirun/<run_name>/<job>``);
all runs share one Aim repository. A killed run resumes with the same ``run_name`` and
``ckpt_path=last``. A config problem (``tandem.config``, or Hydra's own, such as an override of
a key that does not exist) ends the run with one message and exit status 2, no traceback.

What this file leaves out: the training step (``tandem.modules.grpo``).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import hydra
import lightning as L
import torch
from hydra.errors import CompactHydraException
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from tandem.config import ConfigError, config_error_message, validate_train_config
from tandem.data.datamodule import PromptDataModule, prompt_token_cap
from tandem.modules.export import ExportSenior
from tandem.modules.grpo import TandemGRPO
from tandem.modules.junior import JuniorCallback
from tandem.modules.models import context_length, load_tokenizer
from tandem.modules.progress import StepProgressBar
from tandem.provenance import record_start

log = logging.getLogger(__name__)


def world_size(cfg: DictConfig) -> int:
    """Processes the trainer config will start (devices x nodes, 1 for ``auto``)."""
    devices = cfg.trainer.get("devices", 1)
    devices = len(devices) if isinstance(devices, list | tuple) else devices
    devices = devices if isinstance(devices, int) and devices > 0 else 1
    return devices * int(cfg.trainer.get("num_nodes", 1) or 1)


def build(cfg: DictConfig) -> tuple[L.Trainer, TandemGRPO, PromptDataModule, str | None]:
    """Everything ``fit`` needs, from a validated config."""
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
    module = TandemGRPO(
        model=cfg.model.name_or_path,
        sampler=c["sampler"],
        reward=c["reward"],
        generation=c["generation"],
        group_size=cfg.group_size,
        dtype=cfg.model.dtype,
        seed=cfg.seed,
        val_sampler=c["validation"]["sampler"],
        val_temperature=cfg.validation.temperature,
        **c["module"],
    )
    junior = cfg.model.junior_name_or_path or cfg.model.name_or_path
    ckpt_dir = out / "checkpoints"
    callbacks = [
        JuniorCallback(junior, dtype=cfg.model.dtype, device=cfg.model.get("junior_device")),
        ModelCheckpoint(
            dirpath=ckpt_dir,
            filename="best-{step}",
            monitor=cfg.validation.monitor,
            mode="max",
            save_top_k=1,
            auto_insert_metric_name=False,
        ),
        ModelCheckpoint(
            dirpath=ckpt_dir,
            filename="step-{step}",
            save_top_k=0,
            save_last=True,
            every_n_train_steps=cfg.checkpoint_every_n_steps,
        ),
        ExportSenior(out / "senior"),
    ]
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(StepProgressBar())
    loggers = [hydra.utils.instantiate(spec) for spec in cfg.logger]
    trainer = hydra.utils.instantiate(
        cfg.trainer,
        callbacks=callbacks,
        logger=loggers,
        default_root_dir=str(out),
        val_check_interval=cfg.validation.every_n_steps,
        check_val_every_n_epoch=None,
    )
    return trainer, module, data, resolve_ckpt(cfg.ckpt_path, ckpt_dir)


def resolve_ckpt(ckpt_path: str | None, ckpt_dir: Path) -> str | None:
    """``last`` -> this run's ``last.ckpt`` (None, to start afresh, when it has none yet)."""
    if ckpt_path != "last":
        return ckpt_path
    last = ckpt_dir / "last.ckpt"
    if last.is_file():
        log.info("resuming from %s", last)
        return str(last)
    log.warning("ckpt_path=last but %s does not exist: starting from the beginning", last)
    return None


def checkpoint_step(ckpt: str | None) -> int:
    """The optimizer step a run resumes from (0 for a fresh start)."""
    if ckpt is None:
        return 0
    state = torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)
    return int(state.get("global_step", 0))


def run(cfg: DictConfig) -> dict[str, Any]:
    """Validate, build and fit; returns the final logged metrics."""
    validate_train_config(cfg, world_size(cfg))
    if cfg.get("threads"):
        torch.set_num_threads(cfg.threads)
    L.seed_everything(cfg.seed, workers=True)
    trainer, module, data, ckpt = build(cfg)
    if trainer.global_rank == 0:
        record_start(cfg.output_dir, checkpoint_step(ckpt))
        log.info(
            "run folder %s; resume with: python -m tandem.train run_name=%s ckpt_path=last",
            cfg.output_dir,
            cfg.run_name,
        )
    trainer.fit(module, datamodule=data, ckpt_path=ckpt)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        metrics = run(cfg)
    except ConfigError as err:
        # leaving here, not through Hydra's handler, keeps the message to itself: no traceback
        exit_config_error(err)
    # returned for sweepers that optimise a metric
    return metrics.get(cfg.validation.monitor)


def cli() -> None:
    """``python -m tandem.train``: a config problem is one message and exit status 2."""
    # Hydra prints its own errors with a trimmed traceback and exits 1; HYDRA_FULL_ERROR makes it
    # raise them instead, so that its composition errors (an override of a key that does not
    # exist, an unknown option of a group) end here like the checks of tandem.config do
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        main()
    except CompactHydraException as err:
        exit_config_error(err)


def exit_config_error(err: Exception) -> NoReturn:
    """Print a config error as one message (problems on the lines below) and exit with 2."""
    print(f"config error: {config_error_message(err)}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    cli()
