"""The pull-back statistics on synthetic mean probabilities with a known answer: shifts drawn
alike read as no pull-back beyond the GRPO-seed-against-GRPO-seed null, though the paper's raw
figures call them pulled back; a Tandem RL that is a shrunken copy of GRPO reads as pulled back."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.analysis.claims import reference_verdict
from tandem.analysis.displacement import (
    NO_PULLBACK,
    PULLBACK,
    PUSHED_AWAY,
    UNDECIDED,
    pair_statistics,
    pullback_against_null,
)

VOCAB = 20_000
SEEDS = 3


def world(kind: str, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """``pair_statistics`` of each seed's (GRPO, Tandem RL) pair and of every ordered pair of
    GRPO seeds, on mean probabilities over ``VOCAB`` items.

    Every model is the base with its logits shifted. GRPO's seeds share a direction (their
    shifts correlate at 0.7, as runs of one recipe do). ``kind``: ``independent`` (Tandem RL's
    shift drawn apart from everything, of GRPO's size), ``seed_like`` (0.7 of its seed's GRPO
    shift plus noise, of the same size: built as a second GRPO seed), ``shrunken`` (GRPO's
    mean probabilities moved halfway back to the base's) or ``pushed`` (GRPO's move made half
    as large again).
    """
    g = torch.Generator().manual_seed(seed)

    def noise() -> torch.Tensor:
        return torch.randn(VOCAB, generator=g, dtype=torch.float64)

    logits = 2.0 * noise()

    def model(shift: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits + 0.3 * shift, 0)  # [V]

    base = model(torch.zeros(VOCAB))
    common = noise()
    shifts = [math.sqrt(0.7) * common + math.sqrt(0.3) * noise() for _ in range(SEEDS)]
    grpo = [model(z) for z in shifts]
    trl = {
        "independent": lambda i: model(noise()),
        "seed_like": lambda i: model(0.7 * shifts[i] + math.sqrt(1 - 0.7**2) * noise()),
        "shrunken": lambda i: base + 0.5 * (grpo[i] - base),
        "pushed": lambda i: (grpo[i] + 0.5 * (grpo[i] - base)).clamp(min=0),
    }[kind]
    arm = [pair_statistics(base, grpo[i], trl(i)) for i in range(SEEDS)]
    null = [
        pair_statistics(base, grpo[i], grpo[j])
        for i in range(SEEDS)
        for j in range(SEEDS)
        if i != j
    ]
    return arm, null


@pytest.mark.parametrize("kind", ["independent", "seed_like"])
def test_shifts_drawn_alike_read_as_no_pullback_beyond_the_null(kind: str) -> None:
    arm, null = world(kind)
    for key in ("pulled_back", "pullback_rho"):
        reading = pullback_against_null(arm, null, key)
        assert reading.verdict == NO_PULLBACK, reading.sentence()
        # the null's own pairs are no pull-back either: its asymmetries straddle zero
        assert reading.spread[0] < 0 < reading.spread[1]
    # the paper's raw figures nonetheless say "pulled back": most items closer, rho negative
    shares = [s["pulled_back"] for s in arm]
    rhos = [s["pullback_rho"] for s in arm]
    assert min(shares) > 0.6 and max(rhos) < -0.3
    assert reference_verdict(shares, 0.5, True, "{:.0%}", "{mean}").startswith("Reproduces")
    assert reference_verdict(rhos, 0.0, False, "{:+.3f}", "{mean}").startswith("Reproduces")


def test_an_independent_shift_moves_the_raw_correlation_but_not_the_asymmetry() -> None:
    """Against a null of correlated GRPO seeds, an unrelated shift's raw correlation is more
    negative than the null's, by construction (GRPO's move enters ``trl - grpo`` with a minus
    sign), and ``spearman_top`` says the two move the items apart; the role-swapped reading
    does not mistake that for a pull-back."""
    arm, null = world("independent")
    rho = pullback_against_null(arm, null, "pullback_rho")
    _, _, hi = rho.difference
    assert hi < 0  # the raw figure alone would call it a pull-back beyond the null
    assert rho.verdict == NO_PULLBACK
    assert max(s["spearman_top"] for s in arm) < 0.2
    assert min(s["spearman_top"] for s in null) > 0.5


def test_a_shrunken_copy_reads_as_pullback_and_a_stretched_one_as_pushed_away() -> None:
    arm, null = world("shrunken")
    for key in ("pulled_back", "pullback_rho"):
        reading = pullback_against_null(arm, null, key)
        assert reading.verdict == PULLBACK, reading.sentence()
    share = pullback_against_null(arm, null, "pulled_back")
    assert share.arm == pytest.approx(1.0)  # every displaced item is closer to the base
    assert share.asymmetry[0] == pytest.approx(1.0)  # and none the other way round
    pushed, null = world("pushed")
    for key in ("pulled_back", "pullback_rho"):
        reading = pullback_against_null(pushed, null, key)
        assert reading.verdict == PUSHED_AWAY, reading.sentence()


def test_the_verdict_on_other_seeds_of_the_synthetic_world() -> None:
    """The readings are not one draw's luck: the same on two further draws."""
    for seed in (1, 2):
        for kind, want in (("independent", NO_PULLBACK), ("shrunken", PULLBACK)):
            arm, null = world(kind, seed)
            assert pullback_against_null(arm, null, "pulled_back").verdict == want


def test_one_seed_or_no_null_is_undecided_and_a_wrong_key_is_named() -> None:
    arm, null = world("shrunken")
    assert pullback_against_null(arm[:1], null, "pulled_back").verdict == UNDECIDED
    reading = pullback_against_null(arm, [], "pullback_rho")
    assert reading.verdict == UNDECIDED and math.isnan(reading.spread[0])
    with pytest.raises(ValueError, match="spearman_top"):
        pullback_against_null(arm, null, "spearman_top")
