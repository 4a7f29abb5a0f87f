"""One live process per run folder: an exclusive lock held for the whole life of a run.

The lock is an OS file lock (``filelock``) on ``<run>/run.lock``, so the kernel releases it when
its process dies, however it dies. Beside it, ``run.lock.json`` names the holder (PID, host,
start time) for the message a second start gets. That file outlives a killed holder: finding it
when the lock is free means the last run was killed, and the new one takes over with a warning.

Only the launching process locks (``is_launcher``), not the ranks a distributed strategy starts.
A start that is refused removes the run folder it leaves holding nothing (``discard_unused``).
This file imports no model library, so that a held folder is refused before any loads.

What this file leaves out: what a start does once it holds the folder (``tandem.runs.start``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import psutil
from filelock import FileLock, Timeout
from omegaconf import DictConfig

from tandem.runs import RunRefused

log = logging.getLogger(__name__)

LOCK = "run.lock"
OWNER = "run.lock.json"
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


def is_launcher() -> bool:
    """True in the process that starts a run; False in the other ranks of a distributed run
    (Lightning, torchrun and SLURM give those a non-zero rank in the environment)."""
    return all(int(os.environ.get(v, "0") or 0) == 0 for v in RANK_VARIABLES)


@contextmanager
def hold_folder(cfg: DictConfig) -> Iterator[None]:
    """Hold the run folder's lock (launching process only) for the ``with`` block."""
    label = f"run_name={cfg.run_name}"
    lock = RunLock(cfg.output_dir, label) if is_launcher() else nullcontext()
    with lock:
        yield


def discard_unused(folder: str | Path) -> bool:
    """Remove ``folder`` if it holds nothing of a run, as a refused start leaves it: no record,
    no checkpoint, no log line; only empty ``*.log`` files (Hydra opens ``train.log`` before
    the run starts) and the lock file. A sweep's folder left holding only Hydra's
    ``multirun.yaml`` goes with it. Returns whether ``folder`` was removed.

    A folder another process holds, or one with anything else in it, is left as it is.
    """
    folder = Path(folder)
    try:
        entries = list(folder.iterdir())
        unused = all(
            e.name == LOCK or (e.suffix == ".log" and e.is_file() and e.stat().st_size == 0)
            for e in entries
        )
    except OSError:
        return False
    if not unused or not is_launcher():
        return False
    lock = FileLock(folder / LOCK)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        return False  # a start that is taking the folder
    try:
        for entry in entries:
            if entry.name != LOCK:
                entry.unlink(missing_ok=True)
    finally:
        lock.release()
    try:
        (folder / LOCK).unlink(missing_ok=True)
        folder.rmdir()
    except OSError:
        return False
    # a sweep's folder that holds nothing but Hydra's record of it: no job of it ran
    sweep = folder.parent
    if [e.name for e in sweep.iterdir()] == ["multirun.yaml"]:
        (sweep / "multirun.yaml").unlink()
        sweep.rmdir()
    return True


class RunLock:
    """Exclusive hold on a run folder; a context manager.

    Args:
        folder: the run's folder (created if missing).
        label: how the user named the folder, for messages (``run_name=...``).
    """

    def __init__(self, folder: str | Path, label: str = "") -> None:
        self.folder = Path(folder)
        self.label = label or f"output_dir={folder}"
        self._lock: FileLock | None = None

    def acquire(self) -> None:
        """Take the folder, or raise ``RunRefused`` naming the live holder."""
        self.folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.folder / LOCK)
        try:
            lock.acquire(blocking=False)
        except Timeout:
            raise RunRefused(self._held_message()) from None
        previous = read_owner(self.folder)
        if previous and is_alive(previous):
            # only where the OS lock is not shared (some network file systems): trust the record
            lock.release()
            raise RunRefused(self._held_message())
        if previous:
            log.warning(
                "run folder %s was left by PID %s on %s (started %s), which no longer holds it: "
                "taking it over",
                self.folder,
                previous.get("pid"),
                previous.get("host"),
                previous.get("started"),
            )
        self._lock = lock
        _write_json(self.folder / OWNER, _me())

    def release(self) -> None:
        """Give the folder back (a no-op when not held)."""
        if self._lock is None:
            return
        (self.folder / OWNER).unlink(missing_ok=True)
        self._lock.release()
        self._lock = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _held_message(self) -> str:
        owner = read_owner(self.folder) or {}
        who = (
            f"PID {owner.get('pid')} on host {owner.get('host')} (started {owner.get('started')})"
            if owner
            else "a process that is starting"
        )
        return (
            f"{self.label}: the run folder {self.folder} is in use by {who}. One run per "
            f"folder: wait for that run to end (or stop it), or give this run another name."
        )


def read_owner(folder: str | Path) -> dict[str, Any] | None:
    """The holder record of a run folder, None when there is none (or it is unreadable)."""
    try:
        return json.loads((Path(folder) / OWNER).read_text())
    except (OSError, ValueError):
        return None


def _me() -> dict[str, Any]:
    proc = psutil.Process()
    return {
        "pid": proc.pid,
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        # with the PID, tells this process from a later one that reuses the PID
        "create_time": proc.create_time(),
    }


def is_alive(owner: dict[str, Any]) -> bool:
    """Whether the recorded holder still runs; another host's PID cannot be checked (False)."""
    if owner.get("host") != socket.gethostname() or owner.get("pid") == os.getpid():
        return False
    try:
        proc = psutil.Process(int(owner["pid"]))
        return abs(proc.create_time() - float(owner.get("create_time", 0))) < 1.0
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
