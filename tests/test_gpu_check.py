"""The GPU check (``benchmarks/gpu_check.py``): its configs validate here; it runs on a GPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tandem.config import validate_train_config
from tests.test_train_config import train_config

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_run_of_the_check_is_a_valid_config(gpus: int) -> None:
    check = load_script()
    plan = check.runs(gpus)
    assert ("junior_on_cuda1" in plan) == (gpus >= 2)
    for overrides in plan.values():
        cfg = train_config(*check.TINY, "output_dir=x", *overrides)
        validate_train_config(cfg, world_size=min(2, gpus) if "fsdp" in overrides[0] else 1)


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
