"""The model of seed and problem variance, calibrated on simulated studies with the pages' noise
(``tandem.analysis.simulate``): its false positive rate on equal arms, its coverage, its power
rising with seeds, the calibration row's, and the minimal detectable effect it prints.

Every simulation is seeded; Monte Carlo error bounds are two standard errors of a proportion,
added to the 5% false positive bound and the 2-point coverage bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tandem.analysis.mixed import MACRO, MICRO, Arm, difference, linearize, seeds_needed
from tandem.analysis.simulate import Noise, figures, simulate

# trl's seeds far steadier than grpo's, as on the tiny page (run sd 0.002 against 0.02)
UNEQUAL = Noise(seed_sd=(0.05, 0.25))


def mc(p: float, n: int) -> float:
    """Two standard errors of a proportion ``p`` estimated from ``n`` draws."""
    return 2 * math.sqrt(p * (1 - p) / n)


def run(noise: Noise, seeds: int, shift: float, replicates: int, seed: int = 0):
    counts = simulate(noise, seeds, shift, replicates, np.random.default_rng(seed))
    trl, grpo = figures(counts, noise)
    return difference([trl, grpo], [1, -1])


@pytest.mark.parametrize("noise", [Noise(), UNEQUAL], ids=["equal", "unequal"])
def test_equal_arms_read_different_at_most_five_percent_of_the_time(noise: Noise) -> None:
    replicates = 1000
    lo, hi = run(noise, 3, noise.shift(0.0), replicates).interval()
    rate = float(((lo > 0) | (hi < 0)).mean())
    assert rate <= 0.05 + mc(0.05, replicates), rate


@pytest.mark.parametrize(
    ("noise", "seeds", "sigmas"),
    [(Noise(), 3, 0.0), (UNEQUAL, 3, 0.0), (Noise(), 5, 3.0), (Noise(k=8), 3, 2.0)],
    ids=["equal-3", "unequal-3", "effect-5", "pass@8-3"],
)
def test_coverage_is_within_two_points_of_nominal(noise: Noise, seeds: int, sigmas: float) -> None:
    shift = noise.shift(sigmas * noise.sigma()) if sigmas else noise.shift(0.0)
    truth = noise.truth(shift)
    replicates = 1500
    lo, hi = run(noise, seeds, shift, replicates, seed=1).interval()
    coverage = float(((lo <= truth) & (truth <= hi)).mean())
    # Welch's degrees of freedom make 3 seeds a little conservative (96.5% over 4,000 studies)
    assert abs(coverage - 0.95) <= 0.02 + mc(0.95, replicates), coverage


def test_power_rises_with_seeds() -> None:
    noise = Noise()
    shift = noise.shift(2 * noise.sigma())
    power = []
    for seeds in (3, 5, 10):
        lo, _ = run(noise, seeds, shift, 400, seed=seeds).interval()
        power.append(float((lo > 0).mean()))
    assert power[0] < power[1] < power[2], power
    # a 2-sigma effect: about a third of studies at 3 seeds, nearly all at 10
    assert 0.2 < power[0] < 0.55 and power[2] > 0.9, power


def test_the_calibration_row_covers_zero() -> None:
    """One GRPO seed against the other two of the same arm, one pooled seed variance (one
    degree of freedom: conservative, see ``difference``)."""
    noise = Noise()
    counts = simulate(noise, 3, 0.0, 1000, np.random.default_rng(2))
    _, grpo = figures(counts, noise)
    one = Arm(grpo.runs[:, :1], grpo.contributions[:, :1])
    rest = Arm(grpo.runs[:, 1:], grpo.contributions[:, 1:])
    lo, hi = difference([one, rest], [1, -1], pooled=True).interval()
    coverage = float(((lo <= 0) & (hi >= 0)).mean())
    assert 0.95 - mc(0.95, 1000) <= coverage <= 0.975, coverage


def test_the_printed_minimal_detectable_effect_is_found_four_times_in_five() -> None:
    noise = Noise()
    planned = run(noise, 5, 0.0, 400, seed=3)
    mde = float(np.median(planned.mde()))
    lo, _ = run(noise, 5, noise.shift(mde), 600, seed=4).interval()
    power = float((lo > 0).mean())
    assert abs(power - 0.8) <= 0.07, (mde, power)
    # seeds needed for that effect, from one study at 3 seeds: about 5
    first = run(noise, 3, 0.0, 1, seed=5)
    assert 3 <= seeds_needed(first, mde) <= 9


def test_a_problem_term_that_seeds_cannot_shrink_says_so() -> None:
    noise = Noise(arm_problem_sd=1.0)
    est = run(noise, 3, 0.0, 1, seed=6)
    assert float(est.problem_var[0]) > 0
    # an effect below what the problem term alone allows: no number of seeds finds it
    floor = 2.8 * math.sqrt(float(est.problem_var[0]))
    assert seeds_needed(est, floor / 2) == 0
    assert seeds_needed(est, 3 * floor) > 0


def test_ratio_metrics_are_covered_too() -> None:
    """KL per token: a ratio of summed KL over summed tokens, tokens varying by problem."""
    rng = np.random.default_rng(7)
    replicates, seeds, problems = 1000, 3, 120
    tokens = rng.integers(20, 200, (replicates, 1, 1, problems)) * np.ones((1, 2, seeds, 1))
    per_problem = 0.01 * np.exp(0.5 * rng.standard_normal((replicates, 1, 1, problems)))
    seed = np.exp(0.2 * rng.standard_normal((replicates, 2, seeds, 1)))
    noise = np.exp(0.3 * rng.standard_normal((replicates, 2, seeds, problems)))
    kl = tokens * per_problem * seed * noise
    sets = np.zeros(problems, dtype=int)
    arms = [Arm(*linearize(kl[:, a], tokens[:, a], sets)) for a in range(2)]
    lo, hi = difference(arms, [1, -1], sets).interval()
    coverage = float(((lo <= 0) & (hi >= 0)).mean())
    assert abs(coverage - 0.95) <= 0.02 + mc(0.95, replicates), coverage


def test_macro_weighs_sets_alike_and_micro_weighs_problems() -> None:
    # a 30-problem set with half its problems solved and a 270-problem set with none
    num = np.array([1.0] * 15 + [0.0] * 15 + [0.0] * 270)
    sets = np.array([0] * 30 + [1] * 270)
    macro, c_macro = linearize(num, np.ones(300), sets, MACRO)
    micro, c_micro = linearize(num, np.ones(300), sets, MICRO)
    assert macro == pytest.approx(0.25) and micro == pytest.approx(0.05)
    # contributions sum to zero within each set (micro: one set of every problem)
    assert abs(c_macro[:30].sum()) < 1e-12 and abs(c_macro[30:].sum()) < 1e-12
    assert abs(c_micro.sum()) < 1e-12
    # a problem of the small set weighs 1/60 in the macro mean, 1/300 in the micro one
    assert c_macro[0] == pytest.approx(0.5 / 30 / 2) and c_micro[0] == pytest.approx(0.95 / 300)
    with pytest.raises(ValueError, match="average"):
        linearize(num, np.ones(300), sets, "mean")


def test_one_seed_per_arm_gives_no_interval() -> None:
    est = difference([Arm(np.array([[0.5]])), Arm(np.array([[0.4]]))], [1, -1])
    assert math.isnan(float(est.se[0]))
