"""SIGTERM / SIGINT stop training within seconds in every phase (a rollout, an update, the base's
validation before the first step, a validation during training), leave the newest checkpoint
intact and exit with 128 + the signal and the resume command; a resume then ends on the straight
run's senior. A flag that comes up after a step's last stop point saves that step instead; a
second signal stops at once.

The in-process tests send the signal from a stop point of the phase (after its own check, so that
the next one is what stops), so that each phase is hit for certain; the command-line ones send it
from outside, as a user or a scheduler does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

import tandem.engine.loop
import tandem.modules.update
import tandem.runs.signals
from tandem.modules.grpo import TandemGRPO
from tandem.runs import RunInterrupted
from tandem.runs.checkpoints import newest_verified, step_checkpoints
from tandem.train import run
from tests.modules.test_train import cli, config, metrics_rows, senior_weights

ROOT = Path(__file__).resolve().parents[2]
LONG = ["validation.every_n_steps=1000", "threads=1", "trainer.max_steps=500"]
# no validation: every stop point of the engine is a training rollout's
QUIET = ["validation.every_n_steps=1000", "validation.at_start_and_end=false"]


def signal_at(monkeypatch, module, call: int, signum: int) -> list[float]:
    """Make the ``call``-th stop point of ``module`` send this process ``signum`` once its own
    check has passed; returns a list that receives the time it was sent."""
    real, count, sent = module.stop_point, [0], []

    def point() -> None:
        real()
        count[0] += 1
        if count[0] == call:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(module, "stop_point", point)
    return sent


def stopped(out: Path, *overrides: str) -> tuple[RunInterrupted, float]:
    """The run's ``RunInterrupted`` and when it came."""
    with pytest.raises(RunInterrupted) as caught:
        run(config(out, *overrides))
    return caught.value, time.monotonic()


def newest_step(out: Path) -> int | None:
    newest = newest_verified(out / "checkpoints")
    return None if newest is None else int(newest.name[5:-5])


def assert_resumes_to_the_straight_run(tmp_path: Path, out: Path, *overrides: str) -> None:
    run(config(out, *overrides, "ckpt_path=last"))
    straight = tmp_path / "straight"
    run(config(straight, *overrides))
    a, b = senior_weights(straight / "senior"), senior_weights(out / "senior")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_in_a_rollout_stops_the_step_and_resumes_exactly(tmp_path, monkeypatch) -> None:
    out = tmp_path / "run"
    # a step's rollout makes at most 24 decode steps here: the 30th is in step 2 or later
    sent = signal_at(monkeypatch, tandem.engine.loop, 30, signal.SIGTERM)
    err, at = stopped(out, "trainer.max_steps=4", *QUIET)
    assert err.exit_code == 143 and at - sent[0] < 10
    step = int(str(err).split("during step ")[1].split(",")[0])
    assert step >= 2 and newest_step(out) == step - 1
    assert f"a resume starts from the newest checkpoint, step-{step - 1}.ckpt" in str(err)
    assert "Resume with: python -m tandem.train run_name=" in str(err)
    assert not (out / "senior").exists(), "a stopped run is not finished: no export"
    monkeypatch.undo()
    assert_resumes_to_the_straight_run(tmp_path, out, "trainer.max_steps=4", *QUIET)


def test_sigint_between_micro_batches_discards_the_half_made_step(tmp_path, monkeypatch) -> None:
    out = tmp_path / "run"
    two = ["module.mini_batches=2", "trainer.max_steps=3", *QUIET]
    # two micro-batches a step, each its own optimizer step: the 3rd is step 2's first, and the
    # stop comes at the second, after one of step 2's optimizer steps was made
    sent = signal_at(monkeypatch, tandem.modules.update, 3, signal.SIGINT)
    err, at = stopped(out, *two)
    assert err.exit_code == 130 and at - sent[0] < 10
    assert "stopped by SIGINT during step 2" in str(err) and newest_step(out) == 1
    monkeypatch.undo()
    assert_resumes_to_the_straight_run(tmp_path, out, *two)


def test_sigterm_in_the_base_validation_trains_nothing_and_says_so(tmp_path, monkeypatch) -> None:
    out = tmp_path / "run"
    sent = signal_at(monkeypatch, tandem.runs.signals, 1, signal.SIGTERM)
    err, at = stopped(out, "trainer.max_steps=2")
    assert err.exit_code == 143 and at - sent[0] < 10
    assert "during the validation of the starting model, before the first step" in str(err)
    assert "no step checkpoint was written yet" in str(err)
    assert not step_checkpoints(out / "checkpoints")
    monkeypatch.undo()
    run(config(out, "trainer.max_steps=2", "ckpt_path=last"))  # the command it printed
    assert newest_step(out) == 2


def test_sigterm_in_a_validation_during_training_keeps_its_step(tmp_path, monkeypatch) -> None:
    out = tmp_path / "run"
    # stop points of signals: step 1's start, step 2's, then the validation at step 2
    sent = signal_at(monkeypatch, tandem.runs.signals, 3, signal.SIGTERM)
    err, at = stopped(
        out,
        "trainer.max_steps=4",
        "validation.every_n_steps=2",
        "validation.at_start_and_end=false",
    )
    assert err.exit_code == 143 and at - sent[0] < 10
    assert "during the validation at step 2" in str(err) and newest_step(out) == 2


def test_a_flag_raised_after_the_last_stop_point_saves_its_step(tmp_path, monkeypatch) -> None:
    log_step = TandemGRPO.log_step

    def signalled(self, *args, **kwargs) -> None:
        log_step(self, *args, **kwargs)
        if self.global_step == 2:  # step 2's own log (its optimizer step is counted)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(TandemGRPO, "log_step", signalled)
    out = tmp_path / "run"
    err, _ = stopped(out, "trainer.max_steps=5", "checkpoint_every_n_steps=100")
    assert err.exit_code == 143 and "at the end of step 2, its checkpoint saved" in str(err)
    assert newest_step(out) == 2
    # nothing it was not asked for: no validation pass after the base's, no best checkpoint
    assert not list((out / "checkpoints").glob("best-*.ckpt"))
    validated = [int(r["step"]) for r in metrics_rows(out) if r.get("val/tandem/accuracy")]
    assert validated == [0], validated


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
def test_the_command_exits_with_the_signal_from_the_base_validation(tmp_path, signum) -> None:
    # 200 validation problems: the base's validation lasts seconds after the junior loads
    proc = launch(tmp_path, "data.sizes.validation=200", "validation.size=200")
    for line in proc.stdout:
        if "junior tiny loaded" in line:
            break
    time.sleep(2)
    sent = time.time()
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    seconds = time.time() - sent
    assert proc.returncode == 128 + signum, stderr[-2000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"tandem.train: stopped by {signal.Signals(signum).name} during the")
    assert "Resume with: python -m tandem.train run_name=" in last
    assert seconds < 10, f"stopped {seconds:.0f} s after the signal"


def test_a_reader_gone_from_the_pipe_does_not_stop_the_stop(tmp_path: Path) -> None:
    # `python -m tandem.train | tee log`, then Ctrl-C: tee ends too, and the run writes its
    # progress bar, warnings and last line into a pipe with no reader
    proc = launch(tmp_path, "checkpoint_every_n_steps=1", "trainer.enable_progress_bar=true")
    wait_for_step(tmp_path, 1, proc)
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
