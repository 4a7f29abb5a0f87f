"""Fault injection: a training run SIGKILLed in a step, in a checkpoint write and in the export,
with checkpoints corrupted between starts, resumed each time, ends with the straight run's senior.

The quick version kills at named points (``TANDEM_FAULT``, ``tandem.runs.faults``), so each phase
is hit for certain; the slow one adds kills at random moments.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tandem.runs.checkpoints import newest_verified, verify
from tandem.train import run
from tests.modules.test_train import cli, config

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "validation.every_n_steps=100",
    "threads=1",
    "checkpoint_every_n_steps=1",
    "keep_checkpoints=2",
]


def start(out: Path, steps: int, fault: str | None = None, timeout: float = 300):
    """One start of ``python -m tandem.train`` resuming ``out``; ``fault`` names a kill point."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TANDEM_FAULT", None)
    if fault:
        env["TANDEM_FAULT"] = fault
    command = cli(out, *FAST, f"trainer.max_steps={steps}", "ckpt_path=last")
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)


def temporaries(out: Path) -> list[str]:
    return sorted(
        p.name for p in [*out.iterdir(), *(out / "checkpoints").iterdir()] if ".tmp-" in p.name
    )


def corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:  # zeros over the middle, same size: only the checksum can tell
        data[len(data) // 2 : len(data) // 2 + 4096] = bytes(4096)
        path.write_bytes(bytes(data))


def assert_same_senior(a: Path, b: Path) -> None:
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert x.keys() == y.keys()
    for k in x:
        assert torch.equal(x[k], y[k]), k


def test_kills_in_every_phase_and_bad_checkpoints_still_give_the_straight_senior(
    tmp_path: Path,
) -> None:
    straight, out = tmp_path / "straight", tmp_path / "killed"
    run(config(straight, *FAST, "trainer.max_steps=4"))

    # 1. killed inside step 2, after its optimizer step: step 1 is what survives
    r = start(out, 4, fault="update@2")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert newest_verified(out / "checkpoints").name == "step-1.ckpt"

    # 2. resumed, then killed while step 3's checkpoint is written: a temporary, never step-3
    r = start(out, 4, fault="checkpoint@3")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert temporaries(out) == [f"step-3.ckpt.tmp-{pid}" for pid in _pids(temporaries(out))]
    assert not (out / "checkpoints" / "step-3.ckpt").exists()
    corrupt(out / "checkpoints" / "step-2.ckpt", "truncate")

    # 3. resumed from step 1 (step 2 is named and skipped), killed in the export
    r = start(out, 4, fault="export@4")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert "step-2.ckpt does not match its checksum" in r.stdout + r.stderr
    assert not (out / "senior").exists(), "a half export is never under the final name"
    assert any(name.startswith("senior.tmp-") for name in temporaries(out))
    corrupt(out / "checkpoints" / "step-4.ckpt", "zeros")

    # 4. resumed from step 3 (step 4 is skipped), retrains step 4 and exports
    r = start(out, 4)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step-4.ckpt does not match its checksum" in r.stdout + r.stderr
    assert temporaries(out) == [], "nothing half-written is left"
    assert_same_senior(straight / "senior", out / "senior")
    starts = json.loads((out / "run_info.json").read_text())["starts"]
    assert [s["step"] for s in starts] == [0, 1, 1, 3]
    assert all(s["changes"] == {} for s in starts)

    # 5. a finished run whose export was lost: starting it again writes it again, same bytes
    (out / "senior" / "config.json").write_bytes(b"")
    run(config(out, *FAST, "trainer.max_steps=4", "ckpt_path=last"))
    assert_same_senior(straight / "senior", out / "senior")
    assert json.loads((out / "senior" / "config.json").read_text())["model_type"]
    assert verify(out / "checkpoints" / "step-4.ckpt") is None


@pytest.mark.slow
def test_random_kills_then_resume_give_the_straight_senior(tmp_path: Path) -> None:
    steps = 20
    straight, out = tmp_path / "straight", tmp_path / "killed"
    run(config(straight, *FAST, f"trainer.max_steps={steps}"))
    rng = random.Random(0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TANDEM_FAULT", None)
    landed, saved = [], 0
    # random kills while there is room left for the named ones below
    while len(landed) < 6 and saved < steps - 4:
        command = cli(out, *FAST, f"trainer.max_steps={steps}", "ckpt_path=last")
        proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )
        # once this start has trained a step, at a random moment: in a step or a write
        while proc.poll() is None and _newest_step(out) <= saved:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))
        proc.kill()
        proc.wait()
        saved = _newest_step(out)
        landed.append((saved, temporaries(out)))
    for fault in (f"update@{saved + 1}", f"checkpoint@{saved + 2}", f"export@{steps}"):
        r = start(out, steps, fault=fault)
        assert r.returncode == -signal.SIGKILL, (fault, r.stderr[-2000:])
    r = start(out, steps)
    assert r.returncode == 0, r.stderr[-3000:]
    assert temporaries(out) == []
    assert_same_senior(straight / "senior", out / "senior")
    print("random kills left (newest verified step, temporaries):", landed)


def _newest_step(out: Path) -> int:
    found = newest_verified(out / "checkpoints") if (out / "checkpoints").exists() else None
    return int(found.stem.split("-")[1]) if found else 0


def _pids(names: list[str]) -> list[str]:
    return [name.rsplit("-", 1)[1] for name in names]
