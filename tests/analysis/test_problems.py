"""Per-problem summaries: each figure rebuilt from them equals the evaluation's own table, the
arms line up on shared problems, and coverage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.analysis.problems import metric_arms, pass_at_k, seen, solved, summarize

FIGURES = ("solo/pass@1", "solo/pass@2", "handoff/pass@1", "handoff/pass@2")
RATIOS = ("drift/kl", "legibility/overlap", "legibility/junior_ce")


def rebuilt(summary: dict, metric: str) -> float:
    """A run's figure from its summaries alone, as the study's model reads it."""
    got = metric_arms({"run": [summary]}, metric)
    assert got is not None, metric
    return float(got[0]["run"].runs[0, 0])


def test_figures_rebuilt_from_the_summaries_equal_the_evaluations_table(
    eval_outputs: Path,
) -> None:
    folder = eval_outputs / "results" / "base"
    table = json.loads((folder / "results.json").read_text())["sets"]["tiny"]
    summary = summarize(folder / "generations", ["tiny"])
    got = summary["tiny"]
    assert got["problems"] == [0, 1, 2] and got["samples"] == {"solo": 2, "handoff": 2}
    for metric in FIGURES:
        assert rebuilt(summary, metric) == pytest.approx(table[metric], abs=1e-12), metric
    # per-token values are kept to 5 decimals in the generations
    for metric in RATIOS:
        assert rebuilt(summary, metric) == pytest.approx(table[metric], abs=1e-5), metric
    # the summaries are small: a few numbers per problem
    assert len(json.dumps(summary)) < 600
    with pytest.raises(FileNotFoundError, match="rerun the study"):
        summarize(folder / "generations", ["aime24"])


def test_pass_at_k_is_the_unbiased_estimate() -> None:
    assert pass_at_k(0, 8, 1) == 0.0 and pass_at_k(8, 8, 8) == 1.0
    assert pass_at_k(2, 8, 1) == pytest.approx(0.25)
    # 1 - C(6, 4) / C(8, 4) = 1 - 15 / 70
    assert pass_at_k(2, 8, 4) == pytest.approx(1 - 15 / 70)
    with pytest.raises(ValueError, match="pass@8 needs at least 8"):
        pass_at_k(1, 4, 8)


def one_set(problems: list[int], solo: list[int]) -> dict:
    n = len(problems)
    return {
        "problems": problems,
        "samples": {"solo": 8, "handoff": 0},
        "solo": solo,
        "handoff": [0] * n,
        **{k: [1.0] * n for k in ("kl", "overlap", "ce")},
        "tokens": [1] * n,
        "chains": [1] * n,
    }


def test_arms_are_compared_on_the_problems_every_run_has() -> None:
    a = {"s": one_set([0, 1, 2], [8, 0, 4])}
    b = {"s": one_set([1, 2, 3], [4, 4, 4])}
    arms, sets = metric_arms({"a": [a], "b": [b]}, "solo/pass@1")
    # problems 1 and 2 only: a solved 0 and 4 of 8, b 4 and 4
    assert arms["a"].runs[0, 0] == pytest.approx(0.25) and arms["b"].runs[0, 0] == 0.5
    assert sets.tolist() == [0, 0]
    # a mode without samples has no figure
    assert metric_arms({"a": [a]}, "handoff/pass@1") is None


def test_coverage_counts_problems_solved_at_least_once() -> None:
    one = {"a": one_set([0, 1], [0, 3]), "b": one_set([0], [1])}
    two = {"a": one_set([0, 1], [2, 0]), "b": one_set([0], [0])}
    assert solved(one, "solo") == {("a", 1), ("b", 0)} and seen(one) == 3
    assert len(solved(one, "solo") | solved(two, "solo")) == 3
