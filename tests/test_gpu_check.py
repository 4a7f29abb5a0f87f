"""The GPU check (``benchmarks/gpu_check.py``): its configs validate here; it runs on a GPU."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from tandem.assets import TINY_WORLD
from tandem.config import validate_train_config
from tandem.plan import GiB, make_plan
from tests.test_train_config import train_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_run_of_the_check_is_a_valid_config(gpus: int, tmp_path: Path) -> None:
    check = load_script()
    plan = check.runs(gpus)
    assert ("junior_on_cuda1" in plan) == (gpus >= 2)
    for overrides in plan.values():
        cfg = train_config(*check.TINY, "output_dir=x", *overrides)
        validate_train_config(cfg, world_size=min(2, gpus) if "fsdp" in overrides[0] else 1)
    # the paper-shaped run: the authors' recipe and layout at a reduced batch, on Qwen3-4B's
    # shape (its config.json beside the tiny world's tokenizer; the weights are made there)
    folder = tmp_path / "qwen3_4b"
    folder.mkdir()
    shape = ROOT / "tandem" / "plan" / "shapes" / "Qwen--Qwen3-4B-Instruct-2507" / "config.json"
    shutil.copy(shape, folder / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY_WORLD / name, folder / name)
    overrides = check.paper_overrides(str(folder), gpus, 16, 384, 2)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("reproduce_paper", [*overrides, "output_dir=x"])
    validate_train_config(cfg, world_size=1)
    assert cfg.module.backend.name == "torch" and cfg.trainer.devices == 1
    assert cfg.trainer.strategy.offload == "between_phases"
    assert cfg.trainer.strategy.activation_checkpointing
    assert cfg.module.max_tokens_per_micro_batch == 10000 and cfg.group_size == 8
    # on H200s it fits; the plan is what the check measures against
    h200s = tuple((f"cuda:{i}", 141 * GiB) for i in range(gpus))
    plan = make_plan(cfg, 1, devices=h200s, fixes=False)
    assert plan.fits and set(plan.phase_bytes()) >= {"rollout", "old_logprobs", "update", "step"}
    # the shipped layout, where vLLM is installed: the pair on each process
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        pair = compose("reproduce_paper", [*overrides, *check.pair_overrides(2), "output_dir=x"])
    assert pair.module.backend.name == "vllm" and pair.trainer.devices == 2
    assert pair.model.junior_device is None


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a GPU: benchmarks/gpu_check.py trains the tiny world sharded on CUDA devices "
    "(and with the junior on cuda:1 where there are two); run it on a GPU machine",
)
def test_gpu_check_runs_and_reports() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "3"], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["fsdp"]["seconds"]["step"] > 0
    assert result["fsdp"]["rank0"]["peak_allocated_mib"]["cuda:0"] > 0
    if result["gpus"] >= 2:
        peaks = result["junior_on_cuda1"]["rank0"]["peak_allocated_mib"]
        assert peaks.get("cuda:1", 0) > 0, "the junior lives on the second device"
