"""Reading a claim's metric from one interval: every kind of verdict, its wording, the margins,
the minimal detectable effect, seeds needed and Holm's correction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tandem.analysis.claims import (
    CLAIMS,
    Margin,
    after_holm,
    difference_interval,
    holm,
    paper_difference,
    read,
    t_interval,
)
from tandem.analysis.mixed import Arm, difference

ON_PAR, HANDOFF, DRIFT, LEGIBILITY = CLAIMS
TWO = Margin(0.02, "two points")


def seeds(trl: list[float], grpo: list[float]):
    """Tandem RL minus GRPO from per-seed figures alone (no problem level)."""
    return difference([Arm(np.array([trl])), Arm(np.array([grpo]))], [1, -1])


def test_t_interval_matches_the_textbook() -> None:
    mean, lo, hi = t_interval([1.0, 2.0, 3.0])
    # sd 1, n 3: half-width t(0.975, 2) / sqrt(3) = 4.3027 / 1.7321
    assert mean == 2.0 and hi - mean == pytest.approx(2.4841, abs=1e-4) and lo < mean
    assert math.isnan(t_interval([0.5])[1])


def test_without_a_problem_level_the_interval_is_welchs() -> None:
    trl, grpo = [1.0, 2.0, 3.0], [0.0, 1.0, 2.0]
    diff, lo, hi = difference_interval(trl, grpo)
    got_lo, got_hi = seeds(trl, grpo).interval()
    assert float(got_lo[0]) == pytest.approx(lo) and float(got_hi[0]) == pytest.approx(hi)
    # equal variances 1 and sizes 3: se sqrt(2/3), df 4, t(0.975, 4) = 2.7764
    assert hi - diff == pytest.approx(2.7764 * math.sqrt(2 / 3), abs=1e-3)


def test_a_better_than_claim_reproduces_goes_the_other_way_or_is_undecided() -> None:
    said = read(HANDOFF, "handoff/pass@1", seeds([0.6, 0.61, 0.62], [0.5, 0.5, 0.51]), TWO)
    assert said.verdict == "Reproduces" and said.primary
    assert said.sentence.startswith("Reproduces: Tandem RL minus GRPO +0.107, 95% interval")
    # lower is better for drift: a higher KL clear of zero is the opposite direction
    kl = Margin(0.004, "the paper's")
    said = read(DRIFT, "drift/kl", seeds([0.03, 0.031, 0.03], [0.02, 0.021, 0.02]), kl)
    assert said.verdict == "Opposite direction"
    # an interval holding zero and reaching past the margin: undecided, never "the same"
    said = read(HANDOFF, "handoff/pass@1", seeds([0.5, 0.6, 0.55], [0.55, 0.5, 0.6]), TWO)
    assert said.verdict.startswith("No detectable difference (undecided")
    assert not said.primary and "same" not in said.sentence


def test_a_tight_interval_inside_the_margin_is_equivalent_not_undecided() -> None:
    said = read(HANDOFF, "handoff/pass@1", seeds([0.5, 0.502, 0.501], [0.501, 0.5, 0.502]), TWO)
    assert said.verdict == "Equivalent within ±0.02: no effect as large as the margin"


def test_on_par_is_an_equivalence_test_at_the_stated_margin() -> None:
    trl, grpo = [0.5, 0.52, 0.51], [0.5, 0.51, 0.52]
    # difference 0; 90% Welch half-width t(0.95, 4) * sqrt(2 * 1e-4 / 3) = 2.132 * 0.00816
    said = read(ON_PAR, "solo/pass@1", seeds(trl, grpo), TWO)
    assert said.verdict == "On par within ±0.02" and said.primary
    assert "90% interval [-0.017, +0.017] against ±0.02" in said.sentence
    # the same seeds cannot show equivalence within a narrower margin: undecided
    said = read(ON_PAR, "solo/pass@1", seeds(trl, grpo), Margin(0.01, "one point"))
    assert said.verdict.startswith("Undecided: no detectable difference, not shown on par")
    # arms far apart: not on par
    said = read(ON_PAR, "solo/pass@1", seeds([0.9, 0.91, 0.9], [0.5, 0.51, 0.5]), TWO)
    assert said.verdict == "Not on par: the arms differ"
    # one seed per arm gives no interval, so no verdict
    said = read(ON_PAR, "solo/pass@1", seeds([0.5], [0.5]), TWO)
    assert said.verdict == "No interval" and math.isnan(said.p)


def test_minimal_detectable_effect_and_seeds_needed() -> None:
    est = seeds([0.5, 0.52, 0.51], [0.5, 0.51, 0.52])
    said = read(HANDOFF, "handoff/pass@1", est, TWO)
    # se 0.00816, df 4: (t(0.975) + t(0.8)) * se = (2.776 + 0.941) * 0.00816
    assert said.mde == pytest.approx(3.717 * 0.008165, rel=1e-3)
    # the margin (0.02): (t(0.975) + t(0.8)) * sqrt(2e-4 / n) on 2(n - 1) degrees of freedom
    # is 3.195 * 0.00632 = 0.0202 at n = 5, 3.107 * 0.00577 = 0.0179 at n = 6
    assert said.effect == 0.02 and said.effect_from == "the margin" and said.seeds == 6
    # a claim with the paper's figures is planned for the paper's difference
    kl = read(DRIFT, "drift/kl", seeds([0.02, 0.021, 0.02], [0.02, 0.021, 0.02]), TWO)
    assert kl.effect == pytest.approx(0.004) and kl.effect_from == "the paper"
    assert paper_difference("drift/kl") == pytest.approx(-0.004)
    assert paper_difference("handoff/pass@1") is None


def test_holm_adjusts_step_down() -> None:
    # sorted 0.01, 0.02, 0.04 of 3: 0.03, max(0.03, 0.04), max(0.04, 0.04)
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.5, math.nan, 0.001])[1] != holm([0.5, math.nan, 0.001])[1]  # NaN stays
    assert holm([0.5, math.nan, 0.001])[2] == pytest.approx(0.002)
    said = read(HANDOFF, "handoff/pass@1", seeds([0.6, 0.61, 0.62], [0.5, 0.5, 0.51]), TWO)
    assert after_holm(said, 0.01).startswith("holds")
    assert after_holm(said, 0.2).startswith("not after Holm")


def test_a_margin_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Margin(0.0, "none")
