"""Per-token comparisons of two next-token distributions over the full vocabulary.

Both inputs are logits or log-probs ``[..., V]`` of two models at the same positions of the same
text (teacher forcing); ``log_softmax`` turns either into log-probs (it leaves log-probs as they
are). Work runs in float32 on chunks of positions, so that a 151k vocabulary never holds more
than about 16M floats per intermediate at once.

What this file leaves out: running the models (``tandem.evaluation.forcing``) and averaging
(the metrics that call these).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

# Elements per chunk of [positions, V] intermediates.
_CHUNK = 1 << 24


def kl_divergence(p_logits: Tensor, q_logits: Tensor) -> Tensor:
    """``KL(p || q) = sum_v p(v) (log p(v) - log q(v))`` at each position, in nats: ``[...]``."""
    return _per_position(p_logits, q_logits, _kl)


def token_overlap(p_logits: Tensor, q_logits: Tensor) -> Tensor:
    """``sum_v min(p(v), q(v))`` at each position: 1 for equal distributions, 0 for disjoint."""
    return _per_position(p_logits, q_logits, _overlap)


def masked_positions(x: Tensor, mask: Tensor | None) -> Tensor:
    """The ``[M, ...]`` entries of ``x [N, T, ...]`` where ``mask [N, T]`` is true (all if None)."""
    if mask is None:
        return x.reshape(-1, *x.shape[2:])
    assert mask.shape == x.shape[:2], (
        f"mask {list(mask.shape)} must match the first two dims of {list(x.shape)}"
    )
    return x[mask.to(device=x.device, dtype=torch.bool)]


def _kl(lp: Tensor, lq: Tensor) -> Tensor:
    # xlogy-style: positions where p(v) = 0 contribute 0 even if q(v) = 0 too
    return torch.where(lp.isneginf(), 0.0, lp.exp() * (lp - lq)).sum(-1)


def _overlap(lp: Tensor, lq: Tensor) -> Tensor:
    return torch.minimum(lp, lq).exp().sum(-1)


def _per_position(p: Tensor, q: Tensor, fn: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    assert p.shape == q.shape, f"the two distributions differ in shape: {p.shape} vs {q.shape}"
    lead, v = p.shape[:-1], p.shape[-1]
    p2, q2 = p.reshape(-1, v), q.reshape(-1, v)  # [M, V]
    out = torch.empty(p2.shape[0], dtype=torch.float32, device=p.device)  # [M]
    rows = max(1, _CHUNK // max(1, v))
    for lo in range(0, p2.shape[0], rows):
        lp = p2[lo : lo + rows].float().log_softmax(-1)  # [m, V]
        lq = q2[lo : lo + rows].to(p.device).float().log_softmax(-1)  # [m, V]
        out[lo : lo + rows] = fn(lp, lq)
    return out.reshape(lead)
