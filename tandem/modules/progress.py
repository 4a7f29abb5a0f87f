"""A progress bar over optimizer steps (not epochs: the prompt stream is endless).

It shows the step, the reward and the senior's token share; validation gets its own bar.
What this file leaves out: what is logged (``tandem.modules.grpo``).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar


class StepProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar with ``max_steps`` as its total and the step in its description."""

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        super().on_train_epoch_start(trainer)
        self.train_progress_bar.reset(total=trainer.max_steps if trainer.max_steps > 0 else None)
        self.train_progress_bar.initial = trainer.global_step
        self.train_progress_bar.n = trainer.global_step
        self.train_progress_bar.set_description("train steps")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        bar = self.train_progress_bar
        bar.n = trainer.global_step
        bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
        bar.refresh()

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics
