"""A training step is one batch of rollouts, as the authors count it; optimizer steps are their own
counter; a checkpoint counted the old way is refused, not misread."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tandem.runs import RunRefused
from tandem.runs.atomic import AtomicCheckpointIO
from tandem.train import run
from tests.modules.test_train import config, metrics_rows


def test_max_steps_counts_batches_of_rollouts(tmp_path: Path) -> None:
    run(
        config(
            tmp_path,
            "trainer.max_steps=2",
            "module.mini_batches=2",
            "validation.every_n_steps=2",
            "checkpoint_every_n_steps=1",
        )
    )
    rows = [r for r in metrics_rows(tmp_path) if r.get("train/reward")]
    # one logged row per batch of rollouts sampled, at the steps the run's lines give: 1 and 2
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert [float(r["train/optimizer_steps"]) for r in rows] == [2.0, 4.0]
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 2
    assert ckpt["tandem_steps"] == {"unit": "batch", "optimizer_steps": 4}
    # AdamW's own count of the updates it made
    (state, *_) = ckpt["optimizer_states"][0]["state"].values()
    assert int(state["step"]) == 4
    # a step checkpoint and a validation per batch, named by batches
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*.ckpt"))
    assert names == ["step-1.ckpt", "step-2.ckpt"]
    # and the base's validation before the first step
    validated = [int(r["step"]) for r in metrics_rows(tmp_path) if r.get("val/tandem/accuracy")]
    assert len(validated) == 2 and validated[0] == 0, validated


def write_old_counted(path: Path) -> None:
    """Rewrite ``path`` as a checkpoint of the old counting (no record of its step unit)."""
    ckpt = torch.load(path, weights_only=False)
    del ckpt["tandem_steps"]
    path.unlink()
    AtomicCheckpointIO().save_checkpoint(ckpt, path)


def test_a_checkpoint_counted_in_optimizer_steps_is_refused(tmp_path: Path) -> None:
    common = ["module.mini_batches=2", "validation.every_n_steps=1", "checkpoint_every_n_steps=1"]
    run(config(tmp_path, "trainer.max_steps=1", *common))
    write_old_counted(tmp_path / "checkpoints" / "step-1.ckpt")
    with pytest.raises(RunRefused, match="one optimizer step; this run makes 2 a batch"):
        run(config(tmp_path, "trainer.max_steps=2", "ckpt_path=last", *common))


def test_an_old_checkpoint_of_one_optimizer_step_a_batch_resumes(tmp_path: Path) -> None:
    common = ["validation.every_n_steps=1", "checkpoint_every_n_steps=1"]
    run(config(tmp_path, "trainer.max_steps=1", *common))
    write_old_counted(tmp_path / "checkpoints" / "step-1.ckpt")
    run(config(tmp_path, "trainer.max_steps=2", "ckpt_path=last", *common))
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 2 and ckpt["tandem_steps"]["optimizer_steps"] == 2
