"""A progress bar over optimizer steps (not epochs: the prompt stream is endless).

It shows the step, the reward, its mean over the last steps (one batch's reward is too noisy to
read a trend from), the senior's token share and the last validation's accuracies, tandem and
solo; validation gets its own bar. Only on a terminal: into a file or a pipe its redrawing
would be escape codes, and the run's step lines (``tandem.runs.report``) say the same.
What this file leaves out: what is logged (``tandem.modules.grpo``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar

# how many steps the reward's running mean covers
WINDOW = 10


class StepProgressBar(TQDMProgressBar):
    """Lightning's tqdm bar with ``max_steps`` as its total and the step in its description."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rewards: deque[float] = deque(maxlen=WINDOW)

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        super().on_train_epoch_start(trainer)
        self.train_progress_bar.reset(total=trainer.max_steps if trainer.max_steps > 0 else None)
        self.train_progress_bar.initial = trainer.global_step
        self.train_progress_bar.n = trainer.global_step
        self.train_progress_bar.set_description("train steps")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        bar = self.train_progress_bar
        bar.n = trainer.global_step
        reward = trainer.progress_bar_metrics.get("reward")
        if isinstance(reward, int | float):
            self.rewards.append(float(reward))
        bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
        bar.refresh()

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        # the senior alone beside the pair (the module shows the tandem accuracy in the bar)
        solo = trainer.callback_metrics.get("val/solo/accuracy")
        if solo is not None and "val/tandem/accuracy" in metrics:
            metrics["val/solo/accuracy"] = f"{float(solo):.3f}"
        if "reward" in metrics and self.rewards:
            # the running mean beside the step's reward, where the eye reads it (here, so that
            # the bar keeps it when a validation redraws it)
            mean = f"{sum(self.rewards) / len(self.rewards):.3f}"
            metrics = {"reward": metrics.pop("reward"), f"mean{WINDOW}": mean, **metrics}
        return metrics
