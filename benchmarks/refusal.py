"""How long ``python -m tandem.train`` takes to refuse a start: ``python benchmarks/refusal.py``.

Prints one JSON object: for each refusal (a typo Hydra refuses, a value out of range, a batch
that does not split into groups, ``trainer.devices=0``, a folder another process holds, and for
comparison a ``+`` key added to a component, whose arguments can only be read from its class),
the exit status and the median, min and max wall time over ``--repeat`` starts, with the
machine's load average beside them. The target is under 3 s on a quiet machine for every
refusal but the last: they come before torch, Lightning and transformers are imported.

What this file leaves out: correctness assertions (``tests/test_train_config.py`` and
``tests/runs/test_lock.py`` check the messages and that no heavy library is imported).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "typo (Hydra)": ["sampler.pp=0.3"],
    "range": ["generation.temperature=0"],
    "batch": ["batch_size=7"],
    "devices=0": ["trainer.devices=0"],
    "held folder": [],
    "added component key (after imports)": ["+sampler.pp=0.3"],
}
HOLD = """
import sys, time
from tandem.runs.lock import RunLock
with RunLock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def refuse(folder: Path, overrides: list[str]) -> tuple[int, float]:
    """The exit status and wall time of one start in ``folder``."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.train", f"hydra.run.dir={folder}", *overrides],
        capture_output=True,
        cwd=ROOT,
    )
    return proc.returncode, time.perf_counter() - t0


def bench(name: str, overrides: list[str], repeat: int, tmp: Path) -> dict:
    # a name Hydra's override parser reads as a plain path
    folder = tmp / "".join(c if c.isalnum() else "_" for c in name)
    holder = None
    if name == "held folder":
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        assert holder.stdout.readline().strip() == "held"
    try:
        runs = [refuse(folder, overrides) for _ in range(repeat)]
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    seconds = [s for _, s in runs]
    return {
        "exit": sorted({rc for rc, _ in runs}),
        "median_s": round(statistics.median(seconds), 2),
        "min_s": round(min(seconds), 2),
        "max_s": round(max(seconds), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: bench(name, o, args.repeat, Path(tmp)) for name, o in CASES.items()}
    print(
        json.dumps(
            {
                "python": sys.version.split()[0],
                "cpus": os.cpu_count(),
                "load_average_1min": round(os.getloadavg()[0], 2),
                "repeat": args.repeat,
                "refusals": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
