"""Score a JSONL file of ``{"response", "gold"}`` lines: ``python -m tandem.rewards FILE.jsonl``.

Prints the accuracy and the number of items per reason; ``--show REASON`` also lists the items
with that reason, which is how one audits what the verifier calls ``wrong`` or ``unparsable``.
What this file leaves out: any option of the reward beyond the timeout and the worker count.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tandem.rewards.boxed_math import BoxedMathReward, count_reasons


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m tandem.rewards", description=__doc__)
    parser.add_argument("file", type=Path, help='JSONL with "response" and "gold" per line')
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per item")
    parser.add_argument("--workers", type=int, default=2, help="verifier processes")
    parser.add_argument("--show", metavar="REASON", help="print the items with this reason")
    args = parser.parse_args(argv)

    responses, golds = [], []
    for n, line in enumerate(args.file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "response" not in row or "gold" not in row:
            parser.error(f"{args.file}:{n} needs keys 'response' and 'gold', has {sorted(row)}")
        responses.append(row["response"])
        golds.append(str(row["gold"]))

    with BoxedMathReward(timeout=args.timeout, workers=args.workers) as reward:
        verdicts = reward.verify(responses, golds)
    total = len(verdicts)
    accuracy = sum(v.score for v in verdicts) / total if total else 0.0
    print(f"items: {total}")
    print(f"accuracy: {accuracy:.4f}")
    for reason, count in count_reasons(verdicts).items():
        print(f"{reason}: {count}")
    if args.show:
        for i, verdict in enumerate(verdicts):
            if verdict.reason == args.show:
                print(f"[{i}] gold={golds[i]!r} response=...{responses[i][-120:]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
