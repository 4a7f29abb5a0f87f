"""Throughput and worst-case latency of the ``boxed_math`` reward: ``python benchmarks/reward.py``.

Prints one JSON object:
- ``ours``: verifications per second on the test corpus (``tests/rewards/corpus.jsonl``), with
  the pool warm, for 2 workers and for 1, and the agreement with the corpus labels;
- ``math_verify``: the same for math-verify on this machine, where it is installed. It runs in
  a child process, one item at a time, on the corpus without its adversarial part: its
  timeouts are signals, which cannot stop C-level arithmetic such as ``9^{9^{9^9}}``, so one
  such item could hang the benchmark. Its agreement is lower partly by design: it reads answers
  outside ``\\boxed{}``, which our corpus scores 0 (``no_box``);
- ``batch64``: the wall time of one batch of 64 (47 ordinary items, the 16 first adversarial
  items of the corpus, and one item that only the 2 s deadline stops), target under 3 s.

What this file leaves out: correctness assertions (the tests hold those).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "rewards" / "corpus.jsonl"
# A 10x10 symbolic determinant: it passes every guard and sympy expands it for minutes.
STUCK = (
    r"\boxed{\begin{vmatrix}"
    + r" \\ ".join(" & ".join(f"x_{{{i}{j}}}" for j in range(10)) for i in range(10))
    + r"\end{vmatrix}}"
)


def load(adversarial: bool = True) -> list[dict]:
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    return [r for r in rows if adversarial or r["tag"] != "adversarial"]


def agreement(rows: list[dict], scores: list[float]) -> float:
    hits = sum((s == 1.0) == r["correct"] for r, s in zip(rows, scores, strict=True))
    return round(hits / len(rows), 4)


def bench_ours(rows: list[dict], workers: int, repeat: int) -> dict:
    from tandem.rewards import BoxedMathReward

    responses, golds = [r["response"] for r in rows], [r["gold"] for r in rows]
    with BoxedMathReward(workers=workers) as reward:
        start = time.perf_counter()
        reward.score([r"\boxed{x+1}"], ["1+x"])  # starts the pool
        startup = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(repeat):
            scores = reward.score(responses, golds)
        elapsed = time.perf_counter() - start
    return {
        "items": len(rows),
        "verifications_per_s": round(repeat * len(rows) / elapsed, 1),
        "agreement": agreement(rows, scores),
        "pool_start_s": round(startup, 3),
    }


def bench_batch64() -> dict:
    from tandem.rewards import BoxedMathReward, count_reasons

    rows = load()
    ordinary = [r for r in rows if r["tag"] != "adversarial"][:47]
    adversarial = [r for r in rows if r["tag"] == "adversarial"][:16]
    batch = ordinary + adversarial + [{"response": STUCK, "gold": "0"}]
    with BoxedMathReward(timeout=2.0, workers=2) as reward:
        reward.score([r"\boxed{x+1}"], ["1+x"])
        start = time.perf_counter()
        verdicts = reward.verify([r["response"] for r in batch], [r["gold"] for r in batch])
        wall = time.perf_counter() - start
    return {
        "items": len(batch),
        "adversarial": len(adversarial) + 1,
        "wall_s": round(wall, 3),
        "target_s": 3.0,
        "reasons": count_reasons(verdicts),
    }


def math_verify_child(repeat: int) -> None:
    """Run in a child process: math-verify on the non-adversarial corpus; prints JSON."""
    from math_verify import parse, verify

    rows = load(adversarial=False)
    start = time.perf_counter()
    for _ in range(repeat):
        scores = []
        for r in rows:
            gold = parse(f"${r['gold']}$") or parse(r["gold"])
            answer = parse(r["response"])
            scores.append(1.0 if gold and answer and verify(gold, answer) else 0.0)
    elapsed = time.perf_counter() - start
    print(
        json.dumps(
            {
                "items": len(rows),
                "verifications_per_s": round(repeat * len(rows) / elapsed, 1),
                "agreement": agreement(rows, scores),
                "processes": 1,
            }
        )
    )


def bench_math_verify(repeat: int) -> dict:
    try:
        import math_verify  # noqa: F401 - only checking that it is installed
    except ImportError:
        return {"skipped": "math-verify is not installed (pip install math-verify)"}
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--math-verify-child", "--repeat", str(repeat)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    except subprocess.TimeoutExpired:
        return {"skipped": "math-verify did not finish within 600 s"}
    if proc.returncode != 0:
        return {"skipped": f"math-verify failed: {proc.stderr.strip()[-300:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="passes over the corpus")
    parser.add_argument("--math-verify-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.math_verify_child:
        math_verify_child(args.repeat)
        return
    sys.path.insert(0, str(ROOT))
    ordinary = load(adversarial=False)
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "ours": {
            "corpus_2_workers": bench_ours(load(), workers=2, repeat=args.repeat),
            "no_adversarial_2_workers": bench_ours(ordinary, workers=2, repeat=args.repeat),
            "no_adversarial_1_worker": bench_ours(ordinary, workers=1, repeat=args.repeat),
        },
        "math_verify": bench_math_verify(args.repeat),
        "batch64": bench_batch64(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
