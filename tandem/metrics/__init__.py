"""Metrics as ``torchmetrics.Metric`` s, so that they reduce correctly across processes.

Each registers in ``tandem.registry.METRICS`` (its first lookup imports every module of this
folder, so a new file needs no line here): ``pass_at_k``, ``token_kl`` (drift), ``junior_ce``
(per chain of thought, the paper's), ``junior_ce_pooled`` (per token) and ``overlap``
(legibility; ``junior_ce_per_byte`` across vocabularies), ``senior_share``, ``handoffs`` and
``reward_by_author`` (team), ``response_length`` and ``truncated`` (lengths).

What this file leaves out: everything but the names it exports.
"""

from __future__ import annotations

from tandem.metrics.cross_entropy import JuniorCrossEntropy, PooledJuniorCrossEntropy
from tandem.metrics.distributions import kl_divergence, masked_positions, token_overlap
from tandem.metrics.kl import TokenKL
from tandem.metrics.lengths import ResponseLength, Truncated
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
    "ResponseLength",
    "SeniorShare",
    "TokenKL",
    "Truncated",
    "kl_divergence",
    "masked_positions",
    "pass_at_k",
    "token_overlap",
]
