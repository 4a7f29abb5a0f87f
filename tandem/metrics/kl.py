"""Drift: the mean per-token KL(senior || base) in nats, from full next-token distributions.

Averaged over tokens (not over rollouts), so long responses weigh by their length, as the
per-token number reported in the paper. States are a sum and a count, reduced by summing.

What this file leaves out: producing the distributions (teacher forcing both models on the
senior's own outputs, ``tandem.evaluation.forcing``).
"""

from __future__ import annotations

from torch import Tensor

from tandem.metrics.base import TokenMean
from tandem.metrics.distributions import kl_divergence, masked_positions
from tandem.registry import METRICS


@METRICS.register("token_kl")
class TokenKL(TokenMean):
    """Mean over tokens of ``KL(p || q)``, with p the senior and q the base (or junior).

    Example:
        >>> m = TokenKL()
        >>> logits = torch.randn(2, 3, 5)
        >>> m.update(logits, logits, torch.ones(2, 3, dtype=torch.bool))
        >>> float(m.compute())
        0.0
    """

    higher_is_better = False

    def update(self, p_logits: Tensor, q_logits: Tensor, mask: Tensor | None = None) -> None:
        """Add the positions of ``mask``.

        Args:
            p_logits: ``[N, T, V]`` logits or log-probs of the senior.
            q_logits: ``[N, T, V]`` the same of the base, at the same positions.
            mask: ``[N, T]`` bool, the generated tokens to count (None: all).
        """
        self.add(kl_divergence(masked_positions(p_logits, mask), masked_positions(q_logits, mask)))
