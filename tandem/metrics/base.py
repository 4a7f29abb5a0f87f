"""The shared shape of the per-token metrics: a sum and a count, reduced by summing.

Averaging over tokens (not rollouts) weighs long responses by their length, as the paper's
per-token numbers do. Subclasses turn their inputs into one value per counted token.
What this file leaves out: what each metric measures (one file each).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric


class TokenMean(Metric):
    """Mean over every token added with ``add``; NaN before any token."""

    full_state_update = False
    is_differentiable = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def add(self, values: Tensor) -> None:
        """Count ``values``, one per token."""
        self.total += values.double().sum().to(self.total.device)
        self.tokens += values.numel()

    def compute(self) -> Tensor:
        return self.total / self.tokens
