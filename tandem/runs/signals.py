"""SIGTERM and SIGINT stop a training run within seconds, in any phase, and leave it resumable.

The first signal raises the flag of ``tandem.runs.stop``. Inside a step (the rollout's decode
steps, the update's micro-batches, a validation's batches, the base's validation before the
first step included) the next stop point unwinds the step under way: its work is discarded, the
newest step checkpoint stays as it is, and ``tandem.train`` exits with 128 + the signal (143 for
SIGTERM, 130 for SIGINT), naming the checkpoint a resume starts from and printing the command.
A flag that comes up after a step's last stop point is honoured at the step's end instead: the
ranks agree on it, the step's checkpoint is saved (``StepCheckpoint``) and the trainer stops.
A second signal ends the process at once (a checkpoint being written then is left as a temporary
file, which the next start removes).

Lightning's own SIGTERM handling stops without saving and exits 0 (a scheduler would record
success), and a SIGINT there raises ``KeyboardInterrupt`` wherever the code happens to be and
exits 1; this callback's handlers replace both from before the first trainer call to the end of
the run. Like Lightning's, a SIGTERM is passed on to the ranks a launcher started.

What this file leaves out: the flag itself (``tandem.runs.stop``) and the checkpoint a stop at a
step's end asks for (``tandem.runs.steps``).
"""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any, TextIO

import lightning as L

from tandem.runs import stop
from tandem.runs.stop import stop_point

log = logging.getLogger(__name__)


class StopOnSignal(L.Callback):
    """Keep SIGTERM / SIGINT on ``tandem.runs.stop``'s handlers through every trainer call,
    stop at the stop points of validation, and at a step's end, after its checkpoint, where the
    flag came up after the step's last stop point."""

    def __init__(self) -> None:
        self.stopping = False  # the ranks agreed to stop at this step's end
        self.where = "the start, before the first step"  # what a stop would interrupt

    @property
    def signum(self) -> int | None:
        """The first signal this process received, or None."""
        return stop.requested()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        stop.forward_to(trainer.strategy.launcher)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        stop.install()  # after the trainer put its own SIGTERM handler in
        if trainer.state.fn == "validate" and trainer.global_step == 0:
            self.where = "the validation of the starting model, before the first step"
        else:
            self.where = f"the validation at step {trainer.global_step}"

    def on_validation_batch_start(self, *args: Any, **kwargs: Any) -> None:
        stop_point()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        stop.install()  # after the trainer put its own SIGTERM handler in
        # before the progress bar opens its stream: a reader that went away (Ctrl-C under
        # `| tee log` ends tee too) must not stop the checkpoint the signal asked for
        sys.stdout, sys.stderr = Unbroken.wrap(sys.stdout), Unbroken.wrap(sys.stderr)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        self.where = f"step {trainer.global_step + 1}"
        stop_point()

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
        """``stream`` wrapped, unless it is a terminal (whose reader cannot go away while the
        run writes; the progress bar and the lines written above it must share one stream)."""
        if stream is None or isinstance(stream, cls) or stream.isatty():
            return stream
        return cls(stream)

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
