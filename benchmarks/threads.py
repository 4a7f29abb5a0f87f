"""Seconds per training step of the README's first command under each CPU thread setting:
``python benchmarks/threads.py [--steps 3] [--busy 1]``.

Runs ``python -m tandem.train`` on the embedded tiny world for ``--steps`` steps with the CSV
logger, once per setting: torch's own default (as many threads as cores, OpenMP's threads
spinning while they wait), ``threads=1`` alone, and ``threads=1`` with
``OMP_WAIT_POLICY=PASSIVE`` (the defaults of ``tandem.train``). ``--busy N`` starts N processes
that keep one core each busy for the whole measurement, as the other users of a shared machine
do. Prints one JSON object: per setting, the median of ``time/step`` from ``metrics.csv`` (the
first step left out: it warms up) and the whole command's wall time, with the load average.

What this file leaves out: correctness (the tests hold it).
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name -> (overrides, environment); OMP_WAIT_POLICY=ACTIVE is OpenMP's own behaviour
SETTINGS = {
    "torch default (threads=null, OMP active)": (["threads=null"], {"OMP_WAIT_POLICY": "ACTIVE"}),
    "threads=1 (OMP active)": (["threads=1"], {"OMP_WAIT_POLICY": "ACTIVE"}),
    "threads=1, OMP_WAIT_POLICY=PASSIVE (defaults)": ([], {}),
}
SPIN = "while True: pass"


def step_seconds(folder: Path) -> list[float]:
    (metrics,) = folder.glob("csv/*/metrics.csv")
    with metrics.open() as f:
        return [float(r["time/step"]) for r in csv.DictReader(f) if r.get("time/step")]


def measure(overrides: list[str], env: dict[str, str], steps: int, tmp: Path, i: int) -> dict:
    folder = tmp / f"run{i}"
    t0 = time.perf_counter()
    subprocess.run(
        [
            *[sys.executable, "-m", "tandem.train", f"hydra.run.dir={folder}", "logger=csv"],
            *[f"trainer.max_steps={steps}", "trainer.enable_progress_bar=false", *overrides],
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
        env={**os.environ, **env},
    )
    wall = time.perf_counter() - t0
    seconds = step_seconds(folder)
    return {
        "step_s_median": round(statistics.median(seconds[1:] or seconds), 2),
        "step_s": [round(s, 2) for s in seconds],
        "wall_s": round(wall, 1),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="processes that keep a core busy")
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            results = {
                name: measure(o, env, args.steps, Path(tmp), i)
                for i, (name, (o, env)) in enumerate(SETTINGS.items())
            }
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    info = {"cpus": os.cpu_count(), "busy_processes": args.busy, "steps": args.steps}
    print(json.dumps({**info, "settings": results}, indent=2))


if __name__ == "__main__":
    main()
