"""Inputs of the analysis tests: a small tiny-world evaluation (logged to Aim too) and a fake
training log, made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tandem.evaluate import run

CONF = str(Path(__file__).resolve().parents[2] / "conf")


@pytest.fixture(scope="session")
def eval_outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with one ``tandem.evaluate`` output (3 problems, n=2) and an Aim repo beside."""
    root = tmp_path_factory.mktemp("analysis")
    overrides = [
        f"output_dir={root / 'results' / 'base'}",
        f"aim_repo={root / 'aim'}",
        "aim=true",
        "label=base",
        "eval.tiny.limit=3",
        "eval.tiny.n=2",
        "eval.tiny.ks=[1,2]",
        "eval.tiny.max_new_tokens=64",
        "threads=1",
        "progress=false",
    ]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        run(compose(config_name="evaluate", overrides=overrides))
    return root


@pytest.fixture(scope="session")
def training_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two training runs' CSV logs, as Lightning's CSVLogger writes them."""
    root = tmp_path_factory.mktemp("runs")
    for run_name, slope in (("grpo", 0.01), ("trl", 0.02)):
        folder = root / run_name / "csv" / "version_0"
        folder.mkdir(parents=True)
        lines = ["epoch,step,train/reward,train/senior_share,val/tandem/accuracy"]
        for step in range(10):
            val = f"{0.1 + slope * step:.3f}" if step % 5 == 4 else ""
            lines.append(f"0,{step},{slope * step:.3f},{0.5 + slope:.3f},{val}")
        (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    return root
