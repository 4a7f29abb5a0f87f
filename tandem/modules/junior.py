"""The junior callback: owns the frozen junior model and lends it to the LightningModule.

The junior is loaded here, frozen, put on its device and handed to the module through a plain
holder, *not* as a submodule. So it is never in the optimizer, never in a checkpoint (it is the
base checkpoint, always reloadable), never wrapped by FSDP or DDP, and never in ``.train()``. It
doubles as the reference model for KL terms and drift metrics.

By default the junior is the checkpoint the senior starts from (the paper's choice). A junior of
another family (its own tokenizer) is held with its tokenizer, which the engine needs to hand
words over as text (``tandem.engine.cross``). On GPUs it
can live on its own device (``device: cuda:1``), since the engine assumes nothing about where
either model lives.

What this file leaves out: the senior (``tandem.modules.grpo``).
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch

from tandem.engine.cross import same_vocabulary
from tandem.modules.models import load_causal_lm, load_tokenizer

log = logging.getLogger(__name__)


class FrozenModel:
    """A model held outside ``nn.Module`` attribute registration (so never a submodule), with
    its tokenizer when its vocabulary is its own (a junior of another family reads and writes
    in its own tokens; None for a junior of the senior's vocabulary)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any = None) -> None:
        self.model = model
        self.tokenizer = tokenizer

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


class JuniorCallback(L.Callback):
    """Load, freeze and place the junior, then give it to ``pl_module.junior_holder``.

    Args:
        name_or_path: the junior checkpoint (``tiny``, a hub name or a folder).
        dtype: its dtype (``float32``, ``bfloat16``, ...).
        device: where it lives; None puts it on the senior's device.
    """

    def __init__(
        self, name_or_path: str, dtype: str = "float32", device: str | None = None
    ) -> None:
        self.name_or_path, self.dtype, self.device = name_or_path, dtype, device
        self.holder: FrozenModel | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.holder is None:
            model = load_causal_lm(self.name_or_path, self.dtype)
            model.requires_grad_(False)
            model.eval()
            # its own tokenizer is kept only when it differs from the senior's, so that the
            # engine compares vocabularies once here, not at every rollout
            tokenizer = load_tokenizer(self.name_or_path)
            if same_vocabulary(getattr(pl_module, "tokenizer", None), tokenizer):
                tokenizer = None
            self.holder = FrozenModel(model, tokenizer)
            log.info("junior %s loaded and frozen", self.name_or_path)
        device = torch.device(self.device) if self.device else pl_module.device
        self.holder.model.to(device)
        pl_module.junior_holder = self.holder

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the strategy may have moved the senior after setup; follow it unless pinned
        if self.device is None and self.holder is not None:
            self.holder.model.to(pl_module.device)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # a validation outside fit (the base's, before the first step) has no on_fit_start
        self.on_fit_start(trainer, pl_module)

    def state_dict(self) -> dict[str, Any]:
        # nothing of the junior goes into checkpoints: it is reloaded from its checkpoint
        return {"name_or_path": self.name_or_path}
