"""A resume finds its own checkpoints: the last step of a run shorter than the checkpoint
interval, and the newest ``keep_checkpoints`` across resumes (the one resumed from is not kept
forever)."""

from __future__ import annotations

from pathlib import Path

import torch

from tandem.train import run
from tests.modules.test_train import config


def test_a_run_shorter_than_its_checkpoint_interval_keeps_its_last_step(tmp_path: Path) -> None:
    # 3 steps of an interval of 5: the run's last step is saved whatever the interval
    run(config(tmp_path, "trainer.max_steps=3", "checkpoint_every_n_steps=5"))
    saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*.ckpt"))
    assert saved == ["step-3.ckpt"]
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert last.resolve().name == "step-3.ckpt"
    run(config(tmp_path, "trainer.max_steps=4", "checkpoint_every_n_steps=5", "ckpt_path=last"))
    state = torch.load(last, weights_only=False)
    assert state["global_step"] == 4


def test_keep_checkpoints_holds_across_resumes(tmp_path: Path) -> None:
    common = ["checkpoint_every_n_steps=1", "keep_checkpoints=2"]
    run(config(tmp_path, "trainer.max_steps=3", *common))
    for steps in (5, 6):
        run(config(tmp_path, f"trainer.max_steps={steps}", "ckpt_path=last", *common))
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*.ckpt"))
    assert names == ["step-5.ckpt", "step-6.ckpt"]
