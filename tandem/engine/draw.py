"""Drawing tokens from one model's logits, and the log-probs the rollouts record.

Each step, each model's logits are normalised once (:func:`score`); the log-prob of whatever
token is emitted is then a gather, and drawing a token reuses the same work:

- temperature 1, no top-k/top-p (the common case): ``exp(logits - max)`` is written into a
  preallocated buffer laid out as ``[n, B, S]`` blocks (zeros past V). Block sums give the
  normaliser, and a draw is an inverse-CDF search over the B block sums and then over the S
  weights of one block (two searches of length ~sqrt(V)). There is no per-token random number and
  no full-vocabulary cumsum or sort: at Qwen's 151k vocabulary, the exponential race that
  ``torch.multinomial`` runs costs several times a small model's forward pass. Each row uses one
  uniform, so a row's token depends only on its logits and its uniform;
- a restriction to allowed tokens (the word sampler's onset rule) at temperature 1: the same on
  the scored weights times the mask; at other temperatures: the same on freshly computed
  weights (``exp((logits - max) / T)``), the raw normaliser then coming from ``logsumexp``;
- top-k: ``topk``, then the same within the k; top-p without top-k: ``topk`` of growing size
  (256, 2048, ..., V) until the kept tokens hold the nucleus, so a full sort happens only when
  the nucleus is that wide;
- temperature 0: argmax.

Inverse-CDF draws are exact up to float32 rounding of the (block) cumulative sums: a token's
probability is off by at most about one float32 ulp of its block's mass.

What this file leaves out: who draws (the samplers) and the loop (``tandem.engine.loop``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tandem.engine.base import SamplingParams

_FIRST_NUCLEUS_K = 256


@dataclass(frozen=True)
class Scores:
    """One model's next-token scores for the n rows in the batch, normalised once."""

    logits: Tensor  # [n, V] float32, raw
    lse: Tensor  # [n] log of the softmax normaliser
    weights: Tensor | None  # [n, B, S] exp(logits - max), zero past V (temperature-1 fast path)
    blocks: Tensor | None  # [n, B] block sums of weights


def coin_generator(seed: int) -> torch.Generator:
    """The handoff coins' generator for a rollout seed: a stream apart from the token draws'."""
    return torch.Generator().manual_seed((seed + 0x9E3779B97F4A7C15) % 2**64)


