"""A pool of verifier processes with a hard deadline per item.

Each worker verifies one item at a time. An item that is not answered ``timeout`` seconds after
it was sent gets the verdict ``timeout``, and its worker is killed and replaced; the other workers
go on. Nothing here uses signals (``SIGALRM`` only works in the main thread and cannot interrupt
C code holding the GIL): the deadline is the parent's clock and the cure is ``kill``.

Processes come from the ``forkserver`` context (``spawn`` where there is none): never ``fork``,
which copies a parent that may hold torch's threads and locks. The fork server preloads the
verifier, so a replacement worker starts in milliseconds rather than re-importing sympy. Workers
are started with the parent's ``__main__`` hidden, so they do not re-import the training script
(and torch with it) the way spawn/forkserver children otherwise do, and an entry point without
``if __name__ == "__main__"`` cannot make them recurse.
Workers are daemons, exit when the parent dies, and are shut down at interpreter exit. ``run``
may be called from any thread; calls are serialised.

What this file leaves out: what verifying means (``verify``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import sys
import threading
import time
import types
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from tandem.rewards.verify import TIMEOUT, Verdict, serve

_PRELOAD = ["tandem.rewards.verify"]


@dataclass
class _Worker:
    process: Any  # multiprocessing.Process of the chosen context
    conn: Connection
    started: float
    ready: bool = False
    task: int | None = None
    deadline: float = 0.0
    # consecutive starts of this slot that died before becoming ready
    failed_starts: int = 0


class VerifierPool:
    """Worker processes that verify ``(content, gold)`` pairs under a per-item deadline.

    Args:
        workers: number of processes.
        timeout: seconds each item may take once a worker has it.
        rel_tol: relative tolerance for decimal answers, passed to the workers.
        start_method: ``"forkserver"`` or ``"spawn"``; default ``forkserver`` where available.
        startup_timeout: seconds a new worker may take to import before the pool gives up.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout: float = 2.0,
        rel_tol: float = 1e-9,
        start_method: str | None = None,
        startup_timeout: float = 120.0,
    ) -> None:
        methods = multiprocessing.get_all_start_methods()
        method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
        if method not in ("forkserver", "spawn") or method not in methods:
            raise ValueError(
                f"start_method {method!r} is not usable here: the verifier pool needs "
                f"'forkserver' or 'spawn' (available: {methods}); 'fork' is unsafe next to "
                "torch's threads."
            )
        self._ctx = multiprocessing.get_context(method)
        if method == "forkserver":
            self._ctx.set_forkserver_preload(_PRELOAD)  # no effect once the server is running
        self.size, self.timeout, self.rel_tol = workers, timeout, rel_tol
        self.startup_timeout = startup_timeout
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        # Runs at garbage collection or at interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)

    def run(self, items: Sequence[tuple[str, str]]) -> list[Verdict]:
        """Verify ``(content, gold)`` pairs in parallel; verdicts come back in input order."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this VerifierPool is closed; create a new one.")
            while len(self._workers) < self.size:
                self._workers.append(self._start())
            results: list[Verdict | None] = [None] * len(items)
            queue = deque(range(len(items)))
            try:
                while queue or any(w.task is not None for w in self._workers):
                    self._dispatch(queue, items)
                    self._collect(results)
                    self._expire(results)
            finally:
                for i, w in enumerate(self._workers):  # an interrupted batch leaves no stale work
                    if w.task is not None:
                        self._workers[i] = self._replace(w)
            return [r if r is not None else TIMEOUT for r in results]

    def pids(self) -> list[int]:
        """Process ids of the current workers (for monitoring, and for tests that kill one)."""
        with self._lock:
            return [w.process.pid for w in self._workers if w.process.pid is not None]

    def close(self) -> None:
        """Stop the workers. Safe to call twice and from any thread."""
        with self._lock:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scheduling -----------------------------------------------------------------------
    def _dispatch(self, queue: deque[int], items: Sequence[tuple[str, str]]) -> None:
        for i, w in enumerate(self._workers):
            if not queue:
                return
            if w.ready and w.task is None:
                index = queue.popleft()
                content, gold = items[index]
                try:
                    w.conn.send((index, content, gold))
                except (OSError, ValueError):  # the worker died while idle
                    queue.appendleft(index)
                    self._workers[i] = self._replace(w)
                    continue
                w.task, w.deadline = index, time.monotonic() + self.timeout

    def _collect(self, results: list[Verdict | None]) -> None:
        busy = [w.deadline for w in self._workers if w.task is not None]
        wait_s = max(0.0, min(busy) - time.monotonic()) if busy else 0.05
        by_conn = {
            w.conn: i for i, w in enumerate(self._workers) if w.task is not None or not w.ready
        }
        for conn in wait(list(by_conn), timeout=wait_s):
            i = by_conn[conn]
            w = self._workers[i]
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the worker died (out of memory, a crash)
                if w.task is not None:
                    results[w.task] = TIMEOUT
                    w.task = None
                self._workers[i] = self._replace(w, failed_start=not w.ready)
                continue
            if message == "ready":
                w.ready = True
            else:
                index, verdict = message
                results[index] = Verdict(*verdict)
                w.task = None

    def _expire(self, results: list[Verdict | None]) -> None:
        now = time.monotonic()
        for i, w in enumerate(self._workers):
            if w.task is not None and now >= w.deadline:
                results[w.task] = TIMEOUT
                w.task = None
                self._workers[i] = self._replace(w)
            elif not w.ready and now - w.started > self.startup_timeout:
                raise RuntimeError(
                    f"a reward worker did not start within {self.startup_timeout:.0f} s. "
                    "Check that `python -c 'import tandem.rewards.verify'` works and that "
                    "the entry script is guarded by `if __name__ == '__main__'`."
                )

    # -- processes ------------------------------------------------------------------------
    def _start(self) -> _Worker:
        parent_end, child_end = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=serve, args=(child_end, self.rel_tol), name="tandem-reward", daemon=True
        )
        with _clean_start(self._ctx.get_start_method()):
            process.start()
        child_end.close()  # the parent's copy; EOF on parent_end then means the worker died
        return _Worker(process, parent_end, started=time.monotonic())

    def _replace(self, worker: _Worker, failed_start: bool = False) -> _Worker:
        failures = worker.failed_starts + 1 if failed_start else 0
        if failed_start:
            worker.process.join(timeout=1.0)
            code = worker.process.exitcode
            # a worker killed from outside (a signal: negative code) while importing is
            # replaced like any other; one that exits by itself, or dies at every start, has a
            # problem a new worker would only repeat
            if code is None or code >= 0 or failures >= MAX_FAILED_STARTS:
                raise RuntimeError(
                    f"a reward worker exited while starting (exit code {code}, start "
                    f"{failures} in a row). Run `python -c 'import tandem.rewards.verify'` to "
                    "see the import error."
                )
        _stop(worker, graceful=False)
        new = self._start()
        new.failed_starts = failures
        return new


_START_LOCK = threading.Lock()
# a slot whose worker is killed this many times in a row before it is ready gives up
MAX_FAILED_STARTS = 3


@contextlib.contextmanager
def _clean_start(method: str) -> Iterator[None]:
    """Let a child start without importing the parent's ``__main__``, under ``method``.

    spawn/forkserver children import the module that ``sys.modules["__main__"]`` names when the
    child is launched (``multiprocessing.spawn.get_preparation_data``). A worker needs nothing
    from it: its target lives in ``tandem.rewards.verify``. An empty stand-in for the instant of
    ``start()`` spares each worker the training script's imports (seconds and hundreds of MB)
    and its side effects.

    The child also re-applies the parent's default start method before anything else. Inside a
    joblib (loky) worker, as in a Hydra sweep's jobs, that default is ``loky``, which a
    forkserver child does not know: it would die at birth. So the default is the pool's own
    method for that instant too.
    """
    with _START_LOCK:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        default = multiprocessing.get_start_method(allow_none=True)
        if default not in (None, method):
            multiprocessing.set_start_method(method, force=True)
        try:
            yield
        finally:
            if default not in (None, method):
                multiprocessing.set_start_method(default, force=True)
            if main is not None:
                sys.modules["__main__"] = main


def _stop(worker: _Worker, graceful: bool) -> None:
    if graceful and worker.process.is_alive():
        with contextlib.suppress(OSError, ValueError):
            worker.conn.send(None)
        worker.process.join(timeout=0.5)
    if worker.process.is_alive():
        worker.process.kill()
        worker.process.join(timeout=5.0)
    worker.conn.close()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        _stop(w, graceful=w.task is None)
    workers.clear()
