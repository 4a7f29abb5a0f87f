"""One model of seed and problem variance: the interval of an arm difference.

Every figure of the study is a mean over an arm's training seeds of a run's figure, and a run's
figure is a ratio over the problems of the eval sets (pass@k: a mean over problems; KL per token:
summed KL over summed tokens; the macro mean weighs every set alike, the micro mean every
problem). Both levels vary: another training seed moves a run's figure (a seed effect, and a
seed-by-problem effect that averages down over problems), and another draw of problems moves
every run of an arm alike where an arm is better on some problems than on others (an
arm-by-problem effect, shared by the arm's seeds, that averages down over problems but not over
seeds). The model, for arm ``a``, seed ``s``, problem ``p``::

    y[a, s, p] = mu[a] + b[p] + i[a, p] + u[a, s] + e[a, s, p]

with random problem ``b`` (cancels in a paired difference), arm-by-problem ``i`` (variance
``s2_i``), seed ``u`` and seed-by-problem ``e``, each arm with its own seed variances. The
difference of two arms' means over seeds ``D`` has variance::

    Var(D) = S2[trl] / n[trl] + S2[grpo] / n[grpo] + V_i

where ``S2[a]`` is the variance of run figures over an arm's seeds (which holds ``u`` and ``e``
together: a run's figure already averages ``e`` over problems) and ``V_i`` the arm-by-problem
term, estimated by moments from each problem's difference of contributions: their spread over
problems, less the part that seed-by-problem noise explains (each arm's spread of a problem's
contribution over its seeds, over its seeds' count), never below zero. The interval is
Student-t with Satterthwaite's degrees of freedom: each seed term on ``n - 1``, the problem term
on Satterthwaite's own for a difference of two estimates (so a term that is a small difference
of large ones counts as uncertain); where a seed term has a single degree of freedom, on the
seed terms' alone (see ``difference``).

Why moments and a t reference, not a two-level bootstrap (seeds within arm, then problems):
resampling problems as well as seeds counts the seed-by-problem noise twice, and resampling 3
seeds gives 10 distinct draws per arm with ``(n - 1) / n`` of their variance; in simulation with
the pages' noise (400 studies each) its 95% interval covered 93% at 3 seeds and 97% at 10, wrong
both ways. The t reference is Welch's interval where the problem term is zero and holds its level
at 3 seeds (``tests/analysis/test_mixed.py``). Why not a fitted mixed model (REML): the design is
balanced within arm, the moments are closed form, fast enough to simulate thousands of studies
in a test, and need no optimiser that can fail to converge on 3 seeds.

A run's figure and its problems' contributions come from ``linearize``: per problem a numerator
and a denominator (pass@k and 1; summed KL and tokens), per set the ratio, and each problem's
contribution to the ratio's deviation (the ratio's linearisation), weighted by the average's
weight of its set. Every function takes a leading axis of replicates, so the simulation tests and
``benchmarks/power.py`` run the shipped procedure on thousands of studies at once; the study
runs it on one.

What this file leaves out: where the numbers come from (``tandem.analysis.problems``), the
verdicts (``tandem.analysis.claims``) and the simulated studies (``tandem.analysis.simulate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

MACRO, MICRO = "macro", "micro"


@dataclass(frozen=True)
class Arm:
    """One arm's (or one group of seeds') figure per run and per problem.

    Attributes:
        runs: ``[R, n]`` each run's figure (R replicates of a study, n seeds).
        contributions: ``[R, n, P]`` each problem's contribution to its run's figure, summing to
            zero within each set (None: no problem level, a seed-level interval only).
    """

    runs: np.ndarray
    contributions: np.ndarray | None = None

    @property
    def seeds(self) -> int:
        return self.runs.shape[-1]


@dataclass(frozen=True)
class Estimate:
    """A difference (or a mean) with its standard error and degrees of freedom, per replicate.

    Attributes:
        value: ``[R]`` the estimate.
        se: ``[R]`` its standard error (NaN: no interval, too few seeds).
        df: ``[R]`` Satterthwaite's degrees of freedom.
        seed_var: ``[R]`` the seed terms of the variance, at the seeds the study has.
        problem_var: ``[R]`` the arm-by-problem term (zero without a problem level).
        problem_df: ``[R]`` its degrees of freedom (problems less one).
        seeds: per arm, ``(seeds, sign, seed variance [R])``: what ``seeds_needed`` rescales.
    """

    value: np.ndarray
    se: np.ndarray
    df: np.ndarray
    seed_var: np.ndarray
    problem_var: np.ndarray
    problem_df: np.ndarray
    seeds: tuple[tuple[int, int, np.ndarray], ...]

    def interval(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """The two-sided ``level`` t-interval's ends, ``[R]`` each."""
        half = stats.t.ppf(0.5 + level / 2, self.df) * self.se
        return self.value - half, self.value + half

    def p_value(self) -> np.ndarray:
        """Two-sided p-value of a zero difference."""
        return 2 * stats.t.sf(np.abs(self.value / self.se), self.df)

    def tost_p(self, margin: float) -> np.ndarray:
        """Two one-sided tests of ``|difference| >= margin``: the larger p-value."""
        lower = stats.t.sf((self.value + margin) / self.se, self.df)
        upper = stats.t.cdf((self.value - margin) / self.se, self.df)
        return np.maximum(lower, upper)

    def mde(self, power: float = 0.8, alpha: float = 0.05) -> np.ndarray:
        """The smallest true difference the two-sided test at ``alpha`` finds with ``power``."""
        return minimal_effect(self.se, self.df, power, alpha)


