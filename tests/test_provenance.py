"""Every training start records the commit of the code it ran under."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tandem.provenance import record_start, run_commits, source_commit


def test_source_commit_is_this_checkouts_head() -> None:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent,
    ).stdout.strip()
    assert source_commit().split("+")[0] == head


def test_each_start_is_appended(tmp_path: Path) -> None:
    assert run_commits(tmp_path) == []
    record_start(tmp_path)
    record_start(tmp_path, step=30)  # a resume
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert len(info["starts"]) == 2 and all(s["time"] for s in info["starts"])
    assert run_commits(tmp_path) == [(source_commit(), 0), (source_commit(), 30)]
