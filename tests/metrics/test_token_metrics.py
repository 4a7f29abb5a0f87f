"""Drift, legibility and team metrics against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.metrics import (
    DistributionOverlap,
    HandoffsPerRollout,
    JuniorCrossEntropy,
    PooledJuniorCrossEntropy,
    SeniorShare,
    TokenKL,
    kl_divergence,
    token_overlap,
)
from tandem.registry import METRICS


def test_kl_and_overlap_of_two_known_distributions() -> None:
    p = torch.tensor([0.5, 0.5, 0.0]).log()
    q = torch.tensor([0.25, 0.25, 0.5]).log()
    # KL(p || q) = 2 * 0.5 * log(0.5 / 0.25) = log 2; the zero of p contributes nothing
    assert float(kl_divergence(p, q)) == pytest.approx(math.log(2))
    assert float(kl_divergence(q, p)) == math.inf
    assert float(token_overlap(p, q)) == pytest.approx(0.5)


def test_metrics_average_over_masked_tokens_only() -> None:
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(3, 4, 7, generator=g), torch.randn(3, 4, 7, generator=g)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    want_kl = kl_divergence(p, q)[mask].mean()
    want_overlap = token_overlap(p, q)[mask].mean()
    kl, shared = TokenKL(), DistributionOverlap()
    kl.update(p, q, mask)
    # logits and log-probs of the same distribution give the same numbers
    shared.update(p.log_softmax(-1), q * 1.0, mask)
    assert float(kl.compute()) == pytest.approx(float(want_kl), rel=1e-5)
    assert float(shared.compute()) == pytest.approx(float(want_overlap), rel=1e-5)
    assert 0 < float(shared.compute()) < 1 and float(kl.compute()) > 0


def test_self_comparison_is_zero_drift_and_full_overlap() -> None:
    logits = torch.randn(2, 5, 11) * 4
    kl, shared = TokenKL(), DistributionOverlap()
    kl.update(logits, logits.clone())
    shared.update(logits, logits.clone())
    assert float(kl.compute()) == 0.0
    assert float(shared.compute()) == pytest.approx(1.0, abs=1e-6)


def test_junior_cross_entropy_from_token_logprobs_or_logits() -> None:
    logits = torch.randn(2, 3, 6)
    tokens = torch.tensor([[0, 5, 2], [1, 1, 3]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 1]], dtype=torch.bool)
    lp = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)  # [2, 3]
    a, b = METRICS.build("junior_ce"), JuniorCrossEntropy()
    c, d = METRICS.build("junior_ce_pooled"), PooledJuniorCrossEntropy()
    for m in (a, c):
        m.update(lp, mask)
    for m in (b, d):
        m.update(logits, mask, tokens=tokens)
    per_cot = -(float(lp[0, :2].mean()) + float(lp[1, 2])) / 2
    pooled = -float(lp[mask].mean())
    for m in (a, b):
        assert float(m.compute()) == pytest.approx(per_cot, rel=1e-6)
    for m in (c, d):
        assert float(m.compute()) == pytest.approx(pooled, rel=1e-6)


def test_junior_cross_entropy_per_cot_differs_from_pooled_on_a_long_and_a_short_cot() -> None:
    # a long CoT of 4 easy tokens (NLL 0.5 each) and a short one of 1 hard token (NLL 3):
    # per CoT (0.5 + 3) / 2 = 1.75, pooled (4 * 0.5 + 3) / 5 = 1.0
    lp = torch.tensor([[-0.5, -0.5, -0.5, -0.5], [-3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    per_cot, pooled = JuniorCrossEntropy(), PooledJuniorCrossEntropy()
    per_cot.update(lp, mask)
    pooled.update(lp, mask)
    # the third row has no counted token: it is no CoT, not a CoT of cross-entropy 0
    assert float(per_cot.compute()) == pytest.approx(1.75)
    assert float(per_cot.count) == 2
    assert float(pooled.compute()) == pytest.approx(1.0)
    # split over two updates, the CoTs still weigh one each
    split = JuniorCrossEntropy()
    split.update(lp[:1], mask[:1])
    split.update(lp[1:], mask[1:])
    assert float(split.compute()) == pytest.approx(1.75)


def test_team_statistics() -> None:
    authors = torch.tensor([[1, 1, 0, 0, 1, -1], [1, 1, 1, -1, -1, -1]])
    share, handoffs = SeniorShare(), HandoffsPerRollout()
    share.update(authors)
    handoffs.update(authors)
    assert float(share.compute()) == pytest.approx(6 / 8)
    assert float(handoffs.compute()) == pytest.approx(1.0)  # (2 + 0) / 2 rollouts


def test_every_metric_is_registered() -> None:
    names = {
        "pass_at_k",
        "token_kl",
        "junior_ce",
        "junior_ce_pooled",
        "overlap",
        "senior_share",
        "handoffs",
        "reward_by_author",
    }
    assert names <= set(METRICS.names())


def test_reward_by_majority_author() -> None:
    m = METRICS.build("reward_by_author")
    # a tie (half each) counts for the senior, as the training log always counted it
    authors = torch.tensor([[1, 0, -1], [1, 1, 0], [0, 0, 1], [0, 0, 0]])
    m.update(authors, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    got = {k: float(v) for k, v in m.compute().items()}
    assert got == {"reward_senior_majority": 0.5, "reward_junior_majority": 1.0}
