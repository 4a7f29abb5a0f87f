"""One run per folder: a held folder refuses a second start, a dead holder's folder is taken."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.runs import RunRefused
from tandem.runs.lock import OWNER, RunLock, discard_unused, read_owner
from tests.refusal import train_cli

HOLD = """
import sys, time
from tandem.runs.lock import RunLock
with RunLock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_held_folder_refuses_a_second_lock_naming_the_holder(tmp_path: Path) -> None:
    with RunLock(tmp_path, "run_name=a"):
        owner = read_owner(tmp_path)
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
        with pytest.raises(RunRefused) as err:
            RunLock(tmp_path, "run_name=a").acquire()
        msg = str(err.value)
        assert f"PID {os.getpid()}" in msg and socket.gethostname() in msg
        assert owner["started"] in msg and "run_name=a" in msg
    assert read_owner(tmp_path) is None, "a clean exit leaves no holder record"
    with RunLock(tmp_path):  # and the folder is free again
        pass


def test_a_dead_holders_folder_is_taken_over_with_a_warning(tmp_path: Path, caplog) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    record = {"pid": dead.pid, "host": socket.gethostname(), "started": "then", "create_time": 1}
    (tmp_path / OWNER).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING), RunLock(tmp_path):
        assert read_owner(tmp_path)["pid"] == os.getpid()
    assert f"PID {dead.pid}" in caplog.text and "taking it over" in caplog.text


def test_a_second_training_start_on_a_held_folder_exits_2_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.time()
        second, heavy = train_cli(f"hydra.run.dir={tmp_path}")
        seconds = time.time() - t0
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 2, second.stderr[-2000:]
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
    assert f"PID {holder.pid}" in lines[0] and socket.gethostname() in lines[0]
    # refused before anything was loaded or written: no model, no record of its own
    assert not (tmp_path / ".hydra").exists() and not (tmp_path / "starts").exists()
    assert heavy == [], f"refused only after importing {heavy}"
    assert seconds < 60, f"refused after {seconds:.0f} s"
    # the holder's folder is its own: the refused start removes nothing of it
    assert (tmp_path / "run.lock").exists()


def test_a_refused_start_removes_the_folder_it_left_holding_nothing(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "train.log").write_text("")
    with RunLock(fresh):
        pass  # leaves run.lock behind, as every released lock does
    assert discard_unused(fresh) and not fresh.exists()
    logged = tmp_path / "logged"
    logged.mkdir()
    (logged / "train.log").write_text("[INFO] resuming from step 5\n")
    assert not discard_unused(logged) and (logged / "train.log").exists()
    recorded = tmp_path / "recorded"
    (recorded / "starts").mkdir(parents=True)
    assert not discard_unused(recorded) and (recorded / "starts").is_dir()
    held = tmp_path / "held"
    with RunLock(held):
        (held / OWNER).unlink()  # only the OS lock says it is held
        assert not discard_unused(held) and (held / "run.lock").exists()
    assert not discard_unused(tmp_path / "absent")
