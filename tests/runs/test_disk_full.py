"""A disk that fills mid-run: one line naming the folder, the bytes a checkpoint needs and the
fix; the checkpoints written before are intact; freed, the run resumes to the straight run's
senior exactly. The disk is a real one: a small tmpfs (mounting needs root; skipped without)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.modules.test_train import cli, senior_weights

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["trainer.max_steps=3", "checkpoint_every_n_steps=1", "keep_checkpoints=2", "threads=1"]


def train(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TANDEM_FAULT", None)
    command = cli(out, *COMMON, *overrides)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture
def small_disk(tmp_path: Path):
    disk = tmp_path / "disk"
    disk.mkdir()
    # a checkpoint of the tiny world is about 22 MiB: two fit in 80 MiB beside a 30 MiB
    # filler, a third does not
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m", "tmpfs", str(disk)])
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_is_one_line_and_a_freed_one_resumes_exactly(
    tmp_path: Path, small_disk: Path
) -> None:
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (30 << 20))
    out = small_disk / "run"
    full = train(out)
    assert full.returncode == 1, full.stderr[-3000:]
    last = full.stderr.strip().splitlines()[-1]
    assert "Traceback" not in full.stderr
    assert last.startswith("tandem.train: no space left on the device of"), last
    assert str(out / "checkpoints") in last and "MiB free, a checkpoint needs about" in last
    assert "resume with ckpt_path=last" in last
    # what was written before is whole, and nothing half-written is left to be mistaken for it
    saved = sorted(p.name for p in (out / "checkpoints").glob("step-*.ckpt"))
    assert saved and all(not p.name.count(".tmp-") for p in (out / "checkpoints").iterdir())

    filler.unlink()
    resumed = train(out, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    straight = tmp_path / "straight"
    assert train(straight).returncode == 0
    a, b = senior_weights(straight / "senior"), senior_weights(out / "senior")
    assert all(torch.equal(a[k], b[k]) for k in a)
