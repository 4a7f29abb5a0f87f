"""The senior and junior of an evaluation, from whatever form the senior comes in.

The senior may be a Lightning checkpoint of ``tandem.train`` (``*.ckpt``: exported to a Hugging
Face folder first with ``export_checkpoint``), a Hugging Face folder or hub name, or ``tiny``.
The junior defaults to the senior's base, found where the senior says it:

1. a checkpoint: the junior it trained with (the junior callback's state), else its ``model``;
2. a folder exported by a training run (``<run>/senior``): the run's ``.hydra/config.yaml``;
3. otherwise the senior itself: a base model evaluated as its own junior.

What this file leaves out: freezing for training (``tandem.modules.junior``); here both models
are only read, in eval mode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from tandem.engine.cross import same_vocabulary
from tandem.modules.export import export_checkpoint
from tandem.modules.models import load_causal_lm, load_tokenizer, resolve
from tandem.runs.checkpoints import is_distributed_checkpoint, read_checkpoint

log = logging.getLogger(__name__)


@dataclass
class ModelPair:
    """Both models, their tokenizer, and where each came from (for the results)."""

    senior: torch.nn.Module
    junior: torch.nn.Module
    tokenizer: Any
    senior_path: str
    junior_path: str
    # a junior of another vocabulary: its tokenizer, and the senior's base for drift
    junior_tokenizer: Any = None
    base: torch.nn.Module | None = None


def is_checkpoint(name_or_path: str) -> bool:
    """True for a Lightning checkpoint: a file, or a sharded run's folder."""
    return str(name_or_path).endswith(".ckpt") or is_distributed_checkpoint(name_or_path)


def senior_base(name_or_path: str) -> str:
    """The base the senior started from (its default junior); the senior itself if unknown."""
    if is_checkpoint(name_or_path):
        ckpt = read_checkpoint(name_or_path)
        for key, state in (ckpt.get("callbacks") or {}).items():
            if "JuniorCallback" in str(key) and state.get("name_or_path"):
                return str(state["name_or_path"])
        return str(ckpt["hyper_parameters"]["model"])
    run_config = Path(name_or_path).expanduser().parent / ".hydra" / "config.yaml"
    if Path(name_or_path).expanduser().is_dir() and run_config.is_file():
        model = OmegaConf.load(run_config).get("model") or {}
        base = model.get("junior_name_or_path") or model.get("name_or_path")
        if base:
            return str(base)
    log.warning(
        "the base of senior %s is unknown: it is its own junior (drift 0 by construction). "
        "Set junior=<base checkpoint> to measure drift against the base.",
        name_or_path,
    )
    return str(name_or_path)


def load_pair(
    senior: str,
    junior: str | None,
    output_dir: str | Path,
    dtype: str = "float32",
    device: str = "cpu",
    junior_device: str | None = None,
) -> ModelPair:
    """Load both models in eval mode on their devices.

    Args:
        senior: a ``.ckpt``, a Hugging Face folder or hub name, or ``tiny``.
        junior: the junior; None for the senior's base (see the module docstring).
        output_dir: where a checkpoint is exported (``<output_dir>/senior``).
        dtype: both models' dtype.
        device: the senior's device; the junior's too unless ``junior_device`` is set.
        junior_device: the junior's own device.
    """
    base = senior_base(senior)
    junior = junior or base
    senior_path = senior
    if is_checkpoint(senior):
        senior_path = str(export_checkpoint(senior, Path(output_dir) / "senior"))
        log.info("exported checkpoint %s to %s", senior, senior_path)
    senior_model = _load(senior_path, dtype, device)
    if resolve(junior) == resolve(senior_path) and (junior_device or device) == device:
        # a base evaluated against itself: one copy serves both (each keeps its own KV cache)
        junior_model = senior_model
    else:
        junior_model = _load(junior, dtype, junior_device or device)
    tokenizer, junior_tokenizer = load_tokenizer(senior_path), load_tokenizer(junior)
    if same_vocabulary(tokenizer, junior_tokenizer):
        return ModelPair(senior_model, junior_model, tokenizer, senior_path, junior)
    # another family: drift is still measured against the senior's own base
    base_model = (
        senior_model if resolve(base) == resolve(senior_path) else _load(base, dtype, device)
    )
    return ModelPair(
        senior_model, junior_model, tokenizer, senior_path, junior, junior_tokenizer, base_model
    )


def _load(path: str, dtype: str, device: str) -> torch.nn.Module:
    model = load_causal_lm(path, dtype).to(device)
    model.requires_grad_(False)
    return model.eval()
