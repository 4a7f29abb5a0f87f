"""The senior as a Hugging Face folder: at the end of training, and from any Lightning checkpoint.

What this file leaves out: loading for evaluation (``tandem.modules.models`` loads the folder).
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from tandem.modules.models import load_causal_lm, load_tokenizer


class ExportSenior(L.Callback):
    """Write the trained senior and its tokenizer with ``save_pretrained`` when fit ends."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank == 0:
            pl_module.senior.save_pretrained(self.folder)
            pl_module.tokenizer.save_pretrained(self.folder)


def export_checkpoint(ckpt_path: str | Path, folder: str | Path) -> Path:
    """Turn a training checkpoint into a Hugging Face folder of the senior it holds."""
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
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
    folder = Path(folder)
    model.save_pretrained(folder)
    load_tokenizer(hp["model"]).save_pretrained(folder)
    return folder
