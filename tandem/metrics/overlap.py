"""Legibility: the mean per-token overlap ``sum_v min(p_senior(v), p_junior(v))``.

The overlap is the probability mass the two next-token distributions share (1 minus their total
variation distance): 1 where the junior would have written what the senior writes, 0 where it
could never. Averaged over tokens; states are a sum and a count, reduced by summing.

What this file leaves out: producing the distributions (``tandem.evaluation.forcing``).
"""

from __future__ import annotations

from torch import Tensor

from tandem.metrics.base import TokenMean
from tandem.metrics.distributions import masked_positions, token_overlap
from tandem.registry import METRICS


@METRICS.register("overlap")
class DistributionOverlap(TokenMean):
    """Mean over tokens of ``sum_v min(p(v), q(v))``, in [0, 1].

    Example:
        >>> m = DistributionOverlap()
        >>> logits = torch.randn(2, 3, 5)
        >>> m.update(logits, logits)
        >>> round(float(m.compute()), 6)
        1.0
    """

    higher_is_better = True

    def update(self, p_logits: Tensor, q_logits: Tensor, mask: Tensor | None = None) -> None:
        """Add the positions of ``mask``.

        Args:
            p_logits: ``[N, T, V]`` logits or log-probs of the senior.
            q_logits: ``[N, T, V]`` the same of the junior, at the same positions.
            mask: ``[N, T]`` bool, the tokens to count (None: all).
        """
        self.add(token_overlap(masked_positions(p_logits, mask), masked_positions(q_logits, mask)))
