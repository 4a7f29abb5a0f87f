"""Did Tandem RL pull back the items GRPO displaced most, beyond drifting less? A statistic that
separates the direction of a shift from its size.

The paper's statistics (``tandem.analysis.displacement``: the share of GRPO's 500 most displaced
items that sit closer to the base under Tandem RL, and the Spearman correlation of GRPO's shift
with Tandem RL's shift from GRPO) read "pulled back" for any model that drifts less or
elsewhere: the items are chosen for a large GRPO shift, so another model's shift on them is
smaller on average (regression to the mean), and an unrelated shift, or one half GRPO's size,
sits closer to the base on them by construction. Here, per vocabulary item ``v``, ``x[v]`` is
GRPO's shift of its mean probability from the base's and ``y[v]`` the other model's, both on
GRPO's own solo texts (``tandem.analysis.displacement`` says why mean probabilities), each over
the square root of the base's mean probability (``scaled``: a shift's squared length is then its
chi-square distance from the base, about twice its KL, so each item weighs by the drift it
carries rather than by its raw probability, which lets a few frequent items decide everything),
and:

- **held-out items**: the problems are split in two halves (even and odd positions in problem
  order). The items are GRPO's most displaced on one half (the ``top_share`` of the vocabulary
  with the largest ``|x|``: a share, so "most displaced" means as much on a 1,110-item
  vocabulary as on Qwen's 151,669, where the paper's 500 items are 45% and 0.3% of it), and
  everything is measured on the other half; then the halves swap, and the two readings are
  averaged;
- **direction, not size**: the slope of ``y`` on ``x`` (through the origin) over the most
  displaced items and over all other items, each times ``size(x) / size(y)`` (a shift's size:
  its length), so that slopes are in units of each model's own drift. The pull-back is the
  slope on the rest minus the slope on the most displaced items: how much less the model
  follows GRPO where GRPO moved most than it follows GRPO elsewhere.

A model that drifts less everywhere (GRPO's shift scaled down: that is size, read by
``drift/kl``), a shift unrelated to GRPO's of any size, and a second GRPO seed all read zero in
expectation; a model that follows GRPO but takes back half of its move on the most displaced
items reads about half a unit. The per-problem influence of each figure (its linearisation in
each problem's share of the mean probabilities, by autograd) lets the study read it with the
same model of seed and problem variance as every other claim (``tandem.analysis.mixed``). A
smooth shift is not linear in probability, so even a second GRPO seed reads a little above zero
at times; the study reads each model's pull-back against the GRPO seeds' own on the same
reference seed (``tandem.analysis.claims``).

What this file leaves out: choosing the models and texts (``tandem.analysis.study``) and the
verdict (``tandem.analysis.claims``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tandem.analysis.displacement import records_to_tensors
from tandem.evaluation.forcing import forced_chunks
from tandem.metrics import masked_positions

# the most displaced items: 5% of the vocabulary (56 of the tiny world's 1,110 items; 7,583 of
# Qwen3's 151,669), enough items for a slope on a small vocabulary, few enough to be "most"
TOP_SHARE = 0.05


@dataclass(frozen=True)
class Pullback:
    """One model's pull-back against one GRPO seed, on that seed's texts.

    Attributes:
        value: the pull-back: ``rest - top`` (positive: pulled back beyond its drift).
        top: the normalised slope over GRPO's most displaced items.
        rest: the normalised slope over the other items.
        items: how many items are "most displaced".
        influence: ``[P]`` each problem's contribution to ``value`` (sums to zero).
    """

    value: float
    top: float
    rest: float
    items: int
    influence: Tensor  # [P] float64


def problem_probabilities(
    models: Sequence[torch.nn.Module], records: Iterable[dict[str, Any]], batch_size: int = 8
) -> tuple[Tensor, Tensor, list[tuple[str, int]]]:
    """Each model's next-token probabilities summed over each problem's response positions.

    Args:
        models: causal LMs sharing one vocabulary.
        records: evaluation records (``set``, ``problem_index``, ``prompt_ids``, ``tokens``).
        batch_size: rows per forward pass.

    Returns:
        ``sums [M, P, V]`` (float64; 1.2 MB per model and problem on a 151k vocabulary),
        ``positions [P]`` and the problems ``(set, index)`` in order.
    """
    records = list(records)
    problems = sorted({(r["set"], int(r["problem_index"])) for r in records})
    where = {p: i for i, p in enumerate(problems)}
    row_problem = torch.tensor([where[(r["set"], int(r["problem_index"]))] for r in records])
    prompt_tokens, prompt_mask, tokens, mask = records_to_tensors(records)
    sums: Tensor | None = None
    positions = torch.zeros(len(problems), dtype=torch.float64)
    for chunk in forced_chunks(models, prompt_tokens, prompt_mask, tokens, mask, batch_size):
        of = row_problem[chunk.rows][:, None].expand_as(chunk.mask)[chunk.mask]  # [m]
        probs = [masked_positions(x, chunk.mask).double().softmax(-1).cpu() for x in chunk.logits]
        if sums is None:
            sums = torch.zeros(len(models), len(problems), probs[0].shape[-1], dtype=torch.float64)
        for m, p in enumerate(probs):  # p: [m, V]
            sums[m].index_add_(0, of, p)
        positions.index_add_(0, of, torch.ones(len(of), dtype=torch.float64))
    assert sums is not None, "no response tokens to average over"
    return sums, positions, problems


def halves(count: int) -> Tensor:
    """``[P]`` True for the first half of problems in order (even positions), False else."""
    return torch.arange(count) % 2 == 0


def pullback(
    sums: Tensor, positions: Tensor, first: Tensor, top_share: float = TOP_SHARE
) -> Pullback:
    """The pull-back of ``sums[2]`` against ``sums[1]`` (GRPO) from ``sums[0]`` (the base).

    Args:
        sums: ``[3, P, V]`` per-problem probability sums of base, GRPO and the other model.
        positions: ``[P]`` response positions per problem.
        first: ``[P]`` bool, the problems of the first half.
        top_share: the share of the vocabulary that is "most displaced" (at least one item).
    """
    assert sums.shape[0] == 3, "sums holds the base, GRPO and the model read against GRPO"
    if not 0 < top_share < 1:
        raise ValueError(f"top_share ({top_share}) must lie strictly between 0 and 1.")
    items = max(1, math.ceil(top_share * sums.shape[-1]))
    one = _one_way(sums, positions, first, ~first, items)
    other = _one_way(sums, positions, ~first, first, items)
    value, top, rest = ((a + b) / 2 for a, b in zip(one[:3], other[:3], strict=True))
    return Pullback(value, top, rest, items, (one[3] + other[3]) / 2)


def scaled(base: Tensor, model: Tensor) -> Tensor:
    """``[V]`` a model's shift of mean probability from the base's, over the square root of the
    base's: the coordinates in which a shift's squared length is its chi-square distance from
    the base (about twice the KL of a small shift), so an item weighs by the drift it carries."""
    return (model - base) / base.clamp_min(1e-30).sqrt()


def slopes(base: Tensor, grpo: Tensor, other: Tensor, top: Tensor) -> tuple[Tensor, ...]:
    """The pull-back, the slope over ``top`` ([V] bool) and over the rest, from mean
    probabilities ``[V]``, each slope scaled by ``size(x) / size(y)``."""
    x, y = scaled(base, grpo), scaled(base, other)  # [V]
    scale = x.square().sum().sqrt() / y.square().sum().sqrt()

    def slope(mask: Tensor) -> Tensor:
        return (x * y)[mask].sum() / x[mask].square().sum() * scale

    top_slope, rest_slope = slope(top), slope(~top)
    return rest_slope - top_slope, top_slope, rest_slope


def _one_way(
    sums: Tensor, positions: Tensor, select: Tensor, measure: Tensor, items: int
) -> tuple[float, float, float, Tensor]:
    """Items chosen on ``select``'s problems, everything measured on ``measure``'s: the
    pull-back, both slopes and the influence ``[P]`` (zero on the selecting problems)."""
    chosen = sums[:, select].sum(1) / positions[select].sum()  # [3, V]
    moved = scaled(chosen[0], chosen[1]).abs()
    top = torch.zeros_like(moved, dtype=torch.bool)
    top[moved.argsort(descending=True, stable=True)[:items]] = True
    total = positions[measure].sum()
    means = (sums[:, measure].sum(1) / total).requires_grad_(True)  # [3, V]
    value, top_slope, rest_slope = slopes(means[0], means[1], means[2], top)
    (grad,) = torch.autograd.grad(value, means)  # [3, V]
    means = means.detach()
    # a problem's share of each mean, less its positions' worth of the mean: its deviation
    deviation = sums[:, measure] - means[:, None, :] * positions[measure][None, :, None]
    influence = torch.zeros(sums.shape[1], dtype=torch.float64)
    influence[measure] = torch.einsum("mpv,mv->p", deviation, grad) / total
    return float(value.detach()), float(top_slope.detach()), float(rest_slope.detach()), influence
