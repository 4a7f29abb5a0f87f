"""Running ``python -m tandem.train`` in a child process that reports, at its exit, which of
the heavy libraries it had imported: a refusal must come before any of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "lightning", "transformers", "datasets")
ROOT = Path(__file__).resolve().parents[1]
# the module run as `python -m` would run it, then the heavy modules present at its exit
# (at exit: the command ends the process itself once its atexit callbacks have run)
CHILD = f"""
import atexit, json, os, runpy, sys
def report():
    print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.__stdout__)
    print(json.dumps(dict(os.environ)), file=sys.__stdout__)
atexit.register(report)
sys.argv = ["tandem.train", *sys.argv[1:]]
runpy.run_module("tandem.train", run_name="__main__", alter_sys=True)
"""


def train_cli(
    *overrides: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The finished child and the heavy modules it had imported. ``env``: the child's whole
    environment (this one's by default), with ``PYTHONPATH`` pointing here."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *overrides],
        capture_output=True,
        text=True,
        timeout=300,
        env={**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    heavy, _ = proc.stdout.strip().splitlines()[-2:]
    return proc, json.loads(heavy)


def child_environment(proc: subprocess.CompletedProcess) -> dict[str, str]:
    """The environment the child of ``train_cli`` had when it exited."""
    return json.loads(proc.stdout.strip().splitlines()[-1])
