"""Float32 master weights wherever the senior computes in bfloat16: at the paper's learning rate
(1e-6, AdamW as verl sets it) one batch of two optimizer steps moves as large a share of the
stored weights under every trainer config that computes in bfloat16 as in float32.

Each share counts the stored (checkpointed) senior weights that differ between the same step at
lr 1e-6 and at lr 1e-30 (the same rollouts; at 1e-30 every update rounds away), so it measures
the update and nothing else. Weights held in bfloat16 keep about 0.1% of such updates.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tandem.errors import ConfigError
from tandem.modules.export import load_checkpoint_file
from tandem.runs.checkpoints import newest_verified
from tandem.train import run
from tests.modules.test_train import cli, config

ROOT = Path(__file__).resolve().parents[2]
# the paper's optimizer (conf/recipe/paper.yaml) on one batch of 32 rollouts of 128 tokens
PAPER_STEP = [
    "module.optimizer.weight_decay=0.01",
    "module.optimizer.betas=[0.9,0.999]",
    "module.scheduler=null",
    "module.mini_batches=2",
    "module.loss.lambda_jun=0.0",
    "trainer.max_steps=1",
    "batch_size=32",
    "group_size=8",
    "generation.max_new_tokens=128",
    "validation.every_n_steps=1",
    "validation.size=2",
]
# the trainer configs that compute in bfloat16, run on this CPU
BF16 = {
    "gpu": ["trainer=gpu", "trainer.accelerator=cpu", "model.dtype=bfloat16"],
    "fsdp_gpu": [
        "trainer=fsdp_gpu",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "model.dtype=bfloat16",
        "threads=1",
    ],
}


def stored_senior(out: Path) -> dict[str, torch.Tensor]:
    state = load_checkpoint_file(newest_verified(out / "checkpoints"))["state_dict"]
    return {k: v for k, v in state.items() if k.startswith("senior.")}


def train(out: Path, lr: str, overrides: list[str]) -> dict[str, torch.Tensor]:
    args = [f"module.optimizer.lr={lr}", *PAPER_STEP, *overrides]
    if "trainer.devices=2" in overrides:  # two processes: through the command line
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        result = subprocess.run(cli(out, *args), capture_output=True, text=True, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        run(config(out, *args))
    return stored_senior(out)


def moved_share(out: Path, overrides: list[str]) -> float:
    step, none = (train(out / lr, lr, overrides) for lr in ("1e-6", "1e-30"))
    assert all(v.dtype == torch.float32 for v in step.values()), "float32 master weights"
    moved = sum(int((step[k] != none[k]).sum()) for k in step)
    return moved / sum(v.numel() for v in step.values())


@pytest.fixture(scope="module")
def float32_share(tmp_path_factory: pytest.TempPathFactory) -> float:
    return moved_share(tmp_path_factory.mktemp("float32"), [])


@pytest.mark.parametrize("trainer", sorted(BF16))
def test_bf16_compute_moves_the_weights_float32_does(
    tmp_path: Path, float32_share: float, trainer: str
) -> None:
    assert float32_share > 0.8, "the step moves most weights in float32"
    share = moved_share(tmp_path, BF16[trainer])
    assert share >= 0.95 * float32_share, (trainer, share, float32_share)
    # the export is what computes: bfloat16, and says so
    senior = tmp_path / "1e-6" / "senior"
    assert {v.dtype for v in load_file(str(senior / "model.safetensors")).values()} == {
        torch.bfloat16
    }
    assert json.loads((senior / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.dtype=bfloat16"], r"trainer.precision \('32-true'\) computes in float32"),
        (["trainer.precision=bf16-true"], "no float32 master copy"),
    ],
)
def test_bf16_that_nothing_computes_in_or_that_drops_the_master_is_refused(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        run(config(tmp_path, *overrides))
