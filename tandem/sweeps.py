"""Hydra callbacks for sweeps.

``InitAimRepo`` creates the sweep's Aim repository once, before any job starts: jobs that run
side by side (``hydra/launcher=joblib``) would otherwise race to create it, and the loser fails
with "Trying to open repository .aim, which is out of date".

``ForwardStop`` passes a SIGTERM sent to the sweep's own process on to the jobs running under it.
A terminal's Ctrl-C reaches every process of the group, but ``kill <pid>`` (or a scheduler's
stop) reaches only the parent, and joblib's workers would go on training, and writing into the
sweep's folders, after the sweep looked stopped. Forwarded, each job stops at its next step
boundary after a checkpoint (``tandem.runs``), so the same command resumes every run exactly.

What this file leaves out: the loggers themselves (``conf/logger``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


class InitAimRepo(Callback):
    """Create every Aim repository the config's loggers name, once per multirun."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        for repo in aim_repos(config):
            from aim import Repo  # imported here: Aim starts slowly and is optional

            Repo.from_path(str(repo), init=True)
            log.info("Aim repository %s ready for the sweep", repo)


class ForwardStop(Callback):
    """On SIGTERM to the sweep's process: the same signal to each job process under it, a wait
    until every run under the sweep's folder has let go of its folder's lock (it stopped after
    a checkpoint), one line, and exit status 143. A second SIGTERM kills the jobs at once (they
    resume from their last checkpoint)."""

    def __init__(self, wait_s: float = 600.0) -> None:
        self.wait_s, self.stopping, self.sweep_dir = wait_s, False, None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.sweep_dir = OmegaConf.select(config, "hydra.sweep.dir", default=None)
        signal.signal(signal.SIGTERM, self._stop)

    def _stop(self, signum: int, frame: Any) -> None:
        import psutil

        if self.stopping:  # asked twice: stop now
            for job in psutil.Process().children():
                job.kill()
            os._exit(128 + signum)
        self.stopping = True
        print(
            "tandem: stopping the sweep: each running job stops after its next checkpoint (send "
            "SIGTERM again to kill them now); run the same command to resume every run where "
            "it stopped.",
            file=sys.stderr,
            flush=True,
        )
        signalled: set[int] = set()
        deadline = time.monotonic() + self.wait_s
        while True:
            # a worker freed by a stopped run may be handed the next job: it is told to stop too
            for job in psutil.Process().children():
                if job.pid not in signalled:
                    signalled.add(job.pid)
                    with contextlib.suppress(psutil.NoSuchProcess):
                        job.send_signal(signum)
            if not self._runs_held() or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for job in psutil.Process().children():  # idle workers, the runs stopped
            with contextlib.suppress(psutil.NoSuchProcess):
                job.kill()
        os._exit(128 + signum)

    def _runs_held(self) -> bool:
        """Whether a run under the sweep's folder still holds its folder's lock."""
        from filelock import FileLock, Timeout

        from tandem.runs.lock import LOCK

        if not self.sweep_dir:
            return False
        for path in Path(self.sweep_dir).glob(f"*/{LOCK}"):
            lock = FileLock(str(path))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                return True
            lock.release()
        return False


def aim_repos(config: DictConfig) -> list[Path]:
    """The ``repo`` of every Aim logger in ``config.logger``."""
    loggers = OmegaConf.select(config, "logger", default=None) or []
    repos = []
    for spec in loggers:
        if "aim" in str(spec.get("_target_", "")).lower():
            repos.append(Path(spec.get("repo") or ".aim"))
    return repos
