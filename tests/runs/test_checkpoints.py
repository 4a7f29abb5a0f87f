"""Checkpoints are whole or absent, carry a checksum, and a bad one falls back to the one before."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
import torch

from tandem.runs import RunRefused
from tandem.runs.atomic import AtomicCheckpointIO
from tandem.runs.checkpoints import (
    clean_temporaries,
    newest_verified,
    verify,
)


def save_steps(folder: Path, *steps: int) -> list[Path]:
    io = AtomicCheckpointIO()
    paths = []
    for step in steps:
        path = folder / f"step-{step}.ckpt"
        io.save_checkpoint({"global_step": step, "w": torch.full((4096,), float(step))}, path)
        paths.append(path)
    return paths


def test_a_saved_checkpoint_is_whole_with_a_checksum_sha256sum_accepts(tmp_path: Path) -> None:
    (path,) = save_steps(tmp_path, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-3.ckpt", "step-3.ckpt.sha256"]
    assert verify(path) is None
    assert torch.load(path)["global_step"] == 3
    check = subprocess.run(
        ["sha256sum", "-c", "step-3.ckpt.sha256"], cwd=tmp_path, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    AtomicCheckpointIO().remove_checkpoint(path)
    assert list(tmp_path.iterdir()) == [], "the checksum goes with its checkpoint"


def test_truncated_and_zeroed_checkpoints_are_named_and_skipped(tmp_path: Path, caplog) -> None:
    one, two, three = save_steps(tmp_path, 1, 2, 3)
    three.write_bytes(three.read_bytes()[: three.stat().st_size // 2])  # truncated
    with two.open("r+b") as f:  # partly overwritten with zeros, same size
        f.seek(two.stat().st_size // 2)
        f.write(bytes(1024))
    with caplog.at_level(logging.WARNING):
        assert newest_verified(tmp_path) == one
    assert "step-3.ckpt does not match" in caplog.text
    assert "step-2.ckpt does not match" in caplog.text
    one.with_name("step-1.ckpt.sha256").unlink()
    with pytest.raises(RunRefused, match=r"no checkpoint .* verifies.*ckpt_path=<file>"):
        newest_verified(tmp_path)


def test_no_checkpoint_at_all_means_a_fresh_start(tmp_path: Path) -> None:
    assert newest_verified(tmp_path / "checkpoints") is None


def test_what_a_kill_left_is_cleaned_and_nothing_else(tmp_path: Path) -> None:
    (keep,) = save_steps(tmp_path, 1)
    (tmp_path / "step-2.ckpt.tmp-123").write_bytes(b"half")
    (tmp_path / "step-2.ckpt.sha256.tmp-123").write_text("x")
    (tmp_path / "senior.tmp-99").mkdir()
    (tmp_path / "senior.tmp-99" / "config.json").write_text("{}")
    removed = clean_temporaries(tmp_path, tmp_path / "absent")
    assert len(removed) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [keep.name, keep.name + ".sha256"]


def test_only_lightnings_manual_optimization_snippet_is_silenced(monkeypatch) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.utilities import rank_zero_warn

    from tandem.runs import steps
    from tandem.runs.signals import StopOnSignal

    def warn_twice(self, trainer, *args, **kwargs) -> None:  # what Lightning's hook warns
        rank_zero_warn(steps.MANUAL_OPTIMIZATION_WARNING + "_steps, but no pre-optimization")
        rank_zero_warn("Using ModelCheckpoint with something else", category=UserWarning)

    monkeypatch.setattr(ModelCheckpoint, "on_train_batch_end", warn_twice)
    step = steps.StepCheckpoint("unused", 5, 2, StopOnSignal())

    class Trainer:
        global_step = 0
        max_steps = 10

    with pytest.warns(UserWarning) as caught:
        step.on_train_batch_end(Trainer(), None, None, None, 0)
    assert [str(w.message) for w in caught] == ["Using ModelCheckpoint with something else"]


def test_the_sharded_checkpoint_marker_is_lightnings() -> None:
    from lightning.fabric.utilities.load import _METADATA_FILENAME

    from tandem.runs.checkpoints import METADATA

    assert METADATA == _METADATA_FILENAME
