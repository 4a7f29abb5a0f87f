"""Every interval a page prints, from its inputs: each arm against GRPO, metric by metric, the
pull-back, the GRPO-seed calibration row, and the readings with Holm's correction.

- an arm against GRPO: the model of seed and problem variance (``tandem.analysis.mixed``) on the
  runs' per-problem summaries (``tandem.analysis.problems.metric_arms``), macro or micro;
- the pull-back (``tandem.analysis.pullback``): per GRPO seed ``i``, the arm's seed ``i`` read
  against GRPO seed ``i`` minus the mean of the next two GRPO seeds read against it (the null:
  how much a second GRPO seed reads on the same texts and items), with each problem's influence
  likewise; the model's interval of the mean of those over seeds, against zero;
- the calibration row: the same procedure with a GRPO seed in Tandem RL's place: each GRPO seed
  against the mean of the others, one seed variance for all GRPO seeds (``pooled``, as one
  arm's seeds share one), so a group of one seed has an interval; for the pull-back, the next
  GRPO seed read against each seed, minus the one after it. An interval that excludes zero
  there is a false positive of the procedure: about one in twenty is expected.

What this file leaves out: the verdicts' wording (``tandem.analysis.claims``) and the page.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tandem.analysis.claims import CLAIMS, Claim, Margin, Reading, holm, read
from tandem.analysis.inputs import Inputs
from tandem.analysis.mixed import MACRO, Arm, Estimate, difference
from tandem.analysis.problems import metric_arms

PULLBACK = "pullback"


def estimate(inputs: Inputs, metric: str, arm: str, average: str = MACRO) -> Estimate | None:
    """``arm`` minus GRPO on ``metric`` (None where either has no run with it)."""
    if metric == PULLBACK:
        return pullback_estimate(inputs, arm)
    runs = {name: [r.problems for r in inputs.arm(name)] for name in (arm, "grpo")}
    if not all(runs.values()):
        return None
    got = metric_arms(runs, metric, average)
    if got is None:
        return None
    arms, sets = got
    return difference([arms[arm], arms["grpo"]], [1, -1], sets)


def calibration(inputs: Inputs, metric: str) -> list[tuple[str, Estimate]]:
    """The calibration row: ``(label, estimate)`` of each GRPO seed against the others."""
    grpo = inputs.arm("grpo")
    if len(grpo) < 2 + (metric == PULLBACK):
        return []
    if metric == PULLBACK:
        return _pullback_calibration(inputs)
    out = []
    for one in grpo:
        rest = [r for r in grpo if r is not one]
        got = metric_arms({"one": [one.problems], "rest": [r.problems for r in rest]}, metric)
        if got is None:
            return []
        arms, sets = got
        label = f"seed {one.seed} − seeds {', '.join(str(r.seed) for r in rest)}"
        out.append((label, difference([arms["one"], arms["rest"]], [1, -1], sets, pooled=True)))
    return out


def _pair(pullback: dict, reference: int, name: str) -> tuple[float, np.ndarray] | None:
    """The pull-back of run ``name`` read against GRPO seed ``reference``, and its influence."""
    got = pullback.get("references", {}).get(str(reference), {}).get("runs", {}).get(name)
    if got is None:
        return None
    return float(got["value"]), np.asarray(got["influence"], dtype=float)


def paired(pullback: dict, pairs: list[tuple[int, str, list[str]]]) -> Estimate | None:
    """The model's interval of the mean over references of (a run's pull-back minus the mean of
    the null runs'), ``pairs``: ``(reference seed, run, null runs)``; ``pullback``: the
    inputs' ``pullback.json``."""
    values, influences = [], []
    for reference, name, nulls in pairs:
        own = _pair(pullback, reference, name)
        null = [x for x in (_pair(pullback, reference, n) for n in nulls) if x is not None]
        if own is None or not null:
            continue
        values.append(own[0] - np.mean([v for v, _ in null]))
        influences.append(own[1] - np.mean([c for _, c in null], axis=0))
    if not values:
        return None
    return difference([Arm(np.array([values]), np.stack(influences)[None])], [1])


# GRPO seeds read against each GRPO seed as its null: the next ones in order, so that the work
# grows with the seeds, not with their square
NULL_SEEDS = 2


def null_seeds(seed: int, grpo: list[int], count: int = NULL_SEEDS) -> list[int]:
    """The GRPO seeds read against GRPO seed ``seed``: the ``count`` after it, cyclically."""
    order = sorted(grpo)
    at = order.index(seed)
    return [order[(at + j) % len(order)] for j in range(1, min(count, len(order) - 1) + 1)]


def pullback_pairs(arm: str, seeds: list[int], grpo: list[int]) -> list[tuple[int, str, list[str]]]:
    """``(reference, run, null runs)``: each seed of ``arm`` against the GRPO seed of its
    number, the null the next GRPO seeds (``null_seeds``) against that one."""
    return [
        (s, f"{arm}-seed{s}", [f"grpo-seed{t}" for t in null_seeds(s, grpo)])
        for s in seeds
        if s in grpo
    ]


def calibration_pairs(grpo: list[int]) -> list[tuple[int, str, list[str]]]:
    """A GRPO seed in Tandem RL's place: for each reference seed the next one, against the one
    after it."""
    out = []
    for s in grpo:
        first, *rest = null_seeds(s, grpo)
        out.append((s, f"grpo-seed{first}", [f"grpo-seed{t}" for t in rest]))
    return out


def pullback_estimate(inputs: Inputs, arm: str) -> Estimate | None:
    """``arm``'s pull-back beyond a second GRPO seed's, paired by GRPO seed."""
    grpo = [r.seed for r in inputs.arm("grpo")]
    seeds = [r.seed for r in inputs.arm(arm)]
    return paired(inputs.pullback, pullback_pairs(arm, seeds, grpo))


def _pullback_calibration(inputs: Inputs) -> list[tuple[str, Estimate]]:
    got = paired(inputs.pullback, calibration_pairs([r.seed for r in inputs.arm("grpo")]))
    return [] if got is None else [("the next GRPO seed − the one after, per seed", got)]


@dataclass(frozen=True)
class Read:
    """One metric of a claim, read: its reading, margin and Holm-adjusted p-value."""

    claim: Claim
    metric: str
    margin: Margin
    estimate: Estimate | None
    reading: Reading | None
    adjusted: float


def readings(inputs: Inputs) -> list[Read]:
    """Every claim's metrics read, Tandem RL against GRPO, Holm-adjusted over the page."""
    margins = {k: Margin(**v) for k, v in inputs.study["margins"].items()}
    found = []
    for claim in CLAIMS:
        for metric in claim.metrics:
            if metric not in margins:
                raise KeyError(
                    f"margins has no {metric!r}: state its equivalence margin and reason in "
                    "conf/study/<name>.yaml before reading the data."
                )
            est = estimate(inputs, metric, "trl")
            found.append(
                (
                    claim,
                    metric,
                    est,
                    None if est is None else read(claim, metric, est, margins[metric]),
                )
            )
    adjusted = holm([r.p if r is not None else float("nan") for *_, r in found])
    return [
        Read(c, m, margins[m], e, r, a) for (c, m, e, r), a in zip(found, adjusted, strict=True)
    ]
