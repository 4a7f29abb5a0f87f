"""Team statistics of a batch of rollouts, and rollouts rendered as text with authors marked.

What this file leaves out: the torchmetrics used for evaluation (``tandem.metrics``); these are
per-step numbers that Lightning's ``log(sync_dist=True)`` reduces across ranks.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from tandem.engine import JUNIOR, SENIOR, Rollouts, StopReason
from tandem.metrics.team import handoff_counts


def team_stats(rollouts: Rollouts, rewards: Tensor) -> dict[str, Tensor]:
    """Senior token share, handoffs per rollout, response length, and reward by who wrote more."""
    authors = rollouts.authors.cpu()  # [N, T]
    real = authors >= 0  # [N, T]
    senior = (authors == SENIOR).sum(1).float()  # [N]
    length = real.sum(1).float().clamp(min=1)  # [N]
    share = senior / length  # [N]
    mostly_senior = share >= 0.5
    out = {
        "senior_share": senior.sum() / real.sum().clamp(min=1),
        "handoffs_per_rollout": handoff_counts(authors).float().mean(),
        "response_length": real.sum(1).float().mean(),
        "truncated": (rollouts.stop_reasons.cpu() == StopReason.LENGTH).float().mean(),
    }
    if bool(mostly_senior.any()):
        out["reward_senior_majority"] = rewards[mostly_senior].float().mean()
    if bool((~mostly_senior).any()):
        out["reward_junior_majority"] = rewards[~mostly_senior].float().mean()
    return out


def rollout_table(rollouts: Rollouts, rewards: Tensor, tokenizer: Any, count: int) -> str:
    """The first ``count`` rollouts as text, junior-written spans in ``[[...]]``."""
    blocks = []
    for i in range(min(count, rollouts.tokens.shape[0])):
        n = int(rollouts.lengths[i])
        ids, who = rollouts.tokens[i, :n].tolist(), rollouts.authors[i, :n].tolist()
        spans, start = [], 0
        for j in range(1, n + 1):
            if j == n or who[j] != who[start]:
                text = tokenizer.decode(ids[start:j])
                spans.append(f"[[{text}]]" if who[start] == JUNIOR else text)
                start = j
        blocks.append(f"reward {float(rewards[i]):.0f}: " + "".join(spans))
    return "\n\n---\n\n".join(blocks)
