"""Legibility: the junior's cross-entropy, in nats per token, on text the senior wrote.

``-mean log p_junior(token)`` over the senior-written tokens: how surprised the frozen junior is
by the senior's chain of thought. ``update`` takes the junior's log-prob of each emitted token
(``[N, T]``, as the engine records it or teacher forcing gives it), or its full logits
(``[N, T, V]``) with the tokens. States are a sum and a count, reduced by summing.

What this file leaves out: which tokens count (the caller's mask: the senior's tokens).
"""

from __future__ import annotations

from torch import Tensor

from tandem.metrics.base import TokenMean
from tandem.metrics.distributions import masked_positions
from tandem.registry import METRICS


@METRICS.register("junior_ce")
class JuniorCrossEntropy(TokenMean):
    """Mean negative log-likelihood per token under the junior.

    Example:
        >>> m = JuniorCrossEntropy()
        >>> m.update(torch.tensor([[-1.0, -3.0]]), torch.tensor([[True, True]]))
        >>> float(m.compute())
        2.0
    """

    higher_is_better = False

    def update(
        self, logprobs: Tensor, mask: Tensor | None = None, tokens: Tensor | None = None
    ) -> None:
        """Add the tokens of ``mask``.

        Args:
            logprobs: ``[N, T]`` the junior's log-prob of each token, or ``[N, T, V]`` its
                logits (or log-probs) over the vocabulary, with ``tokens``.
            mask: ``[N, T]`` bool, the senior-written tokens (None: all).
            tokens: ``[N, T]`` token ids, needed with ``[N, T, V]`` logits.
        """
        if logprobs.dim() == 3:
            assert tokens is not None, "[N, T, V] logits need the [N, T] tokens they score"
            picked = masked_positions(logprobs, mask)  # [M, V]
            ids = masked_positions(tokens.to(logprobs.device), mask)  # [M]
            lp = picked.float().log_softmax(-1).gather(-1, ids[:, None]).squeeze(-1)  # [M]
        else:
            lp = masked_positions(logprobs, mask).float()  # [M]
        self.add(-lp)
