"""SIGTERM / SIGINT stop training at a step boundary after a checkpoint; a second one at once."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tandem.runs.checkpoints import newest_verified, step_checkpoints
from tests.modules.test_train import cli, metrics_rows

ROOT = Path(__file__).resolve().parents[2]
LONG = ["validation.every_n_steps=1000", "threads=1", "trainer.max_steps=500"]


def launch(out: Path, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TANDEM_FAULT", None)
    return subprocess.Popen(
        cli(out, *LONG, *overrides),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for_step(out: Path, step: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if any(p.name == f"step-{step}.ckpt" for p in step_checkpoints(out / "checkpoints")):
            return
        time.sleep(0.1)
    raise AssertionError(f"step {step} never saved: {proc.communicate()[1][-2000:]}")


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)]
)
def test_a_signal_stops_at_the_step_boundary_after_a_checkpoint(tmp_path: Path, signum) -> None:
    # checkpoints every 2 steps; the stop must save its own step whatever the interval
    proc = launch(tmp_path, "checkpoint_every_n_steps=2")
    wait_for_step(tmp_path, 2, proc)
    sent = time.time()
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    seconds = time.time() - sent
    assert proc.returncode == 128 + signum, stderr[-2000:]
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("tandem.train: stopped by a signal at step")
    newest = newest_verified(tmp_path / "checkpoints")
    stopped_at = int(stderr.rsplit("at step ", 1)[1].split(",")[0])
    assert newest.name == f"step-{stopped_at}.ckpt" and stopped_at >= 2
    assert not (tmp_path / "senior").exists(), "a stopped run is not finished: no export"
    # nothing it was not asked for: no validation pass (the base's came before the first
    # step), no best checkpoint
    assert not list((tmp_path / "checkpoints").glob("best-*.ckpt"))
    validated = [int(r["step"]) for r in metrics_rows(tmp_path) if r.get("val/tandem/accuracy")]
    assert validated == [0], validated
    # a step takes well under a second or two here; allow for a busy machine
    assert seconds < 30, f"stopped {seconds:.0f} s after the signal"


def test_a_reader_gone_from_the_pipe_does_not_stop_the_checkpoint(tmp_path: Path) -> None:
    # `python -m tandem.train | tee log`, then Ctrl-C: tee ends too, and the run writes its
    # progress bar, warnings and last line into a pipe with no reader
    proc = launch(tmp_path, "checkpoint_every_n_steps=1000", "trainer.enable_progress_bar=true")
    deadline = time.time() + 300
    while time.time() < deadline and not list((tmp_path / "csv").glob("version_*/metrics.csv")):
        time.sleep(0.1)
    time.sleep(2)  # a step or more under way
    proc.stdout.close()
    proc.stderr.close()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    assert proc.returncode == 130
    newest = newest_verified(tmp_path / "checkpoints")
    assert newest is not None and newest.name.startswith("step-")


@pytest.mark.slow
def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    proc = launch(tmp_path, "checkpoint_every_n_steps=1", "generation.max_new_tokens=160")
    wait_for_step(tmp_path, 1, proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, "ended by the signal itself, not a clean stop"
