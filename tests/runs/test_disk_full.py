"""A disk that fills mid-run: one line naming the folder, the bytes a checkpoint needs, what is
on disk and the fix; the checkpoints written before are intact; freed, or under a lower
keep_checkpoints (the advice), the run resumes to the straight run's senior exactly; and
keep_checkpoints holds across resumes whichever way it changes. The disks are real ones: small
tmpfs mounts (mounting needs root; skipped without)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from tandem.runs import DiskFull
from tandem.runs.checkpoints import verify
from tandem.train import run
from tests.modules.test_train import cli, config, senior_weights

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["trainer.max_steps=3", "checkpoint_every_n_steps=1", "keep_checkpoints=2", "threads=1"]


def train(out: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TANDEM_FAULT", None)
    command = cli(out, *COMMON, *overrides)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def test_a_full_disk_is_one_line_and_a_freed_one_resumes_exactly(
    tmp_path: Path, small_disk
) -> None:
    # a checkpoint of the tiny world is about 22 MiB: two fit in 80 MiB beside a 30 MiB
    # filler, a third does not
    disk = small_disk(80)
    filler = disk / "filler"
    filler.write_bytes(b"\0" * (30 << 20))
    out = disk / "run"
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


def steps_on_disk(out: Path) -> list[int]:
    return sorted(int(p.name[5:-5]) for p in (out / "checkpoints").glob("step-*.ckpt"))


def test_keep_checkpoints_holds_whatever_it_was_before_a_resume(small_disk) -> None:
    out = small_disk(200) / "run"
    run(config(out, "trainer.max_steps=3", "keep_checkpoints=2"))
    assert steps_on_disk(out) == [2, 3]
    # lowered: the first save of the resumed run deletes down to the new number
    run(config(out, "trainer.max_steps=5", "keep_checkpoints=1", "ckpt_path=last"))
    assert steps_on_disk(out) == [5]
    # raised: more are kept from then on
    run(config(out, "trainer.max_steps=8", "keep_checkpoints=3", "ckpt_path=last"))
    assert steps_on_disk(out) == [6, 7, 8]
    assert (out / "checkpoints" / "last.ckpt").resolve().name == "step-8.ckpt"
    assert all(verify(p) is None for p in (out / "checkpoints").glob("step-*.ckpt"))


def test_the_disk_full_advice_followed_works(tmp_path: Path, small_disk) -> None:
    # two checkpoints of about 22 MiB fit beside the filler, a third does not
    disk = small_disk(80)
    (disk / "filler").write_bytes(b"\0" * (30 << 20))
    out = disk / "run"
    with pytest.raises(DiskFull, match="lower keep_checkpoints") as full:
        run(config(out, "trainer.max_steps=4", "keep_checkpoints=2"))
    assert "(step-1.ckpt, step-2.ckpt)" in str(full.value)
    # followed: the old ones that would go after the next write go before it
    run(config(out, "trainer.max_steps=4", "keep_checkpoints=1", "ckpt_path=last"))
    assert steps_on_disk(out) == [4]
    straight = tmp_path / "straight"
    run(config(straight, "trainer.max_steps=4", "checkpoint_every_n_steps=100"))
    a, b = senior_weights(straight / "senior"), senior_weights(out / "senior")
    assert all(torch.equal(a[k], b[k]) for k in a)
