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


def synthetic_summary(rng, problems: int = 40, solve: float = 0.4, kl: float = 0.01) -> dict:
    """One set's per-problem summary as ``tandem.analysis.problems.summarize`` writes it."""
    tokens = rng.integers(200, 400, problems)
    return {
        "problems": list(range(problems)),
        "samples": {"solo": 8, "handoff": 8},
        "solo": rng.binomial(8, solve, problems).tolist(),
        "handoff": rng.binomial(8, solve * 0.9, problems).tolist(),
        "kl": (kl * tokens * rng.uniform(0.5, 1.5, problems)).round(7).tolist(),
        "overlap": (0.98 * tokens).round(7).tolist(),
        "tokens": tokens.tolist(),
        "ce": (0.15 * 8 * rng.uniform(0.8, 1.2, problems)).round(7).tolist(),
        "chains": [8] * problems,
    }


@pytest.fixture
def synthetic_inputs(tmp_path: Path):
    """A page's inputs folder for three arms of three seeds on synthetic figures, with the
    pull-back of a world where Tandem RL takes back half of GRPO's move (``World``)."""
    import numpy as np

    from tandem.analysis import inputs
    from tandem.analysis.simulate import World, world_pullbacks
    from tandem.analysis.study import Study

    rng = np.random.default_rng(0)
    study = Study.load("tiny")
    spec = {
        "study": "tiny", "title": "A synthetic study", "out": str(tmp_path / "page.md"),
        "runs": "multirun/synthetic", "base": "tiny", "sets": ["tiny"], "greedy": "tiny_greedy",
        "checkpoint": "selected", "describes": "synthetic figures", "compare": None,
        "compare_data": None, "data": str(tmp_path / "data"), "margins": study.margins,
        "top_share": study.top_share, "command": "python -m tandem.analysis.study",
        "measured_at": "0000000",
    }  # fmt: skip
    runs = []
    for arm, solve in (("grpo", 0.4), ("trl", 0.5), ("kl_reg", 0.4)):
        for seed in range(3):
            summary = synthetic_summary(rng, solve=solve + 0.01 * seed)
            metrics = {"solo/pass@1": float(np.mean(summary["solo"]) / 8)}
            metrics["greedy/solo/pass@1"] = metrics["greedy/handoff/pass@1"] = 0.5
            runs.append(
                inputs.RunInputs(
                    arm, seed, f"multirun/synthetic/{arm}-seed{seed}", 60, [["abc1234", 0]],
                    "abc1234", metrics, {"tiny": summary}, {"val/solo/accuracy": {"0": 0.3}},
                )
            )  # fmt: skip
    base = {"evaluated": "abc1234", "metrics": {"greedy/solo/pass@1": 0.35}}
    base["problems"] = {"tiny": synthetic_summary(rng, solve=0.3)}
    moved = world_pullbacks(World(problems=40), "half_pullback", 3, rng)
    for reference in moved["references"].values():
        for got in reference["runs"].values():
            got.update(pulled_back=0.9, pullback_rho=-0.5, spearman_top=0.8)
    inputs.write(tmp_path / "data", spec, base, runs, moved)
    return tmp_path / "data"
