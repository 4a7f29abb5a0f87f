"""The boxed_math reward: the corpus at 100% agreement, extraction, guards, config, interface.

The corpus (``corpus.jsonl``, beside this file) holds ``response``, ``gold``, the expected
verdict ``correct``, the expected ``reason`` where it is certain, and a ``tag`` naming the form
it covers. Deadline and process behaviour are in ``test_reward_pool.py``.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tandem.registry import REWARDS
from tandem.rewards import REASONS, BoxedMathReward, count_reasons
from tandem.rewards.answer import Refused
from tandem.rewards.extract import extract_boxed
from tandem.rewards.parse import parse_answer
from tandem.rewards.verify import WORKER_RECURSION_LIMIT, quick_verdict, verify_answer

CORPUS = Path(__file__).with_name("corpus.jsonl")
CONFIG = Path(__file__).parents[2] / "conf" / "reward" / "boxed_math.yaml"
REQUIRED_TAGS = {
    "extraction", "fractions", "roots", "delimiters", "text_units", "degrees", "percent",
    "dollars", "thousands", "trailing_period", "assignment", "empty_set", "repeating",
    "leading_zeros", "mixed_numbers", "bases", "scientific", "tolerance", "symbolic",
    "imaginary", "intervals", "sets_tuples", "matrices", "relations", "plain_gold", "adversarial",
}  # fmt: skip


def load_corpus() -> list[dict]:
    return [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def worker_recursion_limit():
    """Workers parse with a raised recursion limit (deep nesting recurses); do so here too."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(WORKER_RECURSION_LIMIT)
    yield
    sys.setrecursionlimit(old)


@pytest.fixture(scope="module")
def reward():
    with BoxedMathReward(timeout=2.0, workers=2) as r:
        yield r


# -- the corpus -------------------------------------------------------------------------------
def test_corpus_is_large_varied_and_has_near_miss_negatives():
    rows = load_corpus()
    assert len(rows) >= 200
    negatives = sum(not r["correct"] for r in rows)
    assert negatives / len(rows) >= 0.40, f"only {negatives}/{len(rows)} negatives"
    tags = Counter(r["tag"] for r in rows)
    assert set(tags) >= REQUIRED_TAGS, f"missing tags: {REQUIRED_TAGS - set(tags)}"
    assert max(len(r["response"]) for r in rows) >= 50_000  # the 50 kB responses are there


def test_corpus_agreement_is_total(reward):
    rows = load_corpus()
    verdicts = reward.verify([r["response"] for r in rows], [r["gold"] for r in rows])
    wrong = [
        f"{r['tag']}: {r['response'][-80:]!r} vs {r['gold']!r}: expected "
        f"{r['correct']}/{r['reason']}, got {v}"
        for r, v in zip(rows, verdicts, strict=True)
        if (v.score == 1.0) != r["correct"] or (r["reason"] and r["reason"] != v.reason)
    ]
    assert not wrong, f"{len(wrong)} disagreements:\n" + "\n".join(wrong)


# -- extraction -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "content"),
    [
        (r"so \boxed{5}.", "5"),
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{1}{\sqrt{2}}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{a\}b}", r"a\}b"),
        (r"$\boxed 42$.", "42"),
        ("\\boxed 7\nmore text", "7"),
        (r"\fbox{3}", "3"),
        (r"\boxed {3}", "3"),
        (r"\boxed{1} and at the end \boxed{2", None),  # the last box is unclosed
        (r"\boxed", None),
        (r"\boxed.", None),
        (r"\boxedanswer{5}", None),
        ("boxed{5}", None),
        ("the answer is 5", None),
        ("", None),
    ],
)
def test_extract_boxed(text, content):
    assert extract_boxed(text) == content


def test_extraction_is_linear_on_50kb_and_many_open_boxes():
    text = "\\boxed{" * 10_000 + "x" * 50_000
    start = time.perf_counter()
    assert extract_boxed(text) is None
    assert extract_boxed("word " * 10_000 + r"\boxed{7}") == "7"
    assert time.perf_counter() - start < 0.5


