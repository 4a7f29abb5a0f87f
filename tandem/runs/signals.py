"""SIGTERM and SIGINT stop a training run at the next step boundary, after a checkpoint.

The first signal only raises a flag; at the end of the step under way the ranks agree on it,
the step's checkpoint is saved (``StepCheckpoint``) and the trainer stops, and ``tandem.train``
exits with status 128 + the signal (143 for SIGTERM, 130 for SIGINT), as a shell reports a
process a signal ended. A second signal ends the process at once (a checkpoint being written
then is left as a temporary file, which the next start removes).

Lightning's own SIGTERM handling stops without saving and exits 0, and a SIGINT there raises
``KeyboardInterrupt`` wherever the code happens to be; this callback replaces both for the
training loop, and Lightning restores the handlers from before ``fit`` when it ends.

What this file leaves out: the checkpoint it asks for (``tandem.runs.checkpoints``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any, TextIO

import lightning as L

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopOnSignal(L.Callback):
    """Turn SIGTERM / SIGINT into a stop at the next step boundary; a second signal kills."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the first signal this process received
        self.stopping = False  # the ranks agreed to stop at this step's end

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # here, after Lightning installed its handlers in fit (it restores the earlier ones)
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                signal.signal(signum, self._handle)
        # before the progress bar opens its stream: a reader that went away (Ctrl-C under
        # `| tee log` ends tee too) must not stop the checkpoint the signal asked for
        sys.stdout, sys.stderr = Unbroken.wrap(sys.stdout), Unbroken.wrap(sys.stderr)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        # a collective: every rank stops at the same step even if only one was signalled
        if trainer.strategy.reduce_boolean_decision(self.signum is not None, all=False):
            self.stopping = True
            trainer.should_stop = True
            # Lightning validates on a requested stop (for early stopping), which would cost a
            # whole validation pass and write a best-*.ckpt: a stop saves its step, nothing more
            trainer.limit_val_batches = 0
            log.warning(
                "stopping at step %d on %s: saving a checkpoint",
                trainer.global_step,
                signal.Signals(self.signum or signal.SIGTERM).name,
            )

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            # the second signal: no more waiting (the default action ends the process)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        log.warning(
            "%s: finishing this step and saving a checkpoint; send it again to stop at once",
            signal.Signals(signum).name,
        )

    @property
    def exit_code(self) -> int:
        """128 + the signal that stopped the run (SIGTERM where another rank was signalled)."""
        return 128 + int(self.signum or signal.SIGTERM)


class Unbroken:
    """A text stream whose writes stop, silently, once its reader has gone (a broken pipe):
    what would have been shown is lost, the run goes on."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.broken = False

    @classmethod
    def wrap(cls, stream: TextIO) -> TextIO:
        return stream if isinstance(stream, cls) or stream is None else cls(stream)

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except (BrokenPipeError, ValueError):  # ValueError: the stream was closed
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except (BrokenPipeError, ValueError):
                self.broken = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
