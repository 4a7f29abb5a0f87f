"""The paper's four claims and how the study reads each of its metrics.

Every metric of a claim is read from one interval: Tandem RL minus GRPO, from the model of seed
and problem variance (``tandem.analysis.mixed``; the pull-back from its own paired reading,
``tandem.analysis.study``). Against a margin stated before the data, in the metric's units
(``conf/study/<name>.yaml``, ``margins``, each with its reason):

- a directional claim (Tandem RL better) **reproduces** where the 95% interval is clear of zero
  in the paper's direction, goes the **opposite direction** where it is clear the other way, is
  **equivalent within the margin** (no effect as large as the margin: the claim fails) where the
  90% interval lies inside it (two one-sided tests at the 5% level, TOST), and is otherwise
  **no detectable difference**: undecided, the interval reaching beyond the margin. No detectable
  difference never reads as "the same";
- the on-par claim is **on par within the margin** by TOST, **not on par** where the 95%
  interval is clear of zero and the 90% interval reaches beyond the margin, and otherwise
  **undecided**.

Each reading carries its primary test's p-value (the difference test of a directional claim, the
TOST of the on-par claim), which Holm's step-down correction adjusts over the page's metrics
(``holm``): a verdict that rests on that test holds after Holm only where the adjusted p-value is
below 5%. Beside it: the minimal detectable effect (80% power at the 5% level, for the seeds and
noise the page has) and the seeds per arm that would find the effect that matters (the paper's own
difference where it gives both arms' figures, else the margin) with that power.

What this file leaves out: where the values come from (``tandem.analysis.study``) and the page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tandem.analysis.mixed import Estimate, minimal_effect, seeds_needed

LEVEL = 0.95


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
        ("drift/kl", "pullback"),
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
METRICS = tuple(m for claim in CLAIMS for m in claim.metrics)
# metrics where higher is better (for the others, lower is)
HIGHER_IS_BETTER = {
    "solo/pass@1",
    "solo/pass@8",
    "handoff/pass@1",
    "handoff/pass@8",
    "legibility/overlap",
    "pullback",
}
# what the paper reports (Tandem RL, GRPO) where it gives a figure for an arm
PAPER = {
    "drift/kl": {"trl": 0.022, "grpo": 0.026},
    "legibility/junior_ce": {"trl": 0.122, "grpo": 0.132},
    "legibility/overlap": {"trl": 0.973, "grpo": 0.960},
    "pulled_back": {"trl": 0.87},
}

# decimals of a metric's figures (accuracies and the pull-back: 3)
DECIMALS = {"drift/kl": 4, "legibility/junior_ce": 4, "legibility/overlap": 4}

REPRODUCES = "Reproduces"
OPPOSITE = "Opposite direction"
NO_DIFFERENCE = "No detectable difference"
NOT_ON_PAR = "Not on par"


@dataclass(frozen=True)
class Margin:
    """A metric's equivalence margin, in its units, and why it is that size."""

    margin: float
    reason: str

    def __post_init__(self) -> None:
        if not self.margin > 0:
            raise ValueError(f"margin ({self.margin}) must be positive: it bounds |difference|.")


@dataclass(frozen=True)
class Reading:
    """One metric's reading from one interval.

    Attributes:
        metric: the metric.
        verdict: the short verdict (the words of the page's tables).
        sentence: the verdict with its figures.
        value, lo, hi: the difference and its 95% interval.
        p: the primary test's p-value (the difference test, or the TOST of an on-par claim).
        primary: whether the verdict rests on the primary test (so Holm's correction applies).
        mde: the minimal detectable effect of the primary test (80% power, 5% level).
        effect: the effect that matters for ``seeds`` (the paper's difference, or the margin).
        effect_from: where ``effect`` comes from (``the paper`` or ``the margin``).
        seeds: seeds per arm that find ``effect`` with 80% power (0: seeds alone cannot).
    """

    metric: str
    verdict: str
    sentence: str
    value: float
    lo: float
    hi: float
    p: float
    primary: bool
    mde: float
    effect: float
    effect_from: str
    seeds: int


def paper_difference(metric: str) -> float | None:
    """Tandem RL minus GRPO as the paper reports it (None: it gives no figure for both)."""
    got = PAPER.get(metric, {})
    return got["trl"] - got["grpo"] if "trl" in got and "grpo" in got else None


