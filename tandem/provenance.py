"""Which source a result came from: the git commit of the code, recorded with every run.

What this file leaves out: everything else about a run (``tandem.runs.start`` saves its config).
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


def record_start(folder: str | Path, step: int = 0, **extra: Any) -> dict[str, Any]:
    """Append this start (commit, optimizer step it starts from, time, and ``extra``: the
    start's saved config and its changes, say) to ``<folder>/run_info.json``; a resumed run adds
    one entry per start, so a run resumed under other code or another config shows it. Returns
    the file's content."""
    path = Path(folder) / "run_info.json"
    info = json.loads(path.read_text()) if path.is_file() else {"starts": []}
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    info["starts"].append({"commit": source_commit(), "step": step, "time": now, **extra})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=2) + "\n")
    return info


def run_commits(folder: str | Path) -> list[tuple[str, int]]:
    """``(commit, from step)`` of each start of a run; a first start after step 0 means the
    steps before it ran under code that recorded nothing. Empty when the run recorded none."""
    path = Path(folder) / "run_info.json"
    if not path.is_file():
        return []
    return [(s["commit"], s.get("step", 0)) for s in json.loads(path.read_text())["starts"]]


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
