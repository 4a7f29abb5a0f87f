"""The senior as a Hugging Face folder: at the end of training, and from any Lightning checkpoint.

An export is all or nothing: the folder is written under a temporary name, completed with
``export.json`` (the step it holds and the size of every file), and renamed into place. A
reader tells a whole export from a half-written one with ``check_senior``. A sharded senior is
gathered whole by every rank and written by rank 0: the export is always the full model.

What this file leaves out: loading for evaluation (``tandem.modules.models`` loads the folder).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import lightning as L
import torch

from tandem.modules.models import DTYPES, load_causal_lm, load_tokenizer
from tandem.modules.sharding import full_state_dict, is_sharded
from tandem.runs.faults import fault_point
from tandem.runs.signals import StopOnSignal

log = logging.getLogger(__name__)

MARKER = "export.json"
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


class ExportSenior(L.Callback):
    """Write the trained senior and its tokenizer when fit ends, unless the folder already holds
    the senior of this step (a finished run started again) or a signal stopped the run early.

    Args:
        folder: where the senior goes (``<run>/senior``).
        stop: the run's signal handler; a run it stopped is not finished, so not exported.
    """

    def __init__(self, folder: str | Path, stop: StopOnSignal | None = None) -> None:
        self.folder = Path(folder)
        self.stop = stop

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # on_fit_end, not on_train_end: a finished run started again restores its checkpoint and
        # skips the training loop (no on_train_end), and must still re-export a missing senior
        if self.stop is not None and self.stop.stopping:
            return
        step = trainer.global_step
        # rank 0's view decides for all: a sharded senior needs every rank to gather it
        done = check_senior(self.folder) is None and exported_step(self.folder) == step
        if trainer.strategy.broadcast(done):
            if trainer.global_rank == 0:
                log.info("%s already holds the senior of step %d", self.folder, step)
            return
        senior = pl_module.senior
        place = getattr(pl_module, "place", None)
        if place is not None:  # the gather reads the shards on the device, never the host
            place(shards=True)
        state = full_state_dict(senior) if is_sharded(senior) else None
        if trainer.global_rank == 0:
            save_senior(
                senior,
                pl_module.tokenizer,
                self.folder,
                step,
                state_dict=state,
                dtype=pl_module.hparams.dtype,
            )
            log.info("exported the senior of step %d to %s", step, self.folder)


def save_senior(
    model: Any,
    tokenizer: Any,
    folder: str | Path,
    step: int,
    state_dict: dict[str, torch.Tensor] | None = None,
    dtype: str | None = None,
) -> Path:
    """Write ``model`` and ``tokenizer`` to ``folder`` atomically (a reader sees the old folder,
    or none, or the new one whole); returns the folder. ``state_dict``: the weights to write
    instead of the model's own (a sharded model's, gathered whole). ``dtype``: the weights'
    dtype in the folder (the run's ``model.dtype``: a senior trained on float32 master weights
    is exported as it computes); None: as held."""
    folder = Path(folder)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    old = folder.with_name(f"{folder.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if dtype is not None:
        state_dict = _cast(model.state_dict() if state_dict is None else state_dict, dtype)
    model.save_pretrained(tmp, state_dict=state_dict)
    if dtype is not None:  # save_pretrained records the dtype of the model's own parameters
        config = json.loads((tmp / "config.json").read_text())
        config["dtype"] = dtype
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    fault_point("export", step)
    tokenizer.save_pretrained(tmp)
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    for name in files:
        with (tmp / name).open("rb") as f:
            os.fsync(f.fileno())
    (tmp / MARKER).write_text(json.dumps({"step": step, "files": files}, indent=2) + "\n")
    # a folder cannot be renamed over another: the old one steps aside first (a kill in between
    # leaves no senior/, which the next start with ckpt_path=last writes again)
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def _cast(state: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """``state``'s floating-point tensors in ``dtype``; tensors that shared storage (tied
    embeddings) still share it, so that the folder holds them once."""
    target, cast = DTYPES[dtype], {}
    out = {}
    for name, value in state.items():
        if not value.is_floating_point():
            out[name] = value
            continue
        key = (value.data_ptr(), value.shape, value.stride())
        if key not in cast:
            cast[key] = value.to(target)
        out[name] = cast[key]
    return out


def check_senior(folder: str | Path) -> str | None:
    """Why ``folder`` is not a whole model folder, or None when it is.

    A folder with ``export.json`` must hold every file it lists at its size. A training run's
    ``senior/`` without one was cut short. Any other folder (a downloaded base, say) must have a
    readable ``config.json`` and a non-empty weights file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return f"{folder} does not exist"
    marker = folder / MARKER
    if marker.is_file():
        try:
            files = json.loads(marker.read_text())["files"]
        except (ValueError, KeyError):
            return f"{marker} is unreadable"
        for name, size in files.items():
            path = folder / name
            if not path.is_file() or path.stat().st_size != size:
                return f"{path} is missing or not the size the export wrote ({size} bytes)"
        return None
    if (folder.parent / "run_info.json").is_file():
        return f"{folder} has no {MARKER}: its export was cut short"
    try:
        json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return f"{folder / 'config.json'} is missing or not JSON"
    if not any((folder / w).is_file() and (folder / w).stat().st_size for w in WEIGHTS):
        return f"{folder} holds no non-empty weights file ({', '.join(WEIGHTS)})"
    return None


def exported_step(folder: str | Path) -> int | None:
    """The optimizer step of the senior in an export folder (None: unknown)."""
    try:
        return int(json.loads((Path(folder) / MARKER).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def export_checkpoint(ckpt_path: str | Path, folder: str | Path) -> Path:
    """Turn a training checkpoint into a Hugging Face folder of the senior it holds."""
    ckpt = load_checkpoint_file(ckpt_path)
    hp = ckpt["hyper_parameters"]
    model = load_causal_lm(hp["model"], hp.get("dtype", "float32"))
    prefix = "senior."
    state = {k[len(prefix) :]: v for k, v in ckpt["state_dict"].items() if k.startswith(prefix)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied embeddings make lm_head.weight legitimately absent from the state dict
    missing = [
        k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)
    ]
    if missing or unexpected:
        raise ValueError(
            f"{ckpt_path} does not hold a full senior: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}. Is it a tandem.train checkpoint?"
        )
    return save_senior(model, load_tokenizer(hp["model"]), folder, int(ckpt.get("global_step", 0)))


def load_checkpoint_file(ckpt_path: str | Path) -> dict[str, Any]:
    """A Lightning checkpoint as one dictionary: a file, or a sharded run's distributed
    checkpoint folder with its shards put together (in this process, no process group)."""
    if Path(ckpt_path).is_dir():
        from lightning.fabric.utilities.load import _load_distributed_checkpoint

        return _load_distributed_checkpoint(Path(ckpt_path))
    return torch.load(ckpt_path, map_location="cpu", weights_only=False)
