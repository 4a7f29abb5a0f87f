"""Which source a result came from: the git commit of the code, recorded with every run.

What this file leaves out: everything else about a run (Hydra writes its config).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def source_commit() -> str:
    """The short commit of the working tree, ``+dirty`` with uncommitted changes to tracked
    files; ``unknown`` outside a git checkout (an installed wheel, say)."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def record_start(folder: str | Path) -> dict[str, Any]:
    """Append this start (commit, time) to ``<folder>/run_info.json``; a resumed run adds one
    entry per start, so a run resumed under other code shows it. Returns the file's content."""
    path = Path(folder) / "run_info.json"
    info = json.loads(path.read_text()) if path.is_file() else {"starts": []}
    info["starts"].append({"commit": source_commit(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2) + "\n")
    return info


def run_commits(folder: str | Path) -> list[str]:
    """The commits a run was started (and resumed) under; empty when it recorded none."""
    path = Path(folder) / "run_info.json"
    if not path.is_file():
        return []
    return [start["commit"] for start in json.loads(path.read_text())["starts"]]


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
