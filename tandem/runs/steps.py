"""Which step checkpoints a run writes, and which it keeps.

``StepCheckpoint`` writes ``step-<N>.ckpt`` every ``checkpoint_every_n_steps`` training steps, at
the run's last step (whatever the interval) and at the step where a signal stops the run, and
keeps the newest ``keep_checkpoints`` of them. It counts what is on disk, not what an earlier
start remembered: a resume that lowers ``keep_checkpoints`` deletes down to the new number at its
first save, and one that raises it keeps more from then on. (Lightning's own top-k bookkeeping
deletes only when its list holds exactly ``save_top_k`` entries, so a resume under a lower number
stopped every deletion for good.)

A new checkpoint is whole on disk before an older one goes, so that a failed write leaves the
newest checkpoint intact; but where the disk cannot hold the new one beside them, the old ones
that would go after the write (those beyond the newest ``keep - 1``) go first: otherwise the
advice to lower ``keep_checkpoints`` on a full disk could never be followed.

What this file leaves out: how a checkpoint is written (``tandem.runs.checkpoints``) and the
signal handling (``tandem.runs.signals``).
"""

from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tandem.runs.checkpoints import STEP, step_checkpoints
from tandem.runs.signals import StopOnSignal

log = logging.getLogger(__name__)

# Lightning warns at every step checkpoint, with a code snippet that reads like a traceback,
# that under manual optimization it holds the weights after that step's optimizer steps. That is
# what a step checkpoint is here (the state the next step resumes from): StepCheckpoint silences
# this one warning, and only where it saves
MANUAL_OPTIMIZATION_WARNING = "Using ModelCheckpoint with manual optimization and every_n_train"
# room kept free beyond the size of the newest checkpoint (a new one is about as large: the same
# weights and optimizer state) when deciding whether the disk can hold one more
HEADROOM = 1.05


class StepCheckpoint(ModelCheckpoint):
    """The newest ``keep`` step checkpoints, written every ``every_n_train_steps``, at the last
    step and where a signal stops the run, so that no finished step is lost.

    Args:
        dirpath: the run's checkpoint folder.
        every_n_train_steps: the interval in training steps (batches of rollouts).
        keep: how many step checkpoints to keep (the newest).
        stop: the run's signal handler; it decides at each step's end whether the run stops.
    """

    def __init__(
        self, dirpath: str | Path, every_n_train_steps: int, keep: int, stop: StopOnSignal
    ) -> None:
        super().__init__(
            dirpath=dirpath,
            filename="step-{step}",
            monitor="step",
            mode="max",
            # every save is kept by Lightning: the newest `keep` on disk are kept by _prune
            save_top_k=-1,
            save_last="link",
            every_n_train_steps=every_n_train_steps,
            auto_insert_metric_name=False,
            # a step re-saved after a fall back replaces the bad file, not step-N-v1.ckpt
            enable_version_counter=False,
        )
        self.keep = keep
        self.stop = stop

    def _own_steps(self, but: str | None = None) -> list[Path]:
        """This run's step checkpoints on disk, oldest first (less ``but``)."""
        found = [p for p in step_checkpoints(self.dirpath) if str(p) != str(but)]
        return sorted(found, key=lambda p: int(STEP.match(p.name)[1]))

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        if not STEP.match(Path(filepath).name):
            super()._save_checkpoint(trainer, filepath)
            return
        older = self._own_steps(but=filepath)
        # the ones that go once this one is written: all but the newest keep - 1
        doomed = older[: max(0, len(older) - (self.keep - 1))]
        short = bool(doomed) and _too_full(Path(self.dirpath), older[-1])
        if trainer.strategy.broadcast(short):  # every rank removes or keeps the same files
            log.warning(
                "the disk of %s cannot hold another checkpoint beside %d: removing %s "
                "(beyond keep_checkpoints=%d) before writing %s",
                self.dirpath,
                len(older),
                ", ".join(p.name for p in doomed),
                self.keep,
                Path(filepath).name,
            )
            for path in doomed:
                self._remove_checkpoint(trainer, str(path))
        super()._save_checkpoint(trainer, filepath)
        self._prune(trainer)

    def _prune(self, trainer: L.Trainer) -> None:
        """Remove every step checkpoint on disk but the newest ``keep``; what is kept is what
        the next checkpoint's state records."""
        kept = self._own_steps()
        for path in kept[: max(0, len(kept) - self.keep)]:
            self._remove_checkpoint(trainer, str(path))
        kept = kept[-self.keep :]
        self.best_k_models = {str(p): torch.tensor(float(STEP.match(p.name)[1])) for p in kept}
        if kept:
            self.kth_best_model_path = str(kept[0])
            self.kth_value = self.best_k_models[self.kth_best_model_path]

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", MANUAL_OPTIMIZATION_WARNING, UserWarning)
            super().on_train_batch_end(trainer, *args, **kwargs)
        # StopOnSignal is an ordinary callback, so Lightning ran it before this one
        last = 0 < trainer.max_steps <= trainer.global_step
        if (self.stop.stopping or last) and self._last_global_step_saved != trainer.global_step:
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)


def _too_full(folder: Path, newest: Path) -> bool:
    """Whether the disk of ``folder`` lacks the room for one more checkpoint the size of
    ``newest`` (a file, or a sharded checkpoint's folder)."""
    files = [newest] if newest.is_file() else [p for p in newest.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    return shutil.disk_usage(folder).free < size * HEADROOM
