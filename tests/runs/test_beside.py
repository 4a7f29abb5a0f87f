"""A fresh start beside a run that was stopped before it finished says so, with the command that
resumes that run (rerunning the first command starts a new run: its name is the time)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from omegaconf import OmegaConf

from tandem.runs.start import interrupted_beside
from tandem.train import say_interrupted_beside


def stopped_run(folder: Path, *steps: int, exported: bool = False) -> Path:
    (folder / "starts").mkdir(parents=True)
    (folder / "starts" / "start-1.yaml").write_text("seed: 0\n")
    (folder / "checkpoints").mkdir()
    for step in steps:
        (folder / "checkpoints" / f"step-{step}.ckpt").write_bytes(b"x")
    if exported:
        (folder / "senior").mkdir()
    return folder


def test_the_newest_stopped_run_beside_is_found(tmp_path: Path) -> None:
    stopped_run(tmp_path / "finished", 5, exported=True)
    old = stopped_run(tmp_path / "old", 5)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    stopped_run(tmp_path / "stopped", 5, 10)
    stopped_run(tmp_path / "stopped_at_its_start")  # newer, but nothing to resume from
    (tmp_path / "new").mkdir()
    assert interrupted_beside(tmp_path / "new") == ("stopped", 10)
    assert interrupted_beside(tmp_path / "finished") == ("stopped", 10)


def test_a_fresh_start_prints_the_resume_command_of_the_run_beside(tmp_path, caplog) -> None:
    stopped_run(tmp_path / "tandem_1", 20)
    cfg = OmegaConf.create({"output_dir": str(tmp_path / "tandem_2"), "run_name": "tandem_2"})
    with caplog.at_level(logging.WARNING):
        say_interrupted_beside(cfg)
    assert "this is a new run" in caplog.text and "its newest checkpoint is step 20)" in caplog.text
    assert "python -m tandem.train run_name=tandem_1 ckpt_path=last" in caplog.text


def test_nothing_is_said_beside_finished_runs(tmp_path, caplog) -> None:
    stopped_run(tmp_path / "done", 60, exported=True)
    cfg = OmegaConf.create({"output_dir": str(tmp_path / "next"), "run_name": "next"})
    with caplog.at_level(logging.WARNING):
        say_interrupted_beside(cfg)
    assert caplog.text == ""
