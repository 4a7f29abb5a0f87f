"""How long the rollouts are: the mean response length in tokens, and the share cut short.

``response_length`` reads ``authors [N, T]`` (a row's real tokens are its non-PAD authors, which
``tandem.modules.checks`` holds to ``Rollouts.lengths``); ``truncated`` reads ``stop_reasons
[N]``: a rollout stopped at ``max_new_tokens``, at the context's end or at a schedule's cap
(``StopReason.LENGTH``), rather than at an EOS. Both are per rollout, so each row counts once.

What this file leaves out: which of them a run logs (the ``metrics`` of its config).
"""

from __future__ import annotations

from torch import Tensor

from tandem.engine.base import StopReason
from tandem.metrics.base import TokenMean
from tandem.registry import METRICS
from tandem.samplers.base import PAD


@METRICS.register("response_length")
class ResponseLength(TokenMean):
    """Mean real tokens per rollout.

    Example:
        >>> import torch
        >>> m = ResponseLength()
        >>> m.update(torch.tensor([[1, 0, 1, -1], [1, -1, -1, -1]]))
        >>> float(m.compute())
        2.0
    """

    def update(self, authors: Tensor) -> None:
        """Add rollouts: ``authors [N, T]``."""
        self.add((authors != PAD).sum(1).float())


@METRICS.register("truncated")
class Truncated(TokenMean):
    """Share of rollouts that stopped without an EOS (``StopReason.LENGTH``).

    Example:
        >>> import torch
        >>> m = Truncated()
        >>> m.update(torch.tensor([int(StopReason.LENGTH), int(StopReason.EOS)]))
        >>> float(m.compute())
        0.5
    """

    def update(self, stop_reasons: Tensor) -> None:
        """Add rollouts: ``stop_reasons [N]``."""
        self.add((stop_reasons == StopReason.LENGTH).float())
