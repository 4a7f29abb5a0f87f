"""Legibility: the junior's cross-entropy, in nats per token, on text the senior wrote.

How surprised the frozen junior is by the senior's chain of thought, two ways:

- ``junior_ce`` (the paper's): per chain of thought (one row), the mean NLL per token of the
  junior on its tokens; then the mean over chains of thought. Every CoT weighs the same, however
  long, as in the authors' ``eval/legibility.py``; the macro mean over eval sets is taken where
  the per-set tables are combined (``tandem.evaluation.results``).
- ``junior_ce_pooled``: the NLL summed over every token of every CoT, divided by the tokens, so
  long CoTs weigh by their length. Kept beside the paper's figure because it is the quantity
  a per-token loss sees; the two differ when CoT length and per-token NLL go together.

``update`` takes the junior's log-prob of each emitted token (``[N, T]``, as the engine records
it or teacher forcing gives it), or its full logits (``[N, T, V]``) with the tokens. States are a
sum and a count, reduced by summing, so both reduce correctly across processes as long as no
row is split between processes (the evaluation shards whole rows).

What this file leaves out: which tokens count (the caller's mask: the senior's tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tandem.metrics.base import TokenMean
from tandem.metrics.distributions import masked_positions
from tandem.registry import METRICS


def junior_nll(
    logprobs: Tensor, mask: Tensor | None = None, tokens: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The junior's NLL of each counted token and the row it belongs to.

    Args:
        logprobs: ``[N, T]`` the junior's log-prob of each token, or ``[N, T, V]`` its
            logits (or log-probs) over the vocabulary, with ``tokens``.
        mask: ``[N, T]`` bool, the senior-written tokens (None: all).
        tokens: ``[N, T]`` token ids, needed with ``[N, T, V]`` logits.

    Returns:
        ``[M]`` float32 NLLs of the counted tokens and ``[M]`` long row indices.
    """
    n, t = logprobs.shape[:2]
    rows = torch.arange(n, device=logprobs.device)[:, None].expand(n, t)  # [N, T]
    row_of = masked_positions(rows, mask)  # [M]
    if logprobs.dim() == 3:
        assert tokens is not None, "[N, T, V] logits need the [N, T] tokens they score"
        # select first: the log-softmax then runs over M positions, not all N * T
        picked = masked_positions(logprobs, mask)  # [M, V]
        ids = masked_positions(tokens.to(logprobs.device), mask)  # [M]
        lp = picked.float().log_softmax(-1).gather(-1, ids[:, None]).squeeze(-1)  # [M]
    else:
        lp = masked_positions(logprobs, mask).float()  # [M]
    return -lp, row_of


def per_row_mean(values: Tensor, row_of: Tensor, rows: int) -> Tensor:
    """``[R]`` the mean of ``values [M]`` within each row that has any (R <= ``rows``)."""
    sums = torch.zeros(rows, dtype=torch.float64, device=values.device)
    counts = torch.zeros(rows, dtype=torch.float64, device=values.device)
    sums.index_add_(0, row_of, values.double())
    counts.index_add_(0, row_of, torch.ones_like(values, dtype=torch.float64))
    # a row with no counted token has no cross-entropy: it is left out, not counted as 0
    kept = counts > 0
    return sums[kept] / counts[kept]


@METRICS.register("junior_ce")
class JuniorCrossEntropy(TokenMean):
    """The paper's legibility: mean over CoTs of each CoT's mean NLL per token under the junior.

    Example:
        >>> m = JuniorCrossEntropy()
        >>> lp = torch.tensor([[-1.0, -3.0, -3.0], [-1.0, 0.0, 0.0]])
        >>> m.update(lp, torch.tensor([[True, True, True], [True, False, False]]))
        >>> round(float(m.compute()), 4)  # (7/3 + 1) / 2
        1.6667
    """

    higher_is_better = False

    def update(
        self, logprobs: Tensor, mask: Tensor | None = None, tokens: Tensor | None = None
    ) -> None:
        """Add one value per row (CoT) with at least one token in ``mask``.

        Args:
            logprobs: ``[N, T]`` the junior's log-prob of each token, or ``[N, T, V]`` its
                logits (or log-probs) over the vocabulary, with ``tokens``.
            mask: ``[N, T]`` bool, the senior-written tokens (None: all).
            tokens: ``[N, T]`` token ids, needed with ``[N, T, V]`` logits.
        """
        nll, row_of = junior_nll(logprobs, mask, tokens)
        self.add(per_row_mean(nll, row_of, logprobs.shape[0]))


@METRICS.register("junior_ce_pooled")
class PooledJuniorCrossEntropy(TokenMean):
    """Mean NLL per token under the junior, pooled over every token of every CoT.

    Example:
        >>> m = PooledJuniorCrossEntropy()
        >>> lp = torch.tensor([[-1.0, -3.0, -3.0], [-1.0, 0.0, 0.0]])
        >>> m.update(lp, torch.tensor([[True, True, True], [True, False, False]]))
        >>> float(m.compute())  # 8 / 4
        2.0
    """

    higher_is_better = False

    def update(
        self, logprobs: Tensor, mask: Tensor | None = None, tokens: Tensor | None = None
    ) -> None:
        """Add the tokens of ``mask`` (arguments as ``JuniorCrossEntropy.update``)."""
        nll, _ = junior_nll(logprobs, mask, tokens)
        self.add(nll)
