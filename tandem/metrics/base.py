"""The shared shape of the mean metrics (a sum and a count, reduced by summing), and how the
metrics a config lists are built, fed and read: one path for training, validation and
``tandem.evaluate``.

The per-token metrics add one value per token, so long responses weigh by their length, as
the paper's per-token numbers do; per-rollout ones (handoffs) add one value per rollout.
What this file leaves out: what each metric measures (one file each).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

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


# what a batch of rollouts offers the metrics a config lists: a metric's ``update`` names the
# ones it reads (``authors [N, T]``: SENIOR, JUNIOR, PAD; ``rewards [N]``; ``stop_reasons [N]``)
ROLLOUT_INPUTS = ("authors", "rewards", "stop_reasons")


def build_metrics(spec: Mapping[str, str]) -> dict[str, Metric]:
    """``{log key: registry name}`` (the ``metrics`` of a config) -> ``{log key: new metric}``."""
    from tandem.registry import METRICS  # the registry imports this package's modules

    return {key: METRICS.build(name) for key, name in spec.items()}


def measure(metrics: Mapping[str, Metric], **inputs: Tensor) -> None:
    """Update every metric with the ``inputs`` its ``update`` names."""
    for metric in metrics.values():
        wanted = inspect.signature(metric.update).parameters
        metric.update(**{n: v for n, v in inputs.items() if n in wanted})


def measure_rollouts(metrics: Mapping[str, Metric], rollouts: Any, rewards: Tensor) -> None:
    """Feed one batch of rollouts (``tandem.engine.Rollouts``) and their ``rewards [N]`` to the
    metrics a config lists: training's steps, validation's passes and the evaluation's alike."""
    measure(
        metrics,
        authors=rollouts.authors.cpu(),
        rewards=rewards.flatten().float().cpu(),
        stop_reasons=rollouts.stop_reasons.cpu(),
    )


def values(metrics: Mapping[str, Metric]) -> dict[str, Tensor]:
    """Each metric's value by its key; a metric that computes a dict (pass@k) gives its own
    keys."""
    out: dict[str, Tensor] = {}
    for key, metric in metrics.items():
        value = metric.compute()
        out.update(value if isinstance(value, dict) else {key: value})
    return out