def minimal_effect(
    se: np.ndarray, df: np.ndarray, power: float, alpha: float, equivalence: bool = False
) -> np.ndarray:
    """The smallest true difference the two-sided test at ``alpha`` finds with ``power``:
    ``(t(1 - alpha / 2) + t(power)) * se``; ``equivalence``: the smallest margin within which
    two one-sided tests at ``alpha`` show two equal arms equivalent with ``power``,
    ``(t(1 - alpha) + t(1 - (1 - power) / 2)) * se``."""
    if equivalence:
        return (stats.t.ppf(1 - alpha, df) + stats.t.ppf(1 - (1 - power) / 2, df)) * se
    return (stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * se


def linearize(
    num: np.ndarray, den: np.ndarray, sets: np.ndarray, average: str = MACRO
) -> tuple[np.ndarray, np.ndarray]:
    """Each run's figure and its problems' contributions.

    Args:
        num, den: ``[..., P]`` per problem a numerator and a denominator (pass@k and 1).
        sets: ``[P]`` the set of each problem (integers).
        average: ``macro`` (each set weighs the same, the paper's) or ``micro`` (one ratio
            over every problem).

    Returns:
        ``[...]`` the figures and ``[..., P]`` the contributions (summing to zero per set).
    """
    if average not in (MACRO, MICRO):
        raise ValueError(f"average ({average!r}) must be {MACRO!r} or {MICRO!r}.")
    if average == MICRO:
        sets = np.zeros_like(sets)
    labels = np.unique(sets)
    figure = np.zeros(num.shape[:-1])
    contributions = np.zeros(num.shape)
    for label in labels:
        inside = sets == label
        total = den[..., inside].sum(-1)  # [...]
        ratio = num[..., inside].sum(-1) / total
        figure += ratio / len(labels)
        share = (num[..., inside] - ratio[..., None] * den[..., inside]) / total[..., None]
        contributions[..., inside] = share / len(labels)
    return figure, contributions


def difference(
    arms: Sequence[Arm], signs: Sequence[int], sets: np.ndarray | None = None, pooled: bool = False
) -> Estimate:
    """``sum(sign * mean over seeds)`` of the arms, with the model's standard error.

    Args:
        arms: the arms (``trl``, ``grpo``: ``signs`` ``(1, -1)``; one arm with ``(1,)`` for a
            figure against zero).
        signs: +1 or -1 per arm.
        sets: ``[P]`` each problem's set (None: one set).
        pooled: one seed variance for all the arms (groups of one arm's seeds, the calibration
            row): pooled over the arms' seeds, so a group of one seed is allowed.
    """
    value = sum(s * a.runs.mean(-1) for a, s in zip(arms, signs, strict=True))
    seed_terms = _seed_terms(arms, pooled)
    problem_var, problem_df = _problem_term(arms, signs, sets, pooled)
    seed_var = sum(v for v, _ in seed_terms)
    total = seed_var + problem_var
    with np.errstate(divide="ignore", invalid="ignore"):
        seed_squares = sum(v**2 / d for v, d in seed_terms)
        df = total**2 / (seed_squares + problem_var**2 / problem_df)
        if min(d for _, d in seed_terms) < 2:
            # a seed variance on one degree of freedom is often tiny by chance, and then a
            # well-estimated problem term would lend the sum its many degrees of freedom: the
            # interval undercovers (93% for 95% in simulation); count the seeds' alone
            df = seed_var**2 / seed_squares
    per_arm = _per_seed_variances(arms, pooled)
    seeds = tuple((a.seeds, s, v) for a, s, v in zip(arms, signs, per_arm, strict=True))
    return Estimate(value, np.sqrt(total), df, seed_var, problem_var, problem_df, seeds)


def _per_seed_variances(arms: Sequence[Arm], pooled: bool) -> list[np.ndarray]:
    """Each arm's variance of one run's figure over seeds (``[R]``; pooled: the same for all)."""
    own = [a.runs.var(-1, ddof=1) if a.seeds > 1 else a.runs[..., 0] * np.nan for a in arms]
    if not pooled:
        return own
    squares = sum(((a.runs - a.runs.mean(-1, keepdims=True)) ** 2).sum(-1) for a in arms)
    df = sum(a.seeds - 1 for a in arms)
    return [squares / df if df else squares * np.nan for _ in arms]


def _seed_terms(arms: Sequence[Arm], pooled: bool) -> list[tuple[np.ndarray, float]]:
    """``(variance of the arm's mean, its degrees of freedom)`` per arm; pooled: one term."""
    variances = _per_seed_variances(arms, pooled)
    if pooled:
        df = sum(a.seeds - 1 for a in arms)
        return [(variances[0] * sum(1 / a.seeds for a in arms), df)]
    return [(v / a.seeds, a.seeds - 1) for a, v in zip(arms, variances, strict=True)]


def _problem_term(
    arms: Sequence[Arm], signs: Sequence[int], sets: np.ndarray | None, pooled: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The arm-by-problem variance of the difference and its degrees of freedom.

    Per set, the spread of the paired differences over problems (``P - 1`` degrees of
    freedom) less the seed-by-problem noise it holds (``(n - 1) P`` each arm), never below
    zero; its degrees of freedom are Satterthwaite's for that difference, so a term that is a
    small difference of two large estimates counts as the uncertain estimate it is.
    """
    shape = arms[0].runs.shape[:-1]
    if any(a.contributions is None for a in arms):
        return np.zeros(shape), np.ones(shape)
    d = sum(s * a.contributions.mean(-2) for a, s in zip(arms, signs, strict=True))  # [R, P]
    sets = np.zeros(d.shape[-1], dtype=int) if sets is None else np.asarray(sets)
    noise = _seed_problem_noise(arms, sets, pooled)
    noise_df = sum(a.seeds - 1 for a in arms) if pooled else None
    total, spread_terms = np.zeros(shape), np.zeros(shape)
    for label in np.unique(sets):
        inside = sets == label
        count = int(inside.sum())
        if count < 2:
            continue
        spread = count * d[..., inside].var(-1, ddof=1)  # [R]
        parts = [count * v[label] / a.seeds for a, v in zip(arms, noise, strict=True)]
        term = spread - sum(parts)
        kept = term > 0
        total += np.where(kept, term, 0.0)
        squares = spread**2 / (count - 1)
        for a, part in zip(arms, parts, strict=True):
            df = (noise_df if pooled else a.seeds - 1) * count
            squares = squares + (part**2 / df if df > 0 else 0.0)
        spread_terms += np.where(kept, squares, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(total > 0, total**2 / spread_terms, 1.0)
    return total, df


def _seed_problem_noise(
    arms: Sequence[Arm], sets: np.ndarray, pooled: bool
) -> list[dict[int, np.ndarray]]:
    """Per arm and set, the mean over problems of a contribution's variance over seeds."""
    out = []
    for arm in arms:
        c = arm.contributions
        out.append(
            {
                int(label): (
                    c[..., sets == label].var(-2, ddof=1).mean(-1)
                    if arm.seeds > 1
                    else np.full(c.shape[:-2], np.nan)
                )
                for label in np.unique(sets)
            }
        )
    if not pooled:
        return [{k: np.nan_to_num(v) for k, v in arm.items()} for arm in out]
    weights = [a.seeds - 1 for a in arms]
    common = {
        label: sum(np.nan_to_num(arm[label]) * w for arm, w in zip(out, weights, strict=True))
        / max(sum(weights), 1)
        for label in out[0]
    }
    return [common for _ in arms]


def seeds_needed(
    estimate: Estimate,
    effect: float,
    power: float = 0.8,
    equivalence: bool = False,
    most: int = 1000,
) -> int:
    """The fewest seeds per arm at which the test finds a true ``effect`` with ``power`` (with
    ``equivalence``: shows two equal arms equivalent within ``effect``), each arm's seed
    variance and the problem term as estimated (the first replicate); 0 where no number up to
    ``most`` does (the problem term alone is too wide: more problems would)."""
    problem = float(estimate.problem_var.reshape(-1)[0])
    problem_df = float(estimate.problem_df.reshape(-1)[0])
    per_seed = [float(v.reshape(-1)[0]) for _, _, v in estimate.seeds]
    if any(np.isnan(v) for v in per_seed):
        return 0
    for n in range(2, most + 1):
        terms = [v / n for v in per_seed]
        var = sum(terms) + problem
        df = var**2 / (sum(t**2 / (n - 1) for t in terms) + problem**2 / problem_df)
        if minimal_effect(np.sqrt(var), df, power, 0.05, equivalence) <= abs(effect):
            return n
    return 0
