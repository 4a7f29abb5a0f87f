"""Team statistics of co-written rollouts: the senior's token share and handoffs per rollout.

Both read ``Rollouts.authors`` (``[N, T]``: SENIOR 1, JUNIOR 0, PAD -1). The share is
token-weighted (senior tokens over all tokens, as ``train/senior_share`` logs it), so that
long rollouts count by their length; a handoff is a change of author between two adjacent
tokens of a row. States are sums, reduced by summing.

What this file leaves out: per-step training logs (``tandem.modules.stats``, reduced by
Lightning's ``log(sync_dist=True)``).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from tandem.registry import METRICS
from tandem.samplers.base import PAD, SENIOR


@METRICS.register("senior_share")
class SeniorShare(Metric):
    """Fraction of all real tokens that the senior wrote.

    Example:
        >>> m = SeniorShare()
        >>> m.update(torch.tensor([[1, 1, 0, -1], [0, 0, 0, 1]]))
        >>> round(float(m.compute()), 4)
        0.4286
    """

    full_state_update = False
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("senior", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, authors: Tensor) -> None:
        """Add rollouts: ``authors [N, T]``."""
        self.senior += (authors == SENIOR).sum().to(self.senior)
        self.tokens += (authors != PAD).sum().to(self.tokens)

    def compute(self) -> Tensor:
        return self.senior / self.tokens


@METRICS.register("handoffs")
class HandoffsPerRollout(Metric):
    """Mean number of author changes per rollout.

    Example:
        >>> m = HandoffsPerRollout()
        >>> m.update(torch.tensor([[1, 1, 0, -1], [0, 1, 0, 1]]))
        >>> float(m.compute())
        2.0
    """

    full_state_update = False
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("handoffs", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("rollouts", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, authors: Tensor) -> None:
        """Add rollouts: ``authors [N, T]``."""
        real = authors != PAD  # [N, T]
        changes = (authors[:, 1:] != authors[:, :-1]) & real[:, 1:] & real[:, :-1]  # [N, T-1]
        self.handoffs += changes.sum().to(self.handoffs)
        self.rollouts += authors.shape[0]

    def compute(self) -> Tensor:
        return self.handoffs / self.rollouts
