"""The GRPO objective: advantages, masks, clipping, aggregation, KL and the imitation term."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.modules.loss import (
    LossConfig,
    aggregate,
    group_advantages,
    grpo_loss,
    kl_penalty,
    zero_variance_groups,
)


def test_group_advantages_std_and_mean() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    adv = group_advantages(rewards, 4, "std")
    # mean 0.25, unbiased std 0.5
    assert torch.allclose(adv[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-4)
    assert torch.allclose(adv.view(2, 4).mean(1), torch.zeros(2), atol=1e-6)
    mean_only = group_advantages(rewards, 4, "mean")
    assert torch.allclose(mean_only[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_equal_groups_give_zero_never_nan() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    adv = group_advantages(rewards, 3, "std")
    assert not torch.isnan(adv).any()
    assert torch.equal(adv, torch.zeros(6))
    assert zero_variance_groups(rewards, 3).tolist() == [True, True]
    assert zero_variance_groups(torch.tensor([1.0, 0.0, 1.0, 1.0]), 2).tolist() == [False, True]


def test_group_advantages_rejects_partial_groups() -> None:
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.ones(6), 4)
    with pytest.raises(ValueError, match="normalize"):
        group_advantages(torch.ones(4), 2, "median")


def _inputs():
    torch.manual_seed(0)
    logp = (-torch.rand(2, 5)).requires_grad_(True)
    old = logp.detach().clone()
    senior = torch.tensor([[1, 1, 0, 0, 1], [0, 1, 1, 0, 0]], dtype=torch.bool)
    junior = torch.tensor([[0, 0, 1, 1, 0], [1, 0, 0, 1, 0]], dtype=torch.bool)
    return logp, old, senior, junior


def test_gradient_flows_only_through_senior_tokens() -> None:
    logp, old, senior, junior = _inputs()
    loss, _ = grpo_loss(logp, old, None, torch.tensor([1.0, -1.0]), senior, junior, LossConfig())
    loss.backward()
    assert torch.all(logp.grad[~senior] == 0)
    assert torch.all(logp.grad[senior] != 0)
    # at ratio 1 the token-mean gradient is -adv / n_senior_tokens
    n = senior.sum()
    assert torch.allclose(logp.grad[0][senior[0]], torch.full((3,), -1.0 / n))
    assert torch.allclose(logp.grad[1][senior[1]], torch.full((2,), 1.0 / n))


def test_imitation_term_reaches_junior_tokens() -> None:
    logp, old, senior, junior = _inputs()
    cfg = LossConfig(lambda_jun=0.5)
    loss, stats = grpo_loss(logp, old, None, torch.zeros(2), senior, junior, cfg)
    loss.backward()
    assert torch.all(logp.grad[junior] < 0)  # minimising -logp raises junior log-likelihood
    assert torch.all(logp.grad[~junior] == 0)
    assert math.isclose(
        float(stats["junior_nll"]), float(-logp.detach()[junior].mean()), rel_tol=1e-6
    )


def test_clipping_uses_separate_low_and_high_epsilon() -> None:
    old = torch.zeros(1, 4)
    # ratios 1.3, 0.7, 1.1, 0.9
    logp = torch.log(torch.tensor([[1.3, 0.7, 1.1, 0.9]])).requires_grad_(True)
    mask = torch.ones(1, 4, dtype=torch.bool)
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)
    loss, stats = grpo_loss(logp, old, None, torch.tensor([1.0]), mask, ~mask, cfg)
    loss.backward()
    # positive advantage: the 1.3 ratio is past 1.28 and clipped; 0.7 is below 0.8 but the
    # unclipped term is the minimum there, so it keeps its gradient
    assert logp.grad[0, 0] == 0
    assert logp.grad[0, 1] != 0 and logp.grad[0, 2] != 0 and logp.grad[0, 3] != 0
    assert math.isclose(float(stats["clip_fraction"]), 0.5)


def test_aggregations() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert float(aggregate(values, mask, "token_mean")) == pytest.approx(10 / 4)
    assert float(aggregate(values, mask, "seq_mean_token_mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate(values, mask, "seq_sum_constant", 5.0)) == pytest.approx(10 / 10)
    empty = torch.zeros(2, 3, dtype=torch.bool)
    assert float(aggregate(values, empty, "seq_mean_token_mean")) == 0.0


def test_kl_estimators() -> None:
    logp = torch.log(torch.tensor([0.5, 0.2, 0.9]))
    ref = torch.log(torch.tensor([0.5, 0.4, 0.3]))
    k3 = kl_penalty(logp, ref, "k3")
    assert k3[0] == 0 and torch.all(k3 >= 0)
    assert torch.allclose(kl_penalty(logp, ref, "k1"), logp - ref)


def test_kl_penalty_pulls_toward_the_reference() -> None:
    logp = torch.log(torch.tensor([[0.9, 0.9]])).requires_grad_(True)
    ref = torch.log(torch.tensor([[0.3, 0.3]]))
    mask = torch.ones(1, 2, dtype=torch.bool)
    cfg = LossConfig(kl_beta=1.0, kl_estimator="k3")
    loss, stats = grpo_loss(logp, logp.detach(), ref, torch.zeros(1), mask, ~mask, cfg)
    loss.backward()
    assert float(stats["kl"]) > 0
    assert torch.all(logp.grad > 0)  # descending lowers logp toward the reference


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"aggregation": "sum"}, "aggregation"),
        ({"kl_estimator": "k2"}, "kl_estimator"),
        ({"clip_low": -0.1}, "clip_low"),
        ({"constant": 0}, "constant"),
    ],
)
def test_bad_loss_config_is_named(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        LossConfig(**kwargs)


def test_kl_penalty_without_reference_log_probs_fails_closed() -> None:
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    cfg = LossConfig(kl_beta=0.1)
    with pytest.raises(ValueError, match="kl_beta"):
        grpo_loss(logp, logp.detach(), None, torch.ones(2), mask, ~mask, cfg)
    _, stats = grpo_loss(logp, logp.detach(), None, torch.ones(2), mask, ~mask, LossConfig())
    assert "kl" not in stats
