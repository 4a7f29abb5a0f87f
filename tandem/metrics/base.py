"""The shared shape of the mean metrics: a sum and a count, reduced by summing.

The per-token metrics add one value per token, so long responses weigh by their length, as
the paper's per-token numbers do; per-rollout ones (handoffs) add one value per rollout.
What this file leaves out: what each metric measures (one file each).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric


class TokenMean(Metric):
    """Mean of every value added with ``add`` (one per token, or per rollout); NaN before any."""

    full_state_update = False
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def add(self, values: Tensor) -> None:
        """Count ``values``, one per token (or per rollout)."""
        self.total += values.double().sum().to(self.total.device)
        self.count += values.numel()

    def compute(self) -> Tensor:
        return self.total / self.count
