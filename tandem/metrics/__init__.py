"""Evaluation metrics as ``torchmetrics.Metric`` s, so that they reduce correctly across processes.

Importing this package registers each in ``tandem.registry.METRICS``: ``pass_at_k``, ``token_kl``
(drift), ``junior_ce`` (per chain of thought, the paper's), ``junior_ce_pooled`` (per token) and
``overlap`` (legibility; ``junior_ce_per_byte`` across vocabularies), ``senior_share`` and
``handoffs`` (team).

What this file leaves out: everything but the imports that register the members.
"""

from __future__ import annotations

from tandem.metrics.cross_entropy import JuniorCrossEntropy, PooledJuniorCrossEntropy
from tandem.metrics.distributions import kl_divergence, masked_positions, token_overlap
from tandem.metrics.kl import TokenKL
from tandem.metrics.overlap import DistributionOverlap
from tandem.metrics.pass_at_k import PassAtK, pass_at_k
from tandem.metrics.per_byte import JuniorBytesCrossEntropy
from tandem.metrics.team import HandoffsPerRollout, SeniorShare

__all__ = [
    "DistributionOverlap",
    "HandoffsPerRollout",
    "JuniorBytesCrossEntropy",
    "JuniorCrossEntropy",
    "PassAtK",
    "PooledJuniorCrossEntropy",
    "SeniorShare",
    "TokenKL",
    "kl_divergence",
    "masked_positions",
    "pass_at_k",
    "token_overlap",
]
