"""The flag a stop signal raises, and the one call that reads it inside a training step.

A signal handler may not do the stopping itself (it runs between two bytecodes of whatever the
process is doing); it only calls ``request``. The long loops then call ``stop_point`` at every
place where stopping costs nothing but the step under way: between the torch engine's decode
steps (``tandem.engine.loop``, ``tandem.engine.cross_loop``), between the micro-batches of an
update (``tandem.modules.update``) and between validation batches (``StopOnSignal``). Once the
flag is up it raises ``StopNow``, which unwinds the step: nothing of it is saved, the newest
checkpoint stays as it is, and ``tandem.train`` exits with 128 + the signal.

A stop point reads one module global: no system call, no lock, so a decode step pays nothing
measurable for it. The handlers are here too (``catching``), so that a run holds the signals
from its first import of a model library to its end; this file imports only the standard
library, so the engine can call it without Lightning. A second signal ends the process at once.

What this file leaves out: how a trainer's hooks keep the handlers (Lightning sets its own for
SIGTERM at each trainer call) and the stop at a step's end (``tandem.runs.signals``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# the first stop signal this process received, or None
_signum: int | None = None
# what passes a SIGTERM on to the ranks a launcher started (``forward_to``)
_launcher: Any = None


class StopNow(BaseException):
    """Raised at a stop point once a signal asked the run to stop; unwinds the step under way.

    A ``BaseException``, like ``KeyboardInterrupt``: no ``except Exception`` on its way out
    swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


def request(signum: int) -> None:
    """Raise the flag (from a signal handler): the next stop point raises ``StopNow``."""
    global _signum
    if _signum is None:
        _signum = signum


def requested() -> int | None:
    """The signal that asked the run to stop, or None."""
    return _signum


def clear() -> None:
    """Lower the flag (a new run in the same process: a sweep's next job, a test)."""
    global _signum
    _signum = None


def stop_point() -> None:
    """Raise ``StopNow`` if a signal asked the run to stop; otherwise nothing."""
    if _signum is not None:
        raise StopNow(_signum)


def forward_to(launcher: Any) -> None:
    """Pass a SIGTERM on to the processes ``launcher`` started (its ``kill(signum)``), as
    Lightning's own handler does; a Ctrl-C reaches them from the terminal already."""
    global _launcher
    _launcher = launcher


def install() -> None:
    """Take SIGTERM and SIGINT now (from the main thread; Python sets handlers nowhere else)."""
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, _handle)


@contextmanager
def catching() -> Iterator[None]:
    """Hold SIGTERM and SIGINT for the ``with`` block, the flag lowered at its start; then give
    them back to the handlers from before it."""
    clear()
    forward_to(None)
    main = threading.current_thread() is threading.main_thread()
    before = {s: signal.getsignal(s) for s in SIGNALS} if main else {}
    install()
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _handle(signum: int, frame: FrameType | None) -> None:
    if _signum is not None:
        # the second signal: no more waiting (the default action ends the process)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    request(signum)
    if signum == signal.SIGTERM and _launcher is not None:
        _launcher.kill(signum)
    log.warning(
        "%s: stopping within the step under way, which is not saved; send it again to stop at once",
        signal.Signals(signum).name,
    )