def block_shape(vocab: int) -> tuple[int, int]:
    """``(B, S)``: B blocks of S ids covering ``vocab`` ids, S about sqrt(vocab)."""
    size = max(16, math.isqrt(vocab - 1) + 1)
    return -(-vocab // size), size


def new_buffer(rows: int, vocab: int, device: torch.device) -> Tensor:
    """A zeroed ``[rows, B * S]`` float32 buffer for :func:`score` to reuse at every step."""
    b, s = block_shape(vocab)
    return torch.zeros(rows, b * s, dtype=torch.float32, device=device)


def fast(params: SamplingParams) -> bool:
    """Whether draws take the temperature-1 fast path (and :func:`score` needs a buffer)."""
    return not params.greedy and not params.truncated and params.temperature == 1.0


def score(logits: Tensor, params: SamplingParams, buffer: Tensor | None = None) -> Scores:
    """Normalise ``logits [n, V]`` (float32); fills ``buffer`` on the fast path."""
    n, vocab = logits.shape
    if not fast(params) or buffer is None:
        return Scores(logits, torch.logsumexp(logits, dim=-1), None, None)
    b, s = block_shape(vocab)
    assert buffer.shape[0] >= n and buffer.shape[1] == b * s, (
        f"buffer {list(buffer.shape)} cannot hold {n} rows of {vocab} ids in {b}x{s} blocks"
    )
    shift = logits.amax(dim=-1, keepdim=True)  # [n, 1]
    flat = buffer[:n]
    # Writing in place keeps the zeros past V and avoids a fresh [n, V] allocation per step.
    torch.sub(logits, shift, out=flat[:, :vocab])
    flat[:, :vocab].exp_()
    weights = flat.view(n, b, s)
    blocks = weights.sum(dim=-1)  # [n, B]
    lse = shift.squeeze(1) + blocks.sum(dim=-1).log()
    return Scores(logits, lse, weights, blocks)


def logprobs(scores: Scores, tokens: Tensor) -> Tensor:
    """``[n]``: the raw log-softmax of ``tokens [n]`` under the scored model."""
    return scores.logits.gather(1, tokens[:, None]).squeeze(1) - scores.lse


def tempered_logprobs(scores: Scores, tokens: Tensor, temperature: float) -> Tensor:
    """``[n]``: the log-softmax of ``tokens [n]`` with the logits divided by ``temperature``."""
    z = scores.logits / temperature  # [n, V]
    return z.gather(1, tokens[:, None]).squeeze(1) - torch.logsumexp(z, dim=-1)


def draw(
    scores: Scores,
    rows: Tensor | None,
    uniforms: Tensor,
    params: SamplingParams,
    allowed: Tensor | None = None,
) -> Tensor:
    """Draw one token for each of ``rows`` from the sampling distribution.

    Args:
        scores: the model's scores for the whole batch.
        rows: ``[r]`` batch rows to draw for; ``None`` for all of them (no gather).
        uniforms: ``[r]`` one U(0, 1) number per row, the only randomness used.
        params: temperature, top-k, top-p.
        allowed: ``[r, V]`` bool, tokens each row may draw (the distribution is restricted to
            them and renormalised before temperature, top-k and top-p apply).

    Returns:
        ``[r]`` token ids.
    """
    if scores.weights is not None:
        if allowed is None:
            return _search_blocks(scores.weights, scores.blocks, uniforms, rows)
        return _draw_restricted(scores, rows, uniforms, params, allowed)
    z = scores.logits if rows is None else scores.logits[rows]  # [r, V]
    if allowed is not None:
        z = z.masked_fill(~allowed, float("-inf"))
    if params.greedy:
        return z.argmax(dim=-1)
    if params.temperature != 1.0:
        z = z / params.temperature
    if params.truncated:
        return _draw_truncated(z, uniforms, params.top_k, params.top_p)
    weights = new_buffer(z.shape[0], z.shape[1], z.device)
    torch.sub(z, z.amax(dim=-1, keepdim=True), out=weights[:, : z.shape[1]])
    weights[:, : z.shape[1]].exp_()
    b, s = block_shape(z.shape[1])
    weights = weights.view(-1, b, s)
    return _search_blocks(weights, weights.sum(dim=-1), uniforms)


def _draw_restricted(
    scores: Scores, rows: Tensor | None, uniforms: Tensor, params: SamplingParams, allowed: Tensor
) -> Tensor:
    """Temperature-1 draw among ``allowed [r, V]`` tokens, reusing the scored weights.

    Masking the weights already computed costs a multiply instead of a fresh exp. A row whose
    allowed tokens all underflowed to weight 0 (every one more than ~87 nats below the best
    token) is drawn again from its masked logits, which are renormalised before the exp.
    """
    assert scores.weights is not None and scores.blocks is not None
    r, vocab = allowed.shape
    flat = scores.weights.flatten(1)  # [n, B * S], zero past V
    # a copy of the rows' weights (already zero past V), masked in place: one pass over them
    masked = flat.clone() if rows is None else flat[rows]  # [r, B * S]
    masked[:, :vocab].mul_(allowed)
    weights = masked.view(r, *scores.weights.shape[1:])
    blocks = weights.sum(dim=-1)  # [r, B]
    token = _search_blocks(weights, blocks, uniforms)
    empty = blocks.sum(dim=-1) == 0  # [r]
    if bool(empty.any()):
        plain = Scores(scores.logits, scores.lse, None, None)
        where = empty.nonzero().squeeze(1)
        picked = where if rows is None else rows[where]
        token[where] = draw(plain, picked, uniforms[where], params, allowed[where])
    return token


def draw_mixed(scores: list[Scores], which: Tensor, uniforms: Tensor) -> Tensor:
    """``[n]`` tokens on the temperature-1 path, row ``i`` from ``scores[which[i]]``: the draw
    ``draw(scores[which[i]], ...)`` gives it, for every model's rows in one search.

    Each row reads its own model's block sums and one block of its weights, as a draw from that
    model alone does, so two models' rows cost one search rather than one each.
    """
    assert all(s.weights is not None and s.blocks is not None for s in scores)
    rows = torch.arange(which.shape[0], device=which.device)
    blocks = torch.stack([s.blocks for s in scores])[which, rows]  # [n, B] each row's model's

    def inner(block: Tensor) -> Tensor:  # [n, S]: each row's block of its model's weights
        return torch.stack([s.weights[rows, block] for s in scores])[which, rows]

    return _search(blocks, inner, uniforms, scores[0].weights.shape[2])


def _search_blocks(
    weights: Tensor, blocks: Tensor, uniforms: Tensor, rows: Tensor | None = None
) -> Tensor:
    """Inverse-CDF draw from unnormalised ``weights [n, B, S]`` with block sums ``[n, B]``.

    ``rows`` (``[r]``) picks the rows to draw for; only their block sums and one block of
    weights each are read, so drawing for a few rows of a wide vocabulary copies nothing big.
    """
    if rows is None:
        rows = torch.arange(weights.shape[0], device=weights.device)
    return _search(blocks[rows], lambda block: weights[rows, block], uniforms, weights.shape[2])


def _search(blocks: Tensor, inner_of: Any, uniforms: Tensor, s: int) -> Tensor:
    """The inverse-CDF search of ``_search_blocks``: ``blocks [r, B]`` the rows' block sums,
    ``inner_of(block [r])`` their weights ``[r, S]`` in the block each falls in."""
    ends = blocks.cumsum(dim=-1)  # [r, B]
    target = _below(uniforms[:, None] * ends[:, -1:], ends[:, -1:])  # [r, 1]
    # Clamped only for rows without any weight, which callers draw another way.
    block = torch.searchsorted(ends, target, right=True).clamp(max=ends.shape[1] - 1)  # [r, 1]
    before = torch.where(block > 0, ends.gather(1, (block - 1).clamp(min=0)), 0.0)
    inner = inner_of(block.squeeze(1)).cumsum(-1)  # [r, S]
    offset = torch.searchsorted(inner, _below(target - before, inner[:, -1:]), right=True)
    offset = offset.clamp(max=s - 1)
    return (block * s + offset).squeeze(1)


def _below(value: Tensor, total: Tensor) -> Tensor:
    """``value`` capped just under ``total``, so a search never runs past the last weight > 0."""
    return torch.minimum(value, torch.nextafter(total, torch.zeros_like(total)))


def _draw_truncated(z: Tensor, uniforms: Tensor, top_k: int, top_p: float) -> Tensor:
    """Top-k, then top-p, on tempered logits ``z [r, V]``; returns ``[r]`` ids."""
    vocab = z.shape[1]
    k = min(top_k, vocab) if top_k else min(_FIRST_NUCLEUS_K, vocab)
    while True:
        values, ids = z.topk(k, dim=-1)  # [r, k], sorted
        if top_k:
            probs = torch.softmax(values, dim=-1)
        else:  # the mass under the whole distribution, to see if the nucleus fits in k
            probs = (values - torch.logsumexp(z, dim=-1, keepdim=True)).exp()
        if top_p >= 1.0:
            break
        mass = probs.cumsum(dim=-1)  # [r, k]
        if top_k or k == vocab or bool((mass[:, -1] >= top_p).all()):
            # Keep a token while the mass before it is under top_p: the smallest nucleus.
            probs = probs * ((mass - probs) < top_p)
            break
        k = min(vocab, k * 8)
    ends = probs.cumsum(dim=-1)  # [r, k]
    pick = torch.searchsorted(
        ends, _below(uniforms[:, None] * ends[:, -1:], ends[:, -1:]), right=True
    )
    return ids.gather(1, pick).squeeze(1)
