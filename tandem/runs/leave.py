"""Leaving a command without the interpreter's last garbage collections.

When a process ends, Python stops its executors, waits for its threads, runs the ``atexit``
callbacks (Aim closes its runs there, ``logging`` flushes its files), flushes the standard
streams, and then tears its modules down, which runs full garbage collections over every object
the imports made: with torch, transformers and Lightning loaded, that took 5 to 7 s after the
last line on a busy 2-core machine, time in which nothing is written. ``leave`` does the first
four as the interpreter would and skips the teardown (``os._exit``): nothing that would have
reached a file, a stream or another process is lost, only the freeing of memory that ending the
process frees.

What this file leaves out: what the commands print before (``tandem.train``, ``tandem.evaluate``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
from typing import NoReturn


def leave(code: int | str | None) -> NoReturn:
    """End the process with ``code`` (``SystemExit``'s: None is 0, a string is printed and
    means 1) once threads, ``atexit`` callbacks and streams are done."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    # as the interpreter does first: the callbacks threading keeps for this moment (executors'
    # managers, joblib's loky workers of a Hydra sweep, stop there), then every non-daemon thread
    # joined; joining the threads alone waited for ever on a sweep's idle workers
    threading._shutdown()
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        # closed, or a reader that went away
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    os._exit(code or 0)
