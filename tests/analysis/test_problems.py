"""Problem-level intervals: per-problem pass@k from the generations matches the evaluation's own
figure, the paired bootstrap on differences with a known answer, and coverage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.analysis.problems import (
    arm_pass,
    coverage,
    paired_bootstrap,
    pass_at_k,
    problem_counts,
    union_coverage,
)


def test_per_problem_pass_at_k_matches_the_evaluations_table(eval_outputs: Path) -> None:
    folder = eval_outputs / "results" / "base"
    table = json.loads((folder / "results.json").read_text())["sets"]["tiny"]
    for mode in ("solo", "handoff"):
        counts = problem_counts(folder / "generations", ["tiny"], mode)
        assert len(counts["tiny"]) == 3 and all(n == 2 for _, n in counts["tiny"].values())
        for k in (1, 2):
            per_problem = arm_pass([counts], k)["tiny"]
            mean = sum(per_problem.values()) / len(per_problem)
            assert mean == pytest.approx(table[f"{mode}/pass@{k}"])
    with pytest.raises(FileNotFoundError, match="rerun the study"):
        problem_counts(folder / "generations", ["aime24"], "solo")


def test_pass_at_k_is_the_unbiased_estimate() -> None:
    assert pass_at_k(0, 8, 1) == 0.0 and pass_at_k(8, 8, 8) == 1.0
    assert pass_at_k(2, 8, 1) == pytest.approx(0.25)
    # 1 - C(6, 4) / C(8, 4) = 1 - 15 / 70
    assert pass_at_k(2, 8, 4) == pytest.approx(1 - 15 / 70)
    with pytest.raises(ValueError, match="pass@8 needs at least 8"):
        pass_at_k(1, 4, 8)


def test_paired_bootstrap_finds_a_shift_and_not_a_tie() -> None:
    problems = range(200)
    a = {"s": {p: float(p % 2) for p in problems}}  # solved every other problem
    better = {"s": {p: float(p % 2 or p % 10 == 0) for p in problems}}  # plus 20 more
    found = paired_bootstrap(better, a)
    assert found.difference == pytest.approx(0.1) and found.problems == 200
    assert 0 < found.lo < 0.1 < found.hi
    # the same problems, the same values: a zero difference with a zero-width interval
    tie = paired_bootstrap(a, a)
    assert tie.difference == 0.0 and tie.lo == 0.0 == tie.hi
    # an arm's problems it alone has are left out: the comparison is paired
    extra = {"s": {**a["s"], 999: 1.0}}
    assert paired_bootstrap(extra, a).problems == 200
    with pytest.raises(ValueError, match="no problem"):
        paired_bootstrap({"s": {1: 1.0}}, {"s": {2: 1.0}})


def test_coverage_counts_problems_solved_at_least_once() -> None:
    one = {"a": {0: (0, 8), 1: (3, 8)}, "b": {0: (1, 8)}}
    two = {"a": {0: (2, 8), 1: (0, 8)}, "b": {0: (0, 8)}}
    assert coverage(one) == (2, 3) and coverage(two) == (1, 3)
    assert union_coverage([one, two]) == 3
