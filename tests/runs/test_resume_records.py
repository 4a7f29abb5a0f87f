"""A resume finds its own checkpoints: the end of a run shorter than the checkpoint interval, and
the newest ``keep_checkpoints`` across resumes (the one resumed from is not kept forever)."""

from __future__ import annotations

from pathlib import Path

import torch

from tandem.train import run
from tests.modules.test_train import config


def test_a_run_shorter_than_its_checkpoint_interval_resumes_from_its_end(tmp_path: Path) -> None:
    # no step checkpoint at 3 steps of 5: the run's end is in last.ckpt alone, with its checksum
    run(config(tmp_path, "trainer.max_steps=3", "checkpoint_every_n_steps=5"))
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert last.is_file() and not last.is_symlink()
    assert Path(f"{last}.sha256").is_file()
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
