"""Every start prints its memory plan and records it in ``run_info.json``; a run that cannot fit
its devices is refused (exit 2) before any model loads, with the figures and the keys to change."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

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
