"""Every start prints its memory plan and records it in ``run_info.json``; a run that cannot fit
its devices is refused (exit 2) before any model loads, with the figures and the keys to change."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tandem.train import run
from tests.modules.test_train import cli, config

ROOT = Path(__file__).resolve().parents[1]


def test_a_start_records_its_plan(tmp_path: Path) -> None:
    run(config(tmp_path, "trainer.max_steps=1"))
    (start,) = json.loads((tmp_path / "run_info.json").read_text())["starts"]
    plan = start["plan"]
    assert plan["fits"] is True and 0 < plan["peak_gib"] < plan["devices"][0]["usable_gib"]
    assert plan["devices"][0]["phases"]["update"]["gradients"] > 0


def test_a_run_that_cannot_fit_is_refused_before_anything_loads(tmp_path: Path) -> None:
    # 65,536 rows of 512 positions under a KV budget of 1,000 GiB: 192 GiB of caches on this
    # machine (without a budget the engine would take them a chunk at a time, and fit)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.time()
    result = subprocess.run(
        # (16,384 prompts a step: the data holds as many, or the batch itself is refused)
        cli(tmp_path, "batch_size=65536", "data.sizes.train=20000", "generation.kv_cache_gib=1000"),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "KV cache" in result.stderr and "generation.kv_cache_gib" in result.stderr
    # refused before the folder was taken or any model read
    assert not (tmp_path / "run_info.json").exists()
    assert time.time() - began < 120


def test_a_cpu_plan_counts_the_rollouts_own_tensors() -> None:
    from tandem.plan import GiB, make_plan
    from tandem.plan.memory import ROLLOUT_BYTES_PER_TOKEN, UPDATE_BYTES_PER_POSITION

    # 160,000 rows (20,000 prompts x 8) under a KV budget of 1 GiB: the caches are small, the
    # rollout's own tensors are not
    cfg = config(Path("unused"), "batch_size=160000", "group_size=8", "generation.kv_cache_gib=1")
    plan = make_plan(cfg, devices=(("cpu", int(1.5 * GiB)),))
    (cpu,) = plan.devices
    rows, new = 160_000, cfg.generation.max_new_tokens
    assert cpu.phases["rollout"]["rollout_tensors"] == 2 * rows * new * ROLLOUT_BYTES_PER_TOKEN
    inputs = cpu.phases["update"]["update_inputs"]
    assert inputs > rows * (plan.settings.row_tokens * UPDATE_BYTES_PER_POSITION)
    # the models, caches and activations alone would fit this host; with them, it does not
    assert not plan.fits and cpu.peak_phase == "update"
    # on a GPU they are in host memory, not the device's, and small beside its KV caches
    on_gpu = config(Path("unused"), "batch_size=160000", "group_size=8", "trainer=gpu")
    gpu = make_plan(on_gpu, devices=(("cuda:0", 80 * GiB),))
    assert "rollout_tensors" not in gpu.devices[0].phases["rollout"]


def test_a_kv_budget_below_one_group_is_refused_for_itself() -> None:
    from tandem.plan import PlanError, check_plan

    cfg = config(Path("unused"), "generation.kv_cache_gib=0.00001")
    with pytest.raises(PlanError) as refused:
        check_plan(cfg, 1)
    # every device holds its peak: the message is the budget's, not "does not fit in memory"
    assert str(refused.value).startswith("generation.kv_cache_gib (1e-05) holds less than one")
    assert "does not fit" not in str(refused.value)
