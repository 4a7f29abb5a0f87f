"""Team statistics of co-written rollouts: the senior's token share, handoffs per rollout and
the reward of rollouts by their majority author.

Each reads ``Rollouts.authors`` (``[N, T]``: SENIOR 1, JUNIOR 0, PAD -1). The share is
token-weighted (senior tokens over all tokens, as ``train/senior_share`` logs it), so that
long rollouts count by their length; a handoff is a change of author between two adjacent
tokens of a row. States are sums, reduced by summing.

What this file leaves out: which of them a run logs (the ``metrics`` of its config).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

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


@METRICS.register("reward_by_author")
class RewardByAuthor(Metric):
    """Mean reward of the rollouts the senior wrote at least half of, and of the others:
    ``reward_senior_majority`` and ``reward_junior_majority`` (NaN for a side with none).

    Example:
        >>> m = RewardByAuthor()
        >>> m.update(torch.tensor([[1, 1, 0], [0, 0, 1], [1, -1, -1]]), torch.tensor([1.0, 0, 0]))
        >>> {k: float(v) for k, v in m.compute().items()}
        {'reward_senior_majority': 0.5, 'reward_junior_majority': 0.0}
    """

    full_state_update = False
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        # [senior majority, junior majority]
        self.add_state("total", torch.zeros(2, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros(2, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, authors: Tensor, rewards: Tensor) -> None:
        """Add rollouts: ``authors [N, T]`` and their ``rewards [N]``."""
        real = (authors != PAD).sum(1).clamp(min=1)  # [N]
        senior = (authors == SENIOR).sum(1) / real >= 0.5  # [N]
        side = torch.stack([senior, ~senior]).double().to(self.total.device)  # [2, N]
        self.total += side @ rewards.double().to(self.total.device)
        self.count += side.sum(1)

    def compute(self) -> dict[str, Tensor]:
        mean = self.total / self.count
        return {"reward_senior_majority": mean[0], "reward_junior_majority": mean[1]}
