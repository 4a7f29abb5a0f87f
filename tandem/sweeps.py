"""Hydra callbacks for sweeps.

``InitAimRepo`` creates the sweep's Aim repository once, before any job starts: jobs that run
side by side (``hydra/launcher=joblib``) would otherwise race to create it, and the loser fails
with "Trying to open repository .aim, which is out of date".

What this file leaves out: the loggers themselves (``conf/logger``).
"""

from __future__ import annotations

import logging
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


def aim_repos(config: DictConfig) -> list[Path]:
    """The ``repo`` of every Aim logger in ``config.logger``."""
    loggers = OmegaConf.select(config, "logger", default=None) or []
    repos = []
    for spec in loggers:
        if "aim" in str(spec.get("_target_", "")).lower():
            repos.append(Path(spec.get("repo") or ".aim"))
    return repos
