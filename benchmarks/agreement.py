"""Agreement of verifiers with a labelled corpus: ``python benchmarks/agreement.py [CORPUS]``.

The default corpus is ``tests/rewards/corpus_competition.jsonl``: competition-style answers
(AMC, AIME, MATH, Minerva) with near-miss negatives. For ``boxed_math`` and, where it is
installed (``pip install -e '.[bench]'``), for math-verify, prints one JSON object per verifier:
items, agreement, false positives (scored 1, labelled wrong) and false negatives, and with
``--list`` each disagreement. math-verify reads the gold as LaTeX wrapped in ``$...$`` and the
response as a whole, as its documentation shows; each item runs with its own timeout.

What this file leaves out: assertions (``tests/rewards/test_competition_corpus.py`` holds them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "rewards" / "corpus_competition.jsonl"


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def summary(name: str, rows: list[dict], scores: list[float]) -> dict:
    """Agreement and the two kinds of error, with the disagreeing rows."""
    wrong = [(r, s) for r, s in zip(rows, scores, strict=True) if (s == 1.0) != r["correct"]]
    return {
        "verifier": name,
        "items": len(rows),
        "agreement": round(1 - len(wrong) / len(rows), 4),
        "false_positives": sum(s == 1.0 for _, s in wrong),
        "false_negatives": sum(s != 1.0 for _, s in wrong),
        "disagreements": [
            {"tag": r["tag"], "gold": r["gold"], "response": r["response"][-90:], "score": s}
            for r, s in wrong
        ],
    }


def score_ours(rows: list[dict]) -> list[float]:
    from tandem.rewards import BoxedMathReward

    with BoxedMathReward(timeout=2.0, workers=2) as reward:
        return reward.score([r["response"] for r in rows], [r["gold"] for r in rows])


def score_math_verify(rows: list[dict]) -> list[float] | None:
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    scores = []
    for r in rows:
        try:
            gold = parse(f"${r['gold']}$", parsing_timeout=5)
            answer = parse(r["response"], parsing_timeout=5)
            scores.append(1.0 if verify(gold, answer, timeout_seconds=5) else 0.0)
        except Exception:  # a verifier that raises has not said "correct"
            scores.append(0.0)
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", nargs="?", type=Path, default=CORPUS)
    parser.add_argument("--list", action="store_true", help="print every disagreement")
    args = parser.parse_args()
    rows = load(args.corpus)
    for name, scorer in (("boxed_math", score_ours), ("math_verify", score_math_verify)):
        scores = scorer(rows)
        if scores is None:
            print(json.dumps({"verifier": name, "skipped": "not installed"}))
            continue
        result = summary(name, rows, scores)
        if not args.list:
            result.pop("disagreements")
        print(json.dumps(result, indent=1 if args.list else None))


if __name__ == "__main__":
    main()