def read(claim: Claim, metric: str, estimate: Estimate, margin: Margin) -> Reading:
    """The reading of one metric (``estimate``: one replicate of Tandem RL minus GRPO)."""
    e = {k: float(np.reshape(getattr(estimate, k), -1)[0]) for k in ("value", "se", "df")}
    if math.isnan(e["se"]) or e["se"] == 0:
        return _no_interval(metric, e["value"], margin)
    lo, hi = (float(np.reshape(x, -1)[0]) for x in estimate.interval(LEVEL))
    lo90, hi90 = (float(np.reshape(x, -1)[0]) for x in estimate.interval(0.90))
    m = margin.margin
    paper = paper_difference(metric)
    effect, source = (abs(paper), "the paper") if paper and not claim.on_par else (m, "the margin")
    se, df = np.asarray(e["se"]), np.asarray(e["df"])
    if claim.on_par:
        p = float(np.reshape(estimate.tost_p(m), -1)[0])
        mde = float(minimal_effect(se, df, 0.8, 0.05, equivalence=True))
        seeds = seeds_needed(estimate, effect, equivalence=True)
    else:
        p = float(np.reshape(estimate.p_value(), -1)[0])
        mde = float(minimal_effect(se, df, 0.8, 0.05))
        seeds = seeds_needed(estimate, effect)
    verdict, primary = _verdict(claim, metric, lo, hi, lo90, hi90, m)
    f = lambda x: f"{x:+.{DECIMALS.get(metric, 3)}f}"  # noqa: E731
    difference_p = float(np.reshape(estimate.p_value(), -1)[0])
    tost = float(np.reshape(estimate.tost_p(m), -1)[0])
    sentence = (
        f"{verdict}: Tandem RL minus GRPO {f(e['value'])}, 95% interval [{f(lo)}, {f(hi)}] "
        f"(p = {difference_p:.2g}); 90% interval [{f(lo90)}, {f(hi90)}] against ±{m:g} "
        f"(equivalence p = {tost:.2g})."
    )
    return Reading(
        metric, verdict, sentence, e["value"], lo, hi, p, primary, mde, effect, source, seeds
    )


def _verdict(
    claim: Claim, metric: str, lo: float, hi: float, lo90: float, hi90: float, m: float
) -> tuple[str, bool]:
    """The short verdict and whether it rests on the primary test."""
    inside = -m < lo90 and hi90 < m
    clear = lo > 0 or hi < 0
    if claim.on_par:
        if inside:
            return f"On par within ±{m:g}" + (" (the arms differ, by less)" if clear else ""), True
        if clear:
            return f"{NOT_ON_PAR}: the arms differ", False
        return f"Undecided: {NO_DIFFERENCE.lower()}, not shown on par within ±{m:g}", False
    if clear:
        better = (lo > 0) == (metric in HIGHER_IS_BETTER)
        return (REPRODUCES if better else OPPOSITE), True
    if inside:
        return f"Equivalent within ±{m:g}: no effect as large as the margin", False
    return f"{NO_DIFFERENCE} (undecided: the interval reaches beyond ±{m:g})", False


def _no_interval(metric: str, value: float, margin: Margin) -> Reading:
    sentence = f"No interval: too few seeds (Tandem RL minus GRPO {value:+.4g})."
    nan = math.nan
    return Reading(metric, "No interval", sentence, value, nan, nan, nan, False, nan, nan, "", 0)


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and is not counted)."""
    order = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    out = [math.nan] * len(ps)
    running, m = 0.0, len(order)
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def after_holm(reading: Reading, adjusted: float) -> str:
    """Whether a verdict that rests on the primary test holds after Holm's correction."""
    if not reading.primary or math.isnan(adjusted):
        return "-"
    return f"{'holds' if adjusted < 0.05 else 'not after Holm'} (p adj. {adjusted:.2g})"


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
    """Mean of ``a`` minus mean of ``b`` with Welch's t-interval (seed level only)."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        diff = sum(a) / len(a) - sum(b) / len(b)
        return diff, math.nan, math.nan
    result = stats.ttest_ind(a, b, equal_var=False)
    ci = result.confidence_interval(level)
    return sum(a) / len(a) - sum(b) / len(b), float(ci.low), float(ci.high)


def reading(sentence: str) -> str:
    """The verdict of a sentence, without its figures: the words before the first colon."""
    return sentence.split(":", 1)[0]
