"""The paper's four claims and how the study judges them from per-seed values.

Each arm gives one value per seed. A directional claim (Tandem RL better than GRPO) is judged by
Welch's 95% t-interval of the difference of the means: clear of zero in the paper's direction,
"Reproduces"; containing zero, "No detectable difference" (the seeds cannot tell which way it
goes, so it never reads as the other way); clear of zero the other way, "Opposite direction".
The "on par" claim is an equivalence statement with a stated margin (two one-sided tests at the
5% level, TOST): equivalent within +-m when the 90% Welch interval of the difference lies
inside (-m, +m), and "not shown equivalent" otherwise. A margin makes "on par" a claim that
can fail; an interval that merely contains zero says too few seeds as readily as no difference.

The pulled-back share and the pull-back Spearman correlation are Tandem RL's alone (measured
against GRPO within a seed), so they are judged by the one-sample t-interval of their mean
against a reference: 50% of the displaced items (a coin's share), and zero correlation.

Every claim is also read against a null: the same figure for two seeds of one arm. For a
per-seed figure the null is every GRPO-seed-minus-GRPO-seed difference over the pairs of GRPO
seeds, and its spread the largest of them in absolute value; a claim reproduces against the null
only where the arm's interval lies wholly beyond that spread in the paper's direction (an effect
larger than two runs of GRPO already differ by), and is on par against it where the 90%
interval lies inside it (``null_verdict``). The pull-back statistics are read against their own
null in ``tandem.analysis.displacement.pullback_against_null``.

What this file leaves out: where the values come from and the page (``tandem.analysis.study``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# the default equivalence margin of "on par": two points of absolute accuracy, about the spread
# between seeds of one arm in the tiny-world study
MARGIN = 0.02


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims: its metrics, which way is better, and how to judge it."""

    title: str
    paper: str
    metrics: tuple[str, ...]
    # True: the paper claims no difference (judged by equivalence); False: Tandem RL is better
    on_par: bool


CLAIMS = (
    Claim(
        "1. Solo accuracy on par with GRPO",
        "Tandem RL's solo pass@k matches GRPO's on AMC, AIME and Minerva.",
        ("solo/pass@1", "solo/pass@8"),
        True,
    ),
    Claim(
        "2. Better accuracy when handing off to the junior (reasoning-step schedule)",
        "Paired with the junior under the step schedule, Tandem RL's senior scores higher "
        "than GRPO's.",
        ("handoff/pass@1", "handoff/pass@8"),
        False,
    ),
    Claim(
        "3. Lower drift from the base",
        "KL(senior || base) per token 0.022 (Tandem RL) vs 0.026 (GRPO); 87% of the 500 tokens "
        "GRPO displaced most move back toward the base, and over them GRPO's displacement from "
        "the base and Tandem RL's shift from GRPO are negatively correlated (Spearman).",
        ("drift/kl", "pulled_back", "pullback_rho"),
        False,
    ),
    Claim(
        "4. Higher legibility to the junior",
        "Junior cross-entropy 0.122 vs 0.132 nats per token (per chain of thought); overlap "
        "0.973 vs 0.960.",
        ("legibility/junior_ce", "legibility/overlap"),
        False,
    ),
)
# metrics where higher is better (for the others, lower is)
HIGHER_IS_BETTER = {
    "solo/pass@1",
    "solo/pass@8",
    "handoff/pass@1",
    "handoff/pass@8",
    "legibility/overlap",
    "pulled_back",
}
# Tandem RL's own measurements against GRPO, with {mean} the formatted mean over seeds
SHARE = "{mean} of GRPO's most displaced tokens sit closer to the base under Tandem RL"
CORRELATION = (
    "mean Spearman rho {mean} between GRPO's displacement from the base and Tandem RL's shift "
    "from GRPO (negative: moved back)"
)


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and the two ends of the Student-t interval of the mean (NaN ends for one value)."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def difference_interval(
    a: Sequence[float], b: Sequence[float], level: float = 0.95
) -> tuple[float, float, float]:
    """Mean of ``a`` minus mean of ``b`` with Welch's t-interval."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        diff = sum(a) / len(a) - sum(b) / len(b)
        return diff, math.nan, math.nan
    result = stats.ttest_ind(a, b, equal_var=False)
    ci = result.confidence_interval(level)
    return sum(a) / len(a) - sum(b) / len(b), float(ci.low), float(ci.high)


def verdict(
    claim: Claim, metric: str, trl: Sequence[float], grpo: Sequence[float], margin: float = MARGIN
) -> str:
    """A plain sentence on one metric of a claim, from each arm's per-seed values.

    Args:
        claim: the claim the metric belongs to.
        metric: the metric's name.
        trl, grpo: one value per seed of each arm (``grpo`` unused for Tandem RL's own
            measurements against GRPO, ``pulled_back`` and ``pullback_rho``).
        margin: the equivalence margin of an "on par" claim, in the metric's units.
    """
    if metric == "pulled_back":
        return reference_verdict(trl, 0.5, True, "{:.0%}", SHARE)
    if metric == "pullback_rho":
        return reference_verdict(trl, 0.0, False, "{:+.3f}", CORRELATION)
    if not trl or not grpo:
        return "Not measured: an arm has no finished runs."
    if claim.on_par:
        return equivalence_verdict(trl, grpo, margin)
    return direction_verdict(trl, grpo, metric in HIGHER_IS_BETTER)


def direction_verdict(trl: Sequence[float], grpo: Sequence[float], higher_is_better: bool) -> str:
    """Is Tandem RL better than GRPO: the 95% Welch interval of the difference against zero."""
    diff, lo, hi = difference_interval(trl, grpo)
    what = f"Tandem RL minus GRPO {diff:+.3f}"
    if math.isnan(lo):
        side = _side(diff, higher_is_better)
        return f"No interval with one seed per arm: {what} ({side})."
    interval = f"95% interval [{lo:+.3f}, {hi:+.3f}]"
    if lo <= 0 <= hi:
        return f"No detectable difference: {what}, {interval} contains zero."
    if (lo > 0) == higher_is_better:
        return f"Reproduces: {what}, {interval} clear of zero in the paper's direction."
    return f"Opposite direction (interval clear of zero): {what}, {interval}."


def equivalence_verdict(trl: Sequence[float], grpo: Sequence[float], margin: float) -> str:
    """Are the arms on par: TOST at the 5% level, i.e. the 90% Welch interval inside +-margin."""
    assert margin > 0, f"the equivalence margin ({margin}) must be positive"
    diff, lo, hi = difference_interval(trl, grpo, level=0.90)
    bound = f"±{margin:g}"
    what = f"Tandem RL minus GRPO {diff:+.3f}"
    if math.isnan(lo):
        return f"Not shown equivalent within {bound}: one seed per arm gives no interval ({what})."
    interval = f"90% interval [{lo:+.3f}, {hi:+.3f}]"
    if -margin < lo and hi < margin:
        return f"Equivalent within {bound}: {what}, {interval} inside [-{margin:g}, +{margin:g}]."
    _, lo95, hi95 = difference_interval(trl, grpo)
    # say whether the arms differ outright, or the seeds are merely too few to show equivalence
    apart = "the arms differ" if lo95 > 0 or hi95 < 0 else "no detectable difference either"
    return (
        f"Not shown equivalent within {bound}: {what}, {interval} reaches beyond {bound} "
        f"({apart}: 95% interval [{lo95:+.3f}, {hi95:+.3f}])."
    )


def reference_verdict(
    values: Sequence[float], reference: float, paper_above: bool, fmt: str, describe: str
) -> str:
    """Tandem RL's own measurement against a reference: the 95% t-interval of its mean.

    Args:
        values: one value per seed.
        reference: what no effect would give.
        paper_above: whether the paper's direction is above the reference.
        fmt: format of one value, e.g. ``"{:.0%}"``.
        describe: the sentence on the mean, with ``{mean}`` formatted by ``fmt``.
    """
    if not values:
        return "Not measured: no seed has both a GRPO and a Tandem RL run."
    mean, lo, hi = t_interval(values)
    what = describe.format(mean=fmt.format(mean))
    ref = "zero" if reference == 0 else fmt.format(reference)
    if math.isnan(lo):
        side = "the paper's side" if (mean > reference) == paper_above else "not the paper's side"
        return f"No interval with one seed: {what} ({side} of {ref})."
    interval = f"95% interval [{fmt.format(lo)}, {fmt.format(hi)}]"
    if lo <= reference <= hi:
        return f"No detectable difference from {ref}: {what}, {interval} contains {ref}."
    if (lo > reference) == paper_above:
        return f"Reproduces: {what}, {interval} clear of {ref}."
    return f"Opposite direction (interval clear of {ref}): {what}, {interval}."


def seed_tests(rhos: Sequence[float], ps: Sequence[float], ns: Sequence[float]) -> str:
    """Each seed's pull-back correlation with its p-value and number of items."""
    return "; ".join(
        f"rho {r:+.3f} (p = {p:.2g}, n = {int(n)})" for r, p, n in zip(rhos, ps, ns, strict=True)
    )


def _side(diff: float, higher_is_better: bool) -> str:
    if diff == 0:
        return "no difference"
    return "the paper's direction" if (diff > 0) == higher_is_better else "against the paper's"


def seed_pair_differences(values: dict[int, float]) -> list[float]:
    """``values[i] - values[j]`` for every pair of seeds ``i < j``: the null of one arm."""
    seeds = sorted(values)
    return [values[i] - values[j] for n, i in enumerate(seeds) for j in seeds[n + 1 :]]


def null_verdict(claim: Claim, metric: str, trl: dict[int, float], grpo: dict[int, float]) -> str:
    """A plain sentence on one metric read against the GRPO-seed-against-GRPO-seed null.

    Args:
        claim: the claim the metric belongs to.
        metric: the metric's name.
        trl, grpo: each arm's value by seed.
    """
    pairs = seed_pair_differences(grpo)
    if not trl or not pairs:
        return "No null: the study needs Tandem RL runs and at least two GRPO seeds."
    m = max(abs(d) for d in pairs)
    null = f"the null's spread ±{m:.3f} (the largest of {len(pairs)} GRPO seed pair differences)"
    level = 0.90 if claim.on_par else 0.95
    diff, lo, hi = difference_interval(list(trl.values()), list(grpo.values()), level)
    what = f"Tandem RL minus GRPO {diff:+.3f}"
    if math.isnan(lo):
        return f"No interval with one Tandem RL seed: {what}, against {null}."
    interval = f"{level:.0%} interval [{lo:+.3f}, {hi:+.3f}]"
    if claim.on_par:
        if -m < lo and hi < m:
            return f"On par against the null: {what}, {interval} inside {null}."
        return f"Not shown on par against the null: {what}, {interval} reaches beyond {null}."
    sign = 1 if metric in HIGHER_IS_BETTER else -1
    if (lo > m) if sign > 0 else (hi < -m):
        return f"Reproduces against the null: {what}, {interval} clear of {null}."
    if (hi < -m) if sign > 0 else (lo > m):
        return f"Opposite direction beyond the null: {what}, {interval} clear of {null}."
    if lo > 0 or hi < 0:
        return (
            f"Within the null: {what}, {interval} is clear of zero but not of {null}: two GRPO "
            "seeds differ by as much."
        )
    return f"No detectable difference: {what}, {interval} contains zero ({null})."


def reading(sentence: str) -> str:
    """The verdict of a sentence, without its figures: the words before the first colon."""
    return sentence.split(":", 1)[0]
