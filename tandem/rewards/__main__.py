"""Score a JSONL file of ``{"response", "gold"}`` lines: ``python -m tandem.rewards FILE.jsonl``.

Prints the accuracy and the number of items per reason; ``--show REASON`` also lists the items
with that reason, by line number, which is how one audits what the verifier calls ``wrong`` or
``unparsable``.

A bad line never costs the others their results: a line that is not UTF-8, not JSON, not a JSON
object, lacks ``response`` or ``gold``, or holds a value of the wrong type is reported on stderr
as ``FILE:LINE: why`` and skipped; every other line is scored, and the summary counts the bad
lines. Line numbers are those of the file: only ``\\n`` ends a line (a JSON string may hold a
raw U+2028, which ``str.splitlines`` would count as a break), and blank lines count but are
neither scored nor bad.

Exit status: 0 when every non-blank line was scored; 1 when some lines were bad (the others are
still scored and printed); 2 for a usage error or a file that cannot be read at all (one line on
stderr, no traceback), or one that holds no item at all.

What this file leaves out: any option of the reward beyond the timeout and the worker count.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tandem.rewards.boxed_math import BoxedMathReward, count_reasons

EXIT_OK, EXIT_BAD_LINES, EXIT_USAGE = 0, 1, 2


@dataclass
class Items:
    """The scorable lines of a file, with their line numbers, and the bad lines' reports."""

    lines: list[int] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    golds: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)


def read_items(path: Path, data: bytes) -> Items:
    """Split ``data`` into items; each bad line becomes one ``PATH:LINE: why`` report."""
    items = Items()
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            response, gold = _parse_line(raw)
        except ValueError as err:
            items.bad.append(f"{path}:{number}: {err}")
            continue
        items.lines.append(number)
        items.responses.append(response)
        items.golds.append(gold)
    return items


def _parse_line(raw: bytes) -> tuple[str, str]:
    """The ``(response, gold)`` of one line; ``ValueError`` saying what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"byte {raw[err.start]:#04x} at column {err.start + 1} is not UTF-8; "
            "save the file as UTF-8"
        ) from None
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(row, dict):
        raise ValueError(f"a line must be a JSON object, got a {type(row).__name__}")
    missing = [key for key in ("response", "gold") if key not in row]
    if missing:
        raise ValueError(f"missing key(s) {missing}; a line needs 'response' and 'gold'")
    response, gold = row["response"], row["gold"]
    if not isinstance(response, str):
        raise ValueError(f"'response' must be a string, got {type(response).__name__}")
    # A number is a fine gold (``"gold": 5``); a bool, null, list or object is a mistake.
    if isinstance(gold, bool) or not isinstance(gold, (str, int, float)):
        raise ValueError(f"'gold' must be a string or a number, got {json.dumps(gold)[:40]}")
    return response, str(gold)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (0, 1 or 2, as the module docstring says)."""
    parser = argparse.ArgumentParser(
        prog="python -m tandem.rewards",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", type=Path, help='JSONL with "response" and "gold" per line')
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds per item")
    parser.add_argument("--workers", type=int, default=2, help="verifier processes")
    parser.add_argument("--show", metavar="REASON", help="print the items with this reason")
    args = parser.parse_args(argv)
    try:
        data = args.file.read_bytes()
    except OSError as err:
        print(f"error: cannot read {args.file}: {err.strerror or err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        reward = BoxedMathReward(timeout=args.timeout, workers=args.workers)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE

    items = read_items(args.file, data)
    for report in items.bad:
        print(report, file=sys.stderr)
    if not items.responses and not items.bad:
        # no accuracy to report: a 0.0000 would read as a verifier that rejected everything
        print(f"error: {args.file} holds no items (no non-blank line)", file=sys.stderr)
        return EXIT_USAGE
    with reward:
        verdicts = reward.verify(items.responses, items.golds)
    total = len(verdicts)
    accuracy = sum(v.score for v in verdicts) / total if total else 0.0
    print(f"items: {total}")
    print(f"bad lines: {len(items.bad)}")
    print(f"accuracy: {accuracy:.4f}")
    for reason, count in count_reasons(verdicts).items():
        print(f"{reason}: {count}")
    if args.show:
        for i, verdict in enumerate(verdicts):
            if verdict.reason == args.show:
                print(
                    f"line {items.lines[i]}: gold={items.golds[i]!r} "
                    f"response=...{items.responses[i][-120:]!r}"
                )
    return EXIT_BAD_LINES if items.bad else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
