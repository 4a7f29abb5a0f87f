"""Keeping a run's folder trustworthy across starts, kills and signals.

``lock``: one live process per run folder. ``resume``: what a restart may change.
``checkpoints``: atomic, checksummed checkpoints and the newest one that verifies.
``signals``: SIGTERM / SIGINT stop at a step boundary after a checkpoint. ``faults``: the
test-only hook that kills a run at a named point.

What this package leaves out: building and fitting the run (``tandem.train``) and the senior's
export (``tandem.modules.export``).
"""

from __future__ import annotations


class RunStopped(Exception):
    """A start that ends without finishing, for a reason the user can act on.

    The entry points print the message as one line (no traceback) and exit with ``exit_code``.
    """

    exit_code = 2


class RunRefused(RunStopped):
    """This start is refused (exit 2): a held folder, a change that breaks a resume, ..."""


class DiskFull(RunStopped):
    """A write of the run ran out of disk space (exit 1); what was written before is intact."""

    exit_code = 1


class RunInterrupted(RunStopped):
    """A signal stopped the run after its checkpoint was saved (exit 128 + the signal)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum
