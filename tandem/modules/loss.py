"""The GRPO objective, with the options users of other GRPO libraries expect.

- group advantages: reward minus the group mean, divided by the group std (GRPO) or not
  (``mean``, Dr. GRPO); groups whose rewards are all equal get advantage 0, never NaN;
- a clipped importance ratio with separate low and high epsilon (DAPO's clip-higher), and
  verl's dual clip (``dual_clip``: for a negative advantage the token's loss is at most
  ``-advantage * c``, so a ratio far above 1 cannot blow the loss up);
- aggregation: ``token_mean`` (every token of the batch weighs the same), ``seq_mean_token_mean``
  (each sequence's token mean, then the mean over sequences: the original GRPO),
  ``seq_sum_constant`` (token sums divided by a constant, Dr. GRPO) or
  ``token_mean_all_authors`` (the senior's tokens summed, divided by every response token of the
  batch, the junior's too: the authors' released verl, whose token count is taken before its
  senior gate);
- a KL penalty toward the junior (k1 or k3 estimator), which is also the paper's ablation, with
  verl's clamp of the per-token estimate (``kl_clamp``: k3 within [-10, 10] in verl);
- ``lambda_jun``: the senior's log-likelihood of junior-written tokens, as an imitation term.

The policy gradient flows only through tokens the senior wrote: the loss mask *is* the author
mask. Junior tokens shape the reward and, with ``lambda_jun``, the imitation term; nothing else.

What this file leaves out: producing log-probs (``tandem.modules.logprobs``) and the loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

ADVANTAGE_MODES = ("std", "mean")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_sum_constant", "token_mean_all_authors")
KL_ESTIMATORS = ("k1", "k3")
# where the old log-probs of the ratio come from (``TandemGRPO(old_logprobs=...)``)
OLD_LOGPROB_SOURCES = ("auto", "engine", "trainer")


def group_advantages(
    rewards: Tensor, group_size: int, normalize: str = "std", eps: float = 1e-6
) -> Tensor:
    """Advantages within groups of ``group_size`` consecutive rollouts of one prompt.

    Args:
        rewards: ``[N]`` with ``N`` a multiple of ``group_size``, rows of a group adjacent.
        group_size: rollouts per prompt (G).
        normalize: ``"std"`` divides by the group's std; ``"mean"`` only centres (Dr. GRPO).
        eps: keeps the division finite; a group with equal rewards has a zero numerator anyway.

    Returns:
        ``[N]`` advantages, 0 for every member of an all-equal group.
    """
    if normalize not in ADVANTAGE_MODES:
        raise ValueError(f"advantage normalize {normalize!r} must be one of {ADVANTAGE_MODES}.")
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards of shape {tuple(rewards.shape)} cannot form groups of {group_size}: "
            "expected one reward per rollout, a whole number of groups."
        )
    grouped = rewards.float().view(-1, group_size)  # [B, G]
    centred = grouped - grouped.mean(dim=1, keepdim=True)  # [B, G]
    if normalize == "std" and group_size > 1:
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.view(-1)  # [N]


def zero_variance_groups(rewards: Tensor, group_size: int) -> Tensor:
    """``[B]`` bool: groups whose rewards are all equal (they carry no GRPO signal)."""
    grouped = rewards.view(-1, group_size)  # [B, G]
    return (grouped == grouped[:, :1]).all(dim=1)


@dataclass(frozen=True)
class LossConfig:
    """Options of the objective; config keys under ``module.loss`` equal these names.

    Args:
        clip_low: lower clip epsilon of the ratio (1 - clip_low).
        clip_high: upper clip epsilon of the ratio (1 + clip_high).
        aggregation: one of ``AGGREGATIONS``.
        constant: the divisor of ``seq_sum_constant`` (usually the max response length).
        kl_beta: weight of the KL penalty toward the junior (0: none).
        kl_estimator: ``k1`` (log ratio) or ``k3`` (Schulman's unbiased, non-negative one).
        lambda_jun: weight of the junior-imitation term (0 in the paper).
        dual_clip: verl's ``clip_ratio_c`` (3 by default there, > 1): a negative advantage's
            token loss is capped at ``-advantage * dual_clip``; None: no cap.
        kl_clamp: the per-token KL estimate is clamped to ``[-kl_clamp, kl_clamp]`` (verl's
            ``low_var_kl``: 10); None: no clamp.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    aggregation: str = "token_mean"
    constant: float = 1.0
    kl_beta: float = 0.0
    kl_estimator: str = "k3"
    lambda_jun: float = 0.0
    dual_clip: float | None = None
    kl_clamp: float | None = None

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"loss aggregation {self.aggregation!r} must be one of {AGGREGATIONS}."
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"loss kl_estimator {self.kl_estimator!r} must be one of {KL_ESTIMATORS}."
            )
        for key in ("clip_low", "clip_high", "kl_beta", "lambda_jun"):
            if getattr(self, key) < 0:
                raise ValueError(f"loss {key} ({getattr(self, key)}) must be >= 0.")
        if self.constant <= 0:
            raise ValueError(f"loss constant ({self.constant}) must be > 0.")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(
                f"loss dual_clip ({self.dual_clip}) must be > 1: it caps a negative advantage's "
                "loss at -advantage x dual_clip, and at or below 1 it would cut into the "
                "ordinary clip. Set it to 3.0 (verl's clip_ratio_c) or null for no cap."
            )
        if self.kl_clamp is not None and not self.kl_clamp > 0:
            raise ValueError(
                f"loss kl_clamp ({self.kl_clamp}) must be > 0: the KL estimate is clamped to "
                "[-kl_clamp, kl_clamp]. Set it to 10.0 (verl's low_var_kl) or null for none."
            )


def token_weights(mask: Tensor, how: str, constant: float = 1.0) -> Tensor:
    """``[N, T]`` the weight of each token of a batch in its aggregate: ``aggregate`` is
    ``(values * token_weights).sum()``.

    Taken over a whole mini-batch and sliced to its micro-batches, the weights make the sum of
    the micro-batches' losses the mini-batch's loss exactly, whatever their sizes.
    """
    mask = mask.float()
    if how == "token_mean":
        return mask / mask.sum().clamp(min=1.0)
    if how == "seq_mean_token_mean":
        per_seq = mask.sum(dim=1, keepdim=True)  # [N, 1]
        sequences = (per_seq > 0).sum().clamp(min=1)  # those with tokens
        return mask / per_seq.clamp(min=1.0) / sequences
    if how == "seq_sum_constant":
        return mask / (constant * mask.shape[0])
    if how == "token_mean_all_authors":
        raise ValueError(
            "token_mean_all_authors divides by the junior's tokens too, which token_weights does "
            "not see: take the weights with LossWeights.of(senior_mask, junior_mask, cfg)."
        )
    raise ValueError(f"unknown aggregation {how!r}; expected one of {AGGREGATIONS}.")


def aggregate(values: Tensor, mask: Tensor, how: str, constant: float = 1.0) -> Tensor:
    """Reduce per-token ``values [N, T]`` over ``mask [N, T]`` to a scalar, ``how`` as named."""
    return (values * token_weights(mask, how, constant).to(values.dtype)).sum()


@dataclass(frozen=True)
class LossWeights:
    """Each token's weight in the loss's terms, taken over a whole mini-batch (``of``) and
    sliced to a micro-batch's rows (``rows``).

    Attributes:
        senior: ``[n, T]`` in the policy and KL terms.
        junior: ``[n, T]`` in the imitation term.
        senior_tokens: the mini-batch's senior tokens (at least 1): the statistics' divisor.
    """

    senior: Tensor  # [n, T] float32
    junior: Tensor  # [n, T] float32
    senior_tokens: Tensor  # [] float32

    @classmethod
    def of(cls, senior_mask: Tensor, junior_mask: Tensor, cfg: LossConfig) -> LossWeights:
        if cfg.aggregation == "token_mean_all_authors":
            # every response token that counts, either author's: the authors' denominator
            total = (senior_mask | junior_mask).float().sum().clamp(min=1.0)
            return cls(
                senior_mask.float() / total,
                junior_mask.float() / total,
                senior_mask.float().sum().clamp(min=1.0),
            )
        return cls(
            token_weights(senior_mask, cfg.aggregation, cfg.constant),
            token_weights(junior_mask, cfg.aggregation, cfg.constant),
            senior_mask.float().sum().clamp(min=1.0),
        )

    def rows(self, index: Tensor) -> LossWeights:
        return LossWeights(self.senior[index], self.junior[index], self.senior_tokens)

    def to(self, device: torch.device) -> LossWeights:
        return LossWeights(*(x.to(device) for x in (self.senior, self.junior, self.senior_tokens)))


def kl_penalty(
    logp: Tensor, ref_logp: Tensor, estimator: str, clamp: float | None = None
) -> Tensor:
    """Per-token estimate of KL(policy || reference) from the sampled tokens' log-probs,
    clamped to ``[-clamp, clamp]`` when given (verl clamps its k3 to [-10, 10])."""
    log_ratio = ref_logp - logp  # [N, T]
    if estimator == "k1":
        kl = -log_ratio
    else:
        # k3 = r - log r - 1 with r = ref/policy: unbiased and never negative
        log_ratio = log_ratio.clamp(-20.0, 20.0)
        kl = torch.exp(log_ratio) - log_ratio - 1.0
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    ref_logp: Tensor | None,
    advantages: Tensor,
    senior_mask: Tensor,
    junior_mask: Tensor,
    cfg: LossConfig,
    weights: LossWeights | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss to minimise and detached statistics.

    Args:
        logp: ``[N, T]`` the senior's current log-prob of each token (with grad).
        old_logp: ``[N, T]`` the senior's log-prob when the rollout was sampled.
        ref_logp: ``[N, T]`` the junior's log-prob (the reference), or None without KL.
        advantages: ``[N]`` per-rollout advantages.
        senior_mask: ``[N, T]`` bool, tokens the senior wrote and that count.
        junior_mask: ``[N, T]`` bool, tokens the junior wrote and that count.
        cfg: the options.
        weights: the tokens' weights when these rows are a micro-batch of a larger batch
            (``LossWeights.of(...).rows(...)``): the loss and every statistic are then this
            micro-batch's share, and summing them over the micro-batches gives the batch's.
            None: taken over these rows.
    """
    w = weights if weights is not None else LossWeights.of(senior_mask, junior_mask, cfg)
    w = w.to(logp.device)
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # [N, T]
    ratio = torch.exp(log_ratio)  # [N, T]
    adv = advantages.unsqueeze(1)  # [N, 1]
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)  # [N, T]
    capped = None
    if cfg.dual_clip is not None:
        # verl's dual clip: a negative advantage's loss goes no higher than -A * c
        ceiling = -adv * cfg.dual_clip  # [N, 1]
        capped = (adv < 0) & (per_token > ceiling)  # [N, T]
        per_token = torch.where(capped, ceiling.expand_as(per_token), per_token)
    loss = (per_token * w.senior).sum()
    stats: dict[str, Tensor] = {"policy_loss": loss.detach()}
    with torch.no_grad():
        m = senior_mask.float()
        stats["clip_fraction"] = ((unclipped != clipped).float() * m).sum() / w.senior_tokens
        stats["ratio_mean"] = (ratio * m).sum() / w.senior_tokens
        if capped is not None:
            stats["dual_clip_fraction"] = (capped.float() * m).sum() / w.senior_tokens
    if ref_logp is None and cfg.kl_beta > 0:
        raise ValueError(
            f"loss kl_beta is {cfg.kl_beta} but the rollouts carry no junior log-probs to take "
            "the KL toward: the junior must read along while sampling (set kl_beta=0 for no "
            "KL penalty)."
        )
    if ref_logp is not None:
        kl_value = (kl_penalty(logp, ref_logp, cfg.kl_estimator, cfg.kl_clamp) * w.senior).sum()
        stats["kl"] = kl_value.detach()
        if cfg.kl_beta > 0:
            loss = loss + cfg.kl_beta * kl_value
    if cfg.lambda_jun > 0:
        imitation = (-logp * w.junior).sum()
        stats["junior_nll"] = imitation.detach()
        loss = loss + cfg.lambda_jun * imitation
    stats["loss"] = loss.detach()
    return loss, stats
