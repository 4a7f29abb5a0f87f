"""Rollouts rendered as text with the authors marked, for the training log.

What this file leaves out: the team statistics (``tandem.metrics.team``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from tandem.engine import JUNIOR, Rollouts


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
