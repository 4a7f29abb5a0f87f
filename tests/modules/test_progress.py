"""The progress bar shows the reward's running mean beside the step's own, and keeps it, and the
last validation's solo accuracy beside its tandem one."""

from __future__ import annotations

from types import SimpleNamespace

from lightning.pytorch.callbacks import TQDMProgressBar
from tqdm import tqdm

from tandem.modules.progress import WINDOW, StepProgressBar


def test_the_bar_shows_the_rewards_running_mean_and_keeps_it_after_a_validation(
    monkeypatch,
) -> None:
    # what Lightning's bar shows is the module's progress-bar metrics
    shown = lambda self, trainer, module: dict(trainer.progress_bar_metrics)  # noqa: E731
    monkeypatch.setattr(TQDMProgressBar, "get_metrics", shown)
    bar = StepProgressBar()
    bar.train_progress_bar = tqdm(disable=True)
    trainer = SimpleNamespace(global_step=0, progress_bar_metrics={}, callback_metrics={})
    for step, reward in enumerate([0.0, 1.0, 0.5] + [0.25] * WINDOW, start=1):
        trainer.global_step, trainer.progress_bar_metrics = step, {"reward": reward, "senior": 0.5}
        bar.on_train_batch_end(trainer, None)
        if step == 3:
            assert bar.get_metrics(trainer, None) == {"reward": 0.5, f"mean{WINDOW}": "0.500",
                                                      "senior": 0.5}  # fmt: skip
    # the last WINDOW steps only; a validation's redraw reads get_metrics too
    trainer.progress_bar_metrics["val/tandem/accuracy"] = 0.4
    trainer.callback_metrics["val/solo/accuracy"] = 0.3
    shown = bar.get_metrics(trainer, None)
    assert shown[f"mean{WINDOW}"] == "0.250" and shown["val/solo/accuracy"] == "0.300"
