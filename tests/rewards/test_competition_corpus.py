"""The stricter verifier: agreement on competition-style answers, its new rules, and the deadline.

``corpus_competition.jsonl`` holds AMC/AIME/MATH/Minerva-style answers, each form with near-miss
negatives, in the format of ``corpus.jsonl`` (``reason`` is left ``null``: only the score is
labelled). ``python benchmarks/agreement.py`` prints the same measurement, and math-verify's
where it is installed.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from tandem.rewards import BoxedMathReward
from tandem.rewards.extract import FinalAnswer, final_answer
from tandem.rewards.verify import verify_answer

CORPUS = Path(__file__).with_name("corpus_competition.jsonl")
REQUIRED_TAGS = {
    "fractions", "radicals", "pi", "intervals", "sets", "set_notation", "tuples", "degrees",
    "units", "percent", "scientific", "matrices", "text", "words_case", "choices", "equations",
    "closed_forms", "multi_box", "symbolic", "complex", "integers", "bases", "decimals",
    "brackets", "code_gold",
}  # fmt: skip
# A sum sympy evaluates term by term for minutes: a closed form only the deadline can stop.
SLOW = r"\sum_{k=1}^{100000} \frac{1}{k^3+k+1}"
DEADLINE = 0.5


def boxed(answer: str) -> str:
    return f"The final answer is $\\boxed{{{answer}}}$."


@pytest.fixture(scope="module")
def reward():
    with BoxedMathReward(timeout=2.0, workers=2) as r:
        yield r


def test_corpus_covers_every_form_with_near_miss_negatives():
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 200
    tags = Counter(r["tag"] for r in rows)
    assert set(tags) >= REQUIRED_TAGS, f"missing tags: {REQUIRED_TAGS - set(tags)}"
    negatives = Counter(r["tag"] for r in rows if not r["correct"])
    assert all(negatives[t] >= 1 for t in tags), f"tags without a negative: {tags - negatives}"


def test_agreement_is_at_least_98_percent_with_no_false_positive(reward):
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    scores = reward.score([r["response"] for r in rows], [r["gold"] for r in rows])
    misses = [(r, s) for r, s in zip(rows, scores, strict=True) if (s == 1.0) != r["correct"]]
    agreement = 1 - len(misses) / len(rows)
    report = "\n".join(f"{r['tag']}: {r['response'][-70:]!r} vs {r['gold']!r}" for r, _ in misses)
    print(f"agreement {agreement:.2%} on {len(rows)} items; disagreements:\n{report}")
    false_positives = [r for r, s in misses if s == 1.0]
    assert not false_positives, f"false positives:\n{report}"
    assert agreement >= 0.98, f"agreement {agreement:.2%} < 98%:\n{report}"


@pytest.mark.parametrize("tag", ["brackets", "code_gold"])
def test_square_bracket_grouping_and_golds_written_as_code_agree_item_by_item(reward, tag):
    # the misses of real model outputs: `\left[ ... \right]` grouping one value, and a gold in
    # NumPy syntax; each beside near misses that must stay wrong (an interval stays one)
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if r["tag"] == tag]
    scores = reward.score([r["response"] for r in rows], [r["gold"] for r in rows])
    wrong = [(r["response"], r["gold"], s) for r, s in zip(rows, scores, strict=True)
             if (s == 1.0) != r["correct"]]  # fmt: skip
    assert len(rows) >= 10 and not wrong, wrong


# -- several boxes ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"roots $\boxed{2}$ and $\boxed{3}$.", FinalAnswer("2, 3", 2)),
        (r"$x_1 = \boxed{-1}$, $x_2 = \boxed{5}$", FinalAnswer("-1, 5", 2)),
        (r"$\boxed{7}$ \quad $\boxed{7}$", FinalAnswer("7", 2)),
        (r"$\boxed{2}$ or maybe $\boxed{3}$", FinalAnswer("2, 3", 2, hedged=True)),
        (r"it is either $\boxed{2}$ or $\boxed{3}$", FinalAnswer("2, 3", 2, hedged=True)),
        # other words between boxes: a correction, only the last box counts
        (r"I guessed $\boxed{4}$, but in fact it is $\boxed{6}$", FinalAnswer("6")),
        (r"$\boxed{\boxed{5}}$", FinalAnswer("5")),
        (r"$\boxed{1}$" + " " * 80 + r"$\boxed{2}$", FinalAnswer("2")),  # too far apart
        (r"$\boxed{1}$ and $\boxed{2", None),
    ],
)
def test_final_answer_groups_listed_boxes_and_flags_hedges(text, expected):
    assert final_answer(text) == expected


def test_grouping_stays_fast_on_many_boxes():
    start = time.perf_counter()
    assert final_answer(r"\boxed{1} " * 20_000) == FinalAnswer("1", 20)  # a group stops at 20
    assert final_answer("\\boxed{" * 10_000 + "}") == FinalAnswer("")
    assert time.perf_counter() - start < 0.5


def test_hedged_boxes_score_zero_even_when_one_is_right(reward):
    responses = [
        r"The answer is $\boxed{2}$ or maybe $\boxed{3}$.",
        r"It is $\boxed{3}$ or perhaps $\boxed{2}$.",
        r"The roots are $\boxed{2}$ and $\boxed{3}$.",
        r"The roots are $\boxed{2}$ and $\boxed{3}$.",
        r"The roots are $\boxed{3}$ and $\boxed{2}$.",
    ]
    golds = ["2", "2", "2", "3", "2, 3"]
    verdicts = reward.verify(responses, golds)
    assert [v.score for v in verdicts] == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert verdicts[0].reason == "wrong"


# -- rules of the comparison ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "gold", "score"),
    [
        (r"\text{No}", "no", 1.0), (r"\text{No}", "yes", 0.0), ("three", "3", 1.0),
        ("Twenty-one", "21", 1.0), ("three", "4", 0.0), ("x = 4", "4", 1.0),
        ("x = 4", "x=5", 0.0), ("a + b = 4", "4", 1.0), ("x + 1 = 4", "4", 0.0),
        ("(x, y) = (0, 1)", "(0, 1)", 1.0), ("(x, y) = (1, 0)", "(0, 1)", 0.0),
        ("(x, x) = (0, 1)", "(0, 1)", 0.0), (r"S = \{1, 2\}", r"\{2, 1\}", 1.0),
        ("x = 3", "y = 3", 0.0), (r"\textbf{(C)}\ 12", "C", 1.0),
        (r"\textbf{(C)}\ 12", "12", 1.0), (r"\textbf{(C)}\ 12", "D", 0.0), ("c", "(C)", 1.0),
        ("E", "e", 0.0),
        (r"\mathbb{R} \setminus \{0\}", r"(-\infty,0)\cup(0,\infty)", 1.0),
        (r"\mathbb{R} \setminus \{0\}", r"(-\infty,0]\cup(0,\infty)", 0.0),
        (r"[0, 5] \setminus \{1\}", r"[0,1)\cup(1,5]", 1.0),
        (r"\lim_{x \to 0} \frac{\sin x}{x}", "1", 1.0),
        (r"\lim_{x \to 0^+} \frac{1}{x}", r"\infty", 1.0),
        (r"\int_0^1 x^2 \, dx", r"\frac13", 1.0), (r"\int x^2 \, dx", r"\frac{x^3}{3}", 0.0),
        (r"\sum_{k=1}^{10} k", "55", 1.0), (r"\frac{2^{2^{3}}}{2^{8}}", "1", 1.0),
        (r"\frac{2^{2^{3}}}{2^{7}}", "1", 0.0),
    ],
)  # fmt: skip
def test_comparison_rules(content, gold, score):
    assert verify_answer(content, gold).score == score


# -- the deadline -----------------------------------------------------------------------------
def test_a_closed_form_past_the_deadline_is_killed_and_the_batch_is_still_scored():
    items = [(SLOW, "1")] + [(rf"\frac{{{2 * k}}}{{4}}", str(k / 2)) for k in range(1, 7)]
    items += [(r"\int_0^1 x^2 \, dx", r"\frac13"), ("7", "8")]
    with BoxedMathReward(timeout=DEADLINE, workers=2) as r:
        r.score([boxed("x+1")], ["1+x"])  # start the workers outside the timed part
        pids = set(r._pool.pids())
        start = time.monotonic()
        verdicts = r.verify([boxed(c) for c, _ in items], [g for _, g in items])
        elapsed = time.monotonic() - start
        survivors = pids & set(r._pool.pids())
    assert verdicts[0].reason == "timeout"
    assert [v.reason for v in verdicts[1:]] == ["correct"] * 7 + ["wrong"]
    assert len(survivors) == 1, "the worker holding the slow item must have been replaced"
    assert elapsed < DEADLINE + 1.5, f"a {DEADLINE} s deadline took {elapsed:.2f} s"
