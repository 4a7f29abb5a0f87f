"""The paper-scale study end to end on this machine: the paper's own configs and commands, with
only the model, the data paths and the sizes overridden.

The tiny model stands in for Qwen3-4B and local copies of DeepScaleR and the five eval sets'
sources, in each hub dataset's own layout, stand in for the hub (``tests/paper_data.py``).
``python -m tandem.train --config-name reproduce_paper`` trains every arm a few steps over two
seeds, ``python -m tandem.analysis.study --study paper`` evaluates each run's selected
checkpoint on all five sets, measures the per-problem summaries and the pull-back, writes the
page's inputs and the page, whose every table must be filled, and the inputs alone render it
again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from paper_data import write_paper_data

from tandem.analysis.claims import CLAIMS
from tandem.analysis.study import Study, main

ROOT = Path(__file__).resolve().parents[2]
SETS = Study.load("paper").sets
# the sizes of a dry run: two seeds, a few short steps, one or two problems per set
TRAIN = [
    "model=tiny",
    "model.junior_device=null",
    "trainer=cpu",
    "logger=csv",
    "threads=1",
    "seed=0,1",
    "hydra.launcher.n_jobs=2",
    "batch_size=4",
    "group_size=2",
    "generation.max_new_tokens=12",
    # training steps: one batch of rollouts each (two optimizer steps: mini_batches=2)
    "trainer.max_steps=1",
    "checkpoint_every_n_steps=1",
    "validation.every_n_steps=1",
    "validation.size=2",
    "data.holdout=4",
    "data.max_prompt_tokens=256",
]
EVAL = [
    "device=cpu",
    "junior_device=null",
    "dtype=float32",
    "threads=1",
    "progress=false",
    *[f"eval.{s}.{k}" for s in SETS for k in ("n=8", "ks=[1,2,4,8]", "max_new_tokens=12")],
]


def test_paper_study_runs_end_to_end(tmp_path: Path) -> None:
    data, sweep = tmp_path / "datasets", tmp_path / "multirun"
    kept = write_paper_data(data, train_rows=24, eval_rows=1)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    train = [
        sys.executable,
        "-m",
        "tandem.train",
        "--config-name",
        "reproduce_paper",
        f"datasets_dir={data}",
        f"hydra.sweep.dir={sweep}",
        *TRAIN,
    ]
    done = subprocess.run(train, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    arms = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert arms == sorted(
        f"{a}-seed{s}"
        for a in ("grpo", "trl", "kl_reg", "grpo_g16", "trl_token", "trl_sentence")
        for s in (0, 1)
    )
    for arm in arms:
        assert list((sweep / arm / "checkpoints").glob("best-*.ckpt")), arm

    page = tmp_path / "paper.md"
    flags = [f"--eval={o}" for o in [f"datasets_dir={data}", *EVAL]]
    inputs = tmp_path / "inputs"
    args = ["--study", "paper", "--base", "tiny", "--out", str(page), "--data", str(inputs)]
    main([str(sweep), *args, *flags])
    text = page.read_text()

    # every run was evaluated on its selected checkpoint, on all five sets
    for arm in arms:
        results = json.loads((sweep / arm / "eval" / "results.json").read_text())
        assert {s: len_of(results, s) for s in SETS} == {s: kept[s] for s in SETS}
        assert (sweep / arm / "eval" / "senior" / "config.json").is_file()
    # every table filled: each claim's metric has a value for every arm and the base
    for claim in CLAIMS:
        assert claim.title in text
    header = next(line for line in text.splitlines() if line.startswith("| metric | base |"))
    columns = [c.strip() for c in header.split("|")[1:-1]]
    assert columns[-1] == "paper (trl / grpo)"
    arms_shown = columns[2:-1]
    assert sorted(arms_shown) == sorted({a.rsplit("-seed", 1)[0] for a in arms})
    rows = [
        line
        for line in text.splitlines()
        if line.startswith("| `") and line.count("|") == header.count("|")
    ]
    assert len(rows) >= 7
    for row in rows:
        metric, *cells = (c.strip() for c in row.split("|")[1:-1])
        for arm, cell in zip(arms_shown, cells[1:], strict=False):
            assert cell != "n/a" and "(n=1)" not in cell, (metric, arm, row)
    # five sets: every arm against GRPO, macro and micro, for every metric
    micro = next(line for line in text.splitlines() if line.startswith("| metric | trl − grpo"))
    assert "trl − grpo (macro)" in micro and "trl − grpo (micro)" in micro
    # the pull-back of every run against every GRPO seed; the verdicts and the calibration row
    assert "| 0 | `trl-seed0` |" in text and "| 1 | `grpo-seed0` |" in text
    assert "## Verdicts" in text and "## Calibration: GRPO seeds against GRPO seeds" in text
    assert "## Coverage" in text
    # the committed inputs render the same page alone
    assert main(["--from-results", str(inputs)]).read_text() == text


def len_of(results: dict, name: str) -> int:
    """Problems an eval set was scored on (its data report)."""
    return int(results["reports"][name]["problems"])
