"""Team statistics of co-written rollouts: the senior's token share and handoffs per rollout.

Both read ``Rollouts.authors`` (``[N, T]``: SENIOR 1, JUNIOR 0, PAD -1). The share is
token-weighted (senior tokens over all tokens, as ``train/senior_share`` logs it), so that
long rollouts count by their length; a handoff is a change of author between two adjacent
tokens of a row. States are sums, reduced by summing.

What this file leaves out: per-step training logs (``tandem.modules.stats``, reduced by
Lightning's ``log(sync_dist=True)``).
"""

from __future__ import annotations

from torch import Tensor

from tandem.metrics.base import TokenMean
from tandem.registry import METRICS
from tandem.samplers.base import PAD, SENIOR


def handoff_counts(authors: Tensor) -> Tensor:
    """``[N]`` author changes between adjacent real tokens of each row of ``authors [N, T]``."""
    real = authors != PAD  # [N, T]
    changes = (authors[:, 1:] != authors[:, :-1]) & real[:, 1:] & real[:, :-1]  # [N, T-1]
    return changes.sum(1)


@METRICS.register("senior_share")
class SeniorShare(TokenMean):
    """Fraction of all real tokens that the senior wrote.

    Example:
        >>> m = SeniorShare()
        >>> m.update(torch.tensor([[1, 1, 0, -1], [0, 0, 0, 1]]))
        >>> round(float(m.compute()), 4)
        0.4286
    """

    def update(self, authors: Tensor) -> None:
        """Add rollouts: ``authors [N, T]``."""
        self.add((authors[authors != PAD] == SENIOR).float())


@METRICS.register("handoffs")
class HandoffsPerRollout(TokenMean):
    """Mean number of author changes per rollout.

    Example:
        >>> m = HandoffsPerRollout()
        >>> m.update(torch.tensor([[1, 1, 0, -1], [0, 1, 0, 1]]))
        >>> float(m.compute())
        2.0
    """

    def update(self, authors: Tensor) -> None:
        """Add rollouts: ``authors [N, T]``."""
        self.add(handoff_counts(authors).float())
