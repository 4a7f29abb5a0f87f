"""The GPU check: the sharded tiny run on GPUs and, with two devices, the junior on the second.

Run on a GPU machine (a few minutes): ``python benchmarks/gpu_check.py [--steps 6]``.

1. ``fsdp``: ``trainer=fsdp_gpu`` (FSDP2, bfloat16 compute, float32 master weights) on
   ``min(2, GPUs)`` processes, Tandem RL on the tiny world;
2. ``junior_on_cuda1`` (two GPUs or more): ``trainer=gpu`` with ``model.junior_device=cuda:1``,
   the paper's layout, where the engine queues the junior's forward while the senior's runs;
3. ``same_device`` (two GPUs or more): the same run with both models on ``cuda:0``, to compare.

Prints one JSON object: per run and rank, the median step time and its phases (from the logged
``time/*``, first step dropped as warm-up) and the peak memory allocated on each device (MiB).
Exits 1 when a run fails, 2 when there is no GPU. ``tests/test_gpu_check.py`` runs it where a GPU
is present; CI (no GPU) skips it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
TINY = [
    "+data.sizes={train:256,validation:8}",
    "batch_size=32",
    "group_size=4",
    "generation.max_new_tokens=64",
    "validation.every_n_steps=100000",
    "validation.at_start_and_end=false",
    "checkpoint_every_n_steps=100000",
    "logger=csv",
    "trainer.enable_progress_bar=false",
]
PHASES = ("generate", "reward", "update", "step")


def runs(gpus: int) -> dict[str, list[str]]:
    """The runs this machine can do, as overrides."""
    plan = {"fsdp": ["trainer=fsdp_gpu", f"trainer.devices={min(2, gpus)}"]}
    if gpus >= 2:
        plan["junior_on_cuda1"] = ["trainer=gpu", "model.junior_device=cuda:1"]
        plan["same_device"] = ["trainer=gpu", "model.junior_device=cuda:0"]
    return plan


def worker(out: Path, steps: int, overrides: list[str]) -> None:
    """One training run; every rank writes ``<out>/<rank>.json`` with its devices' peaks."""
    import lightning as L
    import torch
    from hydra import compose, initialize_config_dir

    import tandem.train

    rank = int(os.environ.get("LOCAL_RANK", 0))

    class Peaks(L.Callback):
        def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            peaks = {
                f"cuda:{d}": torch.cuda.max_memory_allocated(d) / 2**20
                for d in range(torch.cuda.device_count())
                if torch.cuda.max_memory_allocated(d)
            }
            (out / f"{rank}.json").write_text(json.dumps({"peak_allocated_mib": peaks}))

    def build(cfg):
        trainer, module, data, stop = real_build(cfg)
        trainer.callbacks.append(Peaks())
        return trainer, module, data, stop

    real_build, tandem.train.build = tandem.train.build, build
    own = [f"output_dir={out / 'run'}", f"trainer.max_steps={steps}"]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("train", overrides=[*TINY, *own, *overrides])
    tandem.train.run(cfg)


def step_times(out: Path) -> dict[str, float]:
    """Median seconds per phase over the logged steps, the first dropped as warm-up."""
    (path,) = (out / "run").glob("csv/version_*/metrics.csv")
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("time/step")]
    rows = rows[1:] or rows
    return {k: statistics.median(float(r[f"time/{k}"]) for r in rows) for k in PHASES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--worker", metavar="OUT")
    args, overrides = parser.parse_known_args()
    if args.worker:
        return worker(Path(args.worker), args.steps, overrides)
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        print(json.dumps({"error": "no GPU: this check needs one (CUDA)"}))
        sys.exit(2)
    result: dict = {"gpus": gpus, "device": torch.cuda.get_device_name(0), "steps": args.steps}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, run_overrides in runs(gpus).items():
            out = Path(tmp) / name
            out.mkdir()
            command = [sys.executable, __file__, "--steps", str(args.steps), "--worker", str(out)]
            done = subprocess.run(
                [*command, *run_overrides, *overrides], env=env, capture_output=True, text=True
            )
            if done.returncode != 0:
                result[name] = {"error": done.stderr[-3000:]}
                continue
            ranks = sorted(out.glob("[0-9].json"))
            result[name] = {
                "seconds": step_times(out),
                **{f"rank{p.stem}": json.loads(p.read_text()) for p in ranks},
            }
    print(json.dumps(result, indent=2))
    sys.exit(1 if any("error" in v for v in result.values() if isinstance(v, dict)) else 0)


if __name__ == "__main__":
    main()
