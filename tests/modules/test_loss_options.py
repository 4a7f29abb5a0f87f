"""The authors' loss options: verl's dual clip and KL clamp, and the token mean whose denominator
counts the junior's tokens too (the released verl's, taken before its senior gate)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from tandem.config import ConfigError, validate_train_config
from tandem.modules.loss import LossConfig, LossWeights, grpo_loss, kl_penalty, token_weights

CONF = str(Path(__file__).resolve().parents[2] / "conf")


def _row(ratio: float, advantage: float, cfg: LossConfig) -> tuple[float, float]:
    """The loss and its gradient of one senior token at ``ratio`` with ``advantage``."""
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    old = torch.zeros(1, 1)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, _ = grpo_loss(logp, old, None, torch.tensor([advantage]), mask, ~mask, cfg)
    loss.backward()
    return float(loss.detach()), float(logp.grad)


def test_dual_clip_caps_a_negative_advantages_loss_at_c() -> None:
    plain, dual = LossConfig(), LossConfig(dual_clip=3.0)
    # ratio 5, advantage -1: PPO's loss is 5 (the unclipped side is the larger), verl's 3
    assert _row(5.0, -1.0, plain) == pytest.approx((5.0, 5.0))
    loss, grad = _row(5.0, -1.0, dual)
    assert loss == pytest.approx(3.0) and grad == 0.0  # capped: no gradient through it
    # below the cap, and every positive advantage, as before
    assert _row(2.0, -1.0, dual) == pytest.approx(_row(2.0, -1.0, plain))
    assert _row(5.0, 1.0, dual) == pytest.approx(_row(5.0, 1.0, plain))


def test_dual_clip_fraction_counts_the_capped_tokens() -> None:
    logp = torch.log(torch.tensor([[5.0, 1.0], [5.0, 5.0]]))
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([-1.0, 1.0])
    _, stats = grpo_loss(logp, torch.zeros(2, 2), None, adv, mask, ~mask, LossConfig(dual_clip=3))
    assert float(stats["dual_clip_fraction"]) == pytest.approx(1 / 4)
    _, plain = grpo_loss(logp, torch.zeros(2, 2), None, adv, mask, ~mask, LossConfig())
    assert "dual_clip_fraction" not in plain


def test_kl_clamp_bounds_the_k3_estimate() -> None:
    logp = torch.tensor([[-20.0, -1.0]])
    ref = torch.tensor([[-1.0, -1.0]])
    raw = kl_penalty(logp, ref, "k3")
    assert float(raw[0, 0]) > 10 and float(raw[0, 1]) == 0.0
    clamped = kl_penalty(logp, ref, "k3", clamp=10.0)
    assert float(clamped[0, 0]) == 10.0 and float(clamped[0, 1]) == 0.0
    mask = torch.ones(1, 2, dtype=torch.bool)
    cfg = LossConfig(kl_beta=0.1, kl_clamp=10.0)
    _, stats = grpo_loss(logp, logp, ref, torch.zeros(1), mask, ~mask, cfg)
    assert float(stats["kl"]) == pytest.approx(10.0 / 2)


def test_token_mean_all_authors_divides_by_every_response_token() -> None:
    senior = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    junior = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 0]], dtype=torch.bool)
    ours = LossWeights.of(senior, junior, LossConfig())
    theirs = LossWeights.of(senior, junior, LossConfig(aggregation="token_mean_all_authors"))
    # 3 senior tokens of 7 response tokens: each weighs 1/7, not 1/3
    assert torch.allclose(ours.senior, senior.float() / 3)
    assert torch.allclose(theirs.senior, senior.float() / 7)
    assert float(theirs.senior_tokens) == 3.0  # the statistics still divide by the senior's
    # a solo rollout has no junior token: the same as token_mean
    none = torch.zeros_like(junior)
    solo = LossWeights.of(senior, none, LossConfig(aggregation="token_mean_all_authors"))
    assert torch.allclose(solo.senior, ours.senior)
    # sliced to micro-batches, the weights sum to the mini-batch's
    rows = [theirs.rows(torch.tensor([i])).senior.sum() for i in range(2)]
    assert float(sum(rows)) == pytest.approx(3 / 7)
    with pytest.raises(ValueError, match=r"LossWeights\.of"):
        token_weights(senior, "token_mean_all_authors")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dual_clip": 1.0}, r"dual_clip \(1.0\) must be > 1.*3.0"),
        ({"kl_clamp": 0.0}, r"kl_clamp \(0.0\) must be > 0.*10.0"),
        ({"aggregation": "mean"}, "token_mean_all_authors"),
    ],
)
def test_bad_options_are_named_with_the_fix(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        LossConfig(**kwargs)


def test_the_paper_recipe_turns_verls_defaults_on_and_the_train_check_names_a_bad_one() -> None:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        paper = compose("train", overrides=["recipe=paper", "output_dir=x"])
        bad = compose("train", overrides=["module.loss.dual_clip=0.5", "output_dir=x"])
    assert paper.module.loss.dual_clip == 3.0 and paper.module.loss.kl_clamp == 10.0
    with pytest.raises(ConfigError, match=r"module.loss: loss dual_clip \(0.5\)"):
        validate_train_config(bad)