# -- guards and in-process decisions ----------------------------------------------------------
@pytest.mark.parametrize(
    "answer",
    ["9^{9^{9^9}}", "10^{10^{10}}", "100000!", "(10^{100})!", r"\binom{10^9}{5}", "x^{10^6}",
     "2^{-100000}", "1e99999999", r"\sqrt{2^{99999}+1}", "(" * 400 + "1" + ")" * 400],
)  # fmt: skip
@pytest.mark.usefixtures("worker_recursion_limit")
def test_costly_answers_are_refused_before_evaluation(answer):
    start = time.perf_counter()
    with pytest.raises(Refused):
        parse_answer(answer)
    assert time.perf_counter() - start < 0.5


def test_cheap_items_never_reach_the_pool(monkeypatch):
    reward = BoxedMathReward()

    def no_pool():
        raise AssertionError("a cheap item was sent to the worker pool")

    monkeypatch.setattr(reward, "_get_pool", no_pool)
    verdicts = reward.verify(
        [r"\boxed{42}", r"\boxed{007}", r"\boxed{41}", "no box", r"\boxed{\frac12}"],
        ["42", "7", "42", "1", r"\frac12"],
    )
    assert [v.reason for v in verdicts] == ["correct", "correct", "wrong", "no_box", "correct"]


@pytest.mark.parametrize(
    ("content", "gold", "expected"),
    [("12", "12", 1.0), ("-3", "3", 0.0), ("0012", "12", 1.0), ("$5$.", "5", 1.0)],
)
def test_quick_verdict_on_plain_integers(content, gold, expected):
    assert quick_verdict(content, gold).score == expected


def test_quick_verdict_leaves_everything_else_to_the_parser():
    assert quick_verdict("1,000", "1000") is None
    assert quick_verdict("0.5", r"\frac12") is None


def test_verify_answer_reports_each_reason_in_process():
    assert verify_answer(r"\frac{2}{4}", "0.5").reason == "correct"
    assert verify_answer(r"\frac{3}{2}", r"\frac23").reason == "wrong"
    assert verify_answer(r"\frac{1}{", "1").reason == "unparsable"


# -- interface, registry, config --------------------------------------------------------------
def test_score_is_the_verdicts_scores(reward):
    responses = [r"\boxed{\frac12}", r"\boxed{3}", "none"]
    golds = ["0.5", "4", "1"]
    assert reward.score(responses, golds) == [v.score for v in reward.verify(responses, golds)]
    assert reward.score(responses, golds) == [1.0, 0.0, 0.0]


def test_misaligned_batches_raise_with_both_lengths(reward):
    with pytest.raises(ValueError, match=r"3 responses but 2 golds"):
        reward.score(["a", "b", "c"], ["1", "2"])


def test_non_string_responses_and_golds_do_not_raise(reward):
    assert reward.score([None, r"\boxed{5}"], ["1", 5]) == [0.0, 1.0]  # type: ignore[list-item]


def test_count_reasons_names_every_reason(reward):
    verdicts = reward.verify([r"\boxed{1}", "x", r"\boxed{2}"], ["1", "1", "1"])
    assert count_reasons(verdicts) == {
        "correct": 1, "wrong": 1, "no_box": 1, "unparsable": 0, "timeout": 0,
    }  # fmt: skip
    assert set(count_reasons([])) == set(REASONS)


def test_bad_constructor_arguments_are_all_reported():
    with pytest.raises(ValueError) as err:
        BoxedMathReward(timeout=0, workers=0, rel_tol=2.0)
    message = str(err.value)
    assert "timeout (0)" in message and "workers (0)" in message and "rel_tol (2.0)" in message


def test_unusable_start_method_is_refused():
    with pytest.raises(ValueError, match="'fork' is unsafe"):
        BoxedMathReward(start_method="fork").score([r"\boxed{x+1}"], ["1+x"])


def test_registered_and_built_from_its_config():
    assert REWARDS.get("boxed_math") is BoxedMathReward
    config = OmegaConf.to_container(OmegaConf.load(CONFIG))
    reward = REWARDS.build(config.pop("name"), **config)
    assert isinstance(reward, BoxedMathReward)
    assert (reward.timeout, reward.workers, reward.rel_tol) == (2.0, 2, 1e-9)


def test_pickles_without_its_processes(reward):
    reward.score([r"\boxed{x+1}"], ["1+x"])  # make sure a pool exists
    clone = pickle.loads(pickle.dumps(reward))
    assert clone._pool is None
    assert clone.timeout == reward.timeout
