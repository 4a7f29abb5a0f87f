"""Judging the claims: intervals and the wording of every kind of verdict."""

from __future__ import annotations

import math

import pytest

from tandem.analysis.claims import (
    CLAIMS,
    difference_interval,
    equivalence_verdict,
    t_interval,
    verdict,
)

ON_PAR, HANDOFF, DRIFT, LEGIBILITY = CLAIMS


def test_t_interval_matches_the_textbook() -> None:
    mean, lo, hi = t_interval([1.0, 2.0, 3.0])
    # sd 1, n 3: half-width t(0.975, 2) / sqrt(3) = 4.3027 / 1.7321
    assert mean == 2.0 and hi - mean == pytest.approx(2.4841, abs=1e-4) and lo < mean
    assert math.isnan(t_interval([0.5])[1])


def test_difference_interval_is_welchs() -> None:
    # equal variances 1 and sizes 3: se sqrt(2/3), df 4, t(0.975, 4) = 2.7764
    diff, lo, hi = difference_interval([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])
    assert diff == pytest.approx(1.0)
    assert hi - diff == pytest.approx(2.7764 * math.sqrt(2 / 3), abs=1e-3)
    assert diff - lo == pytest.approx(hi - diff)


def test_an_interval_containing_zero_is_no_detectable_difference_whichever_way() -> None:
    # the paper's direction (higher overlap) and the other one: neither is a finding
    for trl, grpo in (
        ([0.92, 0.95, 0.85], [0.85, 0.9, 0.95]),
        ([0.85, 0.9, 0.95], [0.92, 0.95, 0.85]),
    ):
        said = verdict(LEGIBILITY, "legibility/overlap", trl, grpo)
        assert said.startswith("No detectable difference"), said
        assert "contains zero" in said and "other way" not in said


def test_an_interval_clear_of_zero_reproduces_or_goes_the_opposite_way() -> None:
    said = verdict(HANDOFF, "handoff/pass@1", [0.6, 0.61, 0.62], [0.5, 0.5, 0.51])
    assert said.startswith("Reproduces: Tandem RL minus GRPO +0.107"), said
    # lower is better for drift: a higher KL clear of zero is the opposite direction
    said = verdict(DRIFT, "drift/kl", [0.03, 0.031, 0.03], [0.02, 0.021, 0.02])
    assert said.startswith("Opposite direction (interval clear of zero)"), said
    said = verdict(DRIFT, "drift/kl", [0.02, 0.021, 0.02], [0.03, 0.031, 0.03])
    assert said.startswith("Reproduces"), said


def test_on_par_is_equivalence_within_the_stated_margin() -> None:
    trl, grpo = [0.5, 0.52, 0.51], [0.5, 0.51, 0.52]
    # difference 0; 90% Welch half-width t(0.95, 4) * sqrt(2 * 1e-4 / 3) = 2.132 * 0.00816
    said = verdict(ON_PAR, "solo/pass@1", trl, grpo, margin=0.02)
    assert said.startswith("Equivalent within ±0.02"), said
    assert "90% interval [-0.017, +0.017]" in said
    # the same seeds cannot show equivalence within a margin narrower than the interval
    said = verdict(ON_PAR, "solo/pass@1", trl, grpo, margin=0.01)
    assert said.startswith("Not shown equivalent within ±0.01"), said
    assert "no detectable difference either" in said
    # arms far apart: not equivalent, and they differ
    said = verdict(ON_PAR, "solo/pass@1", [0.9, 0.91, 0.9], [0.5, 0.51, 0.5])
    assert said.startswith("Not shown equivalent within ±0.02") and "the arms differ" in said
    # one seed per arm gives no interval, so no equivalence
    assert equivalence_verdict([0.5], [0.5], 0.02).startswith("Not shown equivalent")


def test_tandems_own_measurements_are_judged_against_their_reference() -> None:
    assert verdict(DRIFT, "pulled_back", [0.9, 0.92, 0.88], []).startswith("Reproduces: 90%")
    said = verdict(DRIFT, "pulled_back", [0.3, 0.4, 0.35], [])
    assert said.startswith("Opposite direction (interval clear of 50%)"), said
    said = verdict(DRIFT, "pulled_back", [0.3, 0.7, 0.5], [])
    assert said.startswith("No detectable difference from 50%"), said
    said = verdict(DRIFT, "pullback_rho", [-0.6, -0.5, -0.55], [])
    assert said.startswith("Reproduces: mean Spearman rho -0.550"), said
    said = verdict(DRIFT, "pullback_rho", [0.6, 0.5, 0.55], [])
    assert said.startswith("Opposite direction (interval clear of zero)"), said
    said = verdict(DRIFT, "pullback_rho", [-0.7], [])
    assert said.startswith("No interval with one seed") and "the paper's side of zero" in said
    assert verdict(DRIFT, "pulled_back", [], []).startswith("Not measured")


def test_a_claim_is_read_against_the_seed_to_seed_null() -> None:
    from tandem.analysis.claims import null_verdict, reading, seed_pair_differences

    drift, handoff, solo = CLAIMS[2], CLAIMS[1], CLAIMS[0]
    grpo = {0: 0.020, 1: 0.030, 2: 0.025}
    assert seed_pair_differences(grpo) == pytest.approx([-0.010, -0.005, 0.005])
    # lower drift, clear of zero but by less than two GRPO seeds differ: within the null
    trl = {0: 0.011, 1: 0.012, 2: 0.013}
    assert verdict(drift, "drift/kl", list(trl.values()), list(grpo.values())).startswith(
        "Reproduces"
    )
    assert reading(null_verdict(drift, "drift/kl", trl, grpo)) == "Within the null"
    # far lower: beyond the null's spread
    low = {0: 0.001, 1: 0.002, 2: 0.0015}
    assert reading(null_verdict(drift, "drift/kl", low, grpo)) == "Reproduces against the null"
    high = {0: 0.06, 1: 0.061, 2: 0.062}
    assert reading(null_verdict(drift, "drift/kl", high, grpo)).startswith("Opposite")
    # higher is better for handoff accuracy
    better = {0: 0.5, 1: 0.51, 2: 0.52}
    acc = {0: 0.30, 1: 0.31, 2: 0.32}
    assert "against the null" in null_verdict(handoff, "handoff/pass@1", better, acc)
    # on par: the 90% interval inside the null's spread
    wide = {0: 0.30, 1: 0.36, 2: 0.33}
    assert reading(null_verdict(solo, "solo/pass@1", {0: 0.33, 1: 0.32, 2: 0.34}, wide)) == (
        "On par against the null"
    )
    assert reading(null_verdict(solo, "solo/pass@1", better, acc)).startswith("Not shown")
    assert reading(null_verdict(drift, "drift/kl", trl, {0: 0.02})) == "No null"
