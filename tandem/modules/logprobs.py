"""Teacher-forced log-probs of rollout tokens under a model, packed and bounded in memory.

The rows of a rollout are packed without padding into one sequence ``[1, L]`` (each row its
prompt's real tokens, then its response's), with positions restarting at every row, so that
attention keeps the rows apart (transformers reads restarting ``position_ids`` with no
``attention_mask`` as packed sequences: a block-diagonal causal mask, or varlen flash attention)
and no layer spends anything on padding. ``micro_batches`` splits a mini-batch's rows into such
packs of at most a token budget each, so that one forward's activations are bounded by the
budget whatever the rows and their lengths (verl's dynamic batch size and remove-padding).

Attention is the one part that needs the rows apart, and transformers' own way with a packed
``sdpa`` forward is a ``[L, L]`` block-diagonal mask, saved for backward by every layer: every
query scores every key of the pack, about ``2 L / row length`` times the work of the rows alone
(on the tiny world's 1024-token packs of ~117-token rows, 43% of a micro-batch's forward and
backward, against 14% laid out as rows). So for the length of the forward the model's attention
is ``tandem_rows`` (registered with transformers' ``AttentionInterface``), which lays the pack's
queries, keys and values out as ``[rows, longest row]`` and runs one causal
``scaled_dot_product_attention`` over them with no mask: right-padded and causal, a row's real
queries see only its real keys, and the padded slots are never read back. The layout travels to
it as the model's ``attention_mask`` mapping (transformers passes a dict of masks through
untouched). Models whose attention is not ``sdpa`` (flash attention reads packed rows as varlen
already) or that have sliding-window layers keep transformers' own path.

The vocabulary is the other bound. Only the positions that predict a response token go through
the LM head, and they go in chunks of ``chunk_tokens``: the model's own head is swapped for
``_LogProbHead`` for the length of the forward, so the head runs inside the model's forward (a
sharded model's head weight is gathered there) and returns log-probs, never logits. With
gradients each chunk is recomputed in backward (``torch.utils.checkpoint``), so at most
``[chunk_tokens, vocabulary]`` logits live at once in the forward or the backward: never
``[rows, tokens, vocabulary]``.

What this file leaves out: sampling (``tandem.engine``) and the loss (``tandem.modules.loss``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface

# tokens per LM-head chunk: [1024, 151936] float32 logits are 0.6 GB
CHUNK_TOKENS = 1024
# the attention of a packed teacher-forced forward (see the module)
ROWS_ATTENTION = "tandem_rows"


@dataclass(frozen=True)
class Packed:
    """Rows of ``[prompt | response]`` packed into one sequence, and where their targets are.

    Attributes:
        ids: ``[1, L]`` every real token of the rows, row after row.
        positions: ``[1, L]`` each token's position in its own row.
        where: ``[M]`` the packed positions whose next token is a response token.
        targets: ``[M]`` that next token.
        rows: ``[M]`` its row, counted within the pack.
        cols: ``[M]`` its column in the response.
        shape: ``(n, T)``: the pack's rows and the responses' width.
        layout: the rows side by side for ``rows_attention``, every row's prompt in it.
    """

    ids: Tensor  # [1, L] long
    positions: Tensor  # [1, L] long
    where: Tensor  # [M] long
    targets: Tensor  # [M] long
    rows: Tensor  # [M] long
    cols: Tensor  # [M] long
    shape: tuple[int, int]
    layout: RowLayout

    @property
    def shares_prompts(self) -> bool:
        """Whether some rows read a prompt packed once for them all."""
        return self.layout.source.numel() > 0 and self.tokens < int(
            (self.layout.source < self.tokens).sum()
        )

    @property
    def tokens(self) -> int:
        """``L``, what the forward reads."""
        return self.ids.shape[1]

    def scatter(self, values: Tensor) -> Tensor:
        """``[M]`` values -> ``[n, T]`` on their device, 0 where the response is padding."""
        index = (self.rows.to(values.device), self.cols.to(values.device))
        return values.new_zeros(self.shape).index_put(index, values)


def prompt_groups(ids: Tensor, mask: Tensor, response_start: int) -> Tensor:
    """``[n]`` one id per distinct prompt: rows with the same real prompt tokens share it."""
    prompts = torch.where(mask[:, :response_start].bool(), ids[:, :response_start], -1)
    return torch.unique(prompts, dim=0, return_inverse=True)[1]


def pack(ids: Tensor, mask: Tensor, response_start: int, share_prompts: bool = False) -> Packed:
    """Pack left-padded prompts followed by right-padded responses (``Rollouts.sequences()``).

    Args:
        ids: ``[n, P + T]`` token ids.
        mask: ``[n, P + T]`` 1 on real tokens; every row has at least one real prompt token.
        response_start: ``P``, where responses begin.
        share_prompts: rows with the same prompt (a GRPO group) read one copy of it: the pack
            holds it once, before the first such row's response, and every such row's attention
            reads its keys (``rows_attention`` only: transformers' own packed mask cannot).
    """
    mask = mask.bool()
    n, width = ids.shape
    first = torch.arange(n, device=ids.device)  # the row whose copy of the prompt is packed
    if share_prompts and n > 1:
        group = prompt_groups(ids, mask, response_start)
        first = torch.full((int(group.max()) + 1,), n, device=ids.device)
        first = first.scatter_reduce(0, group, torch.arange(n, device=ids.device), "amin")[group]
    emitted = mask.clone()
    emitted[first != torch.arange(n, device=ids.device), :response_start] = False
    # the packed index of every real token: a shared prompt's tokens are its first row's
    index = torch.full((n, width), -1, dtype=torch.long, device=ids.device)
    index[emitted] = torch.arange(int(emitted.sum()), device=ids.device)
    index[:, :response_start] = index[first, :response_start]
    position = mask.cumsum(1) - 1  # [n, P + T] each real token's place in its row
    response = mask[:, response_start:]  # [n, T]
    rows, cols = response.nonzero(as_tuple=True)  # [M] each
    # the logit at a token's predecessor predicts it: the last prompt token for the first
    where = index[rows, cols + response_start - 1]
    return Packed(
        ids=ids[emitted].unsqueeze(0),
        positions=position[emitted].unsqueeze(0),
        where=where,
        targets=ids[rows, cols + response_start],
        rows=rows,
        cols=cols,
        shape=(n, width - response_start),
        layout=RowLayout.of(mask, position, index, emitted),
    )


def micro_batches(tokens: Tensor, budget: int | None, groups: Tensor | None = None) -> list[Tensor]:
    """Split rows into groups of at most ``budget`` tokens each (first fit, longest first).

    A row counts its prompt whether or not it shares it (``pack(share_prompts=True)``): the
    budget bounds what attention lays out, rows x their prompt and response, as well as what
    the layers read. Sharing is the saving of the rest of the forward.

    Args:
        tokens: ``[n]`` each row's real tokens (prompt and response).
        budget: the most tokens a group may hold; a row longer than it gets a group of its own.
            None: one group of every row.
        groups: ``[n]`` each row's prompt (``prompt_groups``): a row goes where rows of its
            prompt already are if it fits there, so that they share it.

    Returns:
        Row indices, one ``[k]`` tensor per group, each in increasing order.
    """
    n = tokens.shape[0]
    if budget is None or n == 0:
        return [torch.arange(n)]
    of = [0] * n if groups is None else groups.tolist()
    packs: list[list[int]] = []
    room: list[int] = []
    holds: list[set[int]] = []
    for i in torch.argsort(tokens.cpu(), descending=True, stable=True).tolist():
        size = int(tokens[i])
        fits = [k for k, r in enumerate(room) if r >= size]
        fit = next((k for k in fits if of[i] in holds[k]), fits[0] if fits else None)
        if fit is None:
            packs.append([i])
            room.append(budget - size)
            holds.append({of[i]})
        else:
            packs[fit].append(i)
            room[fit] -= size
            holds[fit].add(of[i])
    return [torch.tensor(sorted(g), dtype=torch.long) for g in packs]


def packed_logprobs(
    model: nn.Module,
    packed: Packed,
    temperatures: Sequence[float],
    chunk_tokens: int = CHUNK_TOKENS,
) -> list[Tensor]:
    """Each response token's log-prob, one ``[n, T]`` float32 tensor per temperature.

    Differentiable when gradients are enabled (the LM head's chunks are recomputed in backward).

    Args:
        model: a Hugging Face causal LM whose forward passes the last hidden states to its
            output embeddings (``get_output_embeddings``) and returns the result as ``logits``.
        packed: the rows (``pack``).
        temperatures: divide the logits before the softmax (1: the model's own distribution).
        chunk_tokens: how many positions go through the LM head at once.
    """
    device = next(model.parameters()).device
    head = _LogProbHead(
        model.get_output_embeddings(),
        packed.where.to(device),
        packed.targets.to(device),
        list(temperatures),
        chunk_tokens,
    )
    positions = packed.positions.to(device)
    with head_swapped(model, head), rows_attention_for(model, packed, device) as extra:
        # no cache: transformers reads restarting positions as packed rows only without one
        out = model(
            input_ids=packed.ids.to(device), position_ids=positions, use_cache=False, **extra
        ).logits  # [len(temperatures), M]
    return [packed.scatter(lp) for lp in out.unbind(0)]  # each [n, T]


def sequence_logprobs(
    model: nn.Module,
    ids: Tensor,
    mask: Tensor,
    response_start: int,
    temperature: float | Sequence[float] = 1.0,
    chunk_tokens: int = CHUNK_TOKENS,
) -> Tensor | list[Tensor]:
    """Log-prob of each response token given everything before it, all rows in one pack.

    Args:
        model: a Hugging Face causal LM.
        ids: ``[N, P + T]`` left-padded prompts followed by right-padded responses
            (``Rollouts.sequences()``).
        mask: ``[N, P + T]`` 1 on real tokens.
        response_start: ``P``, where responses begin.
        temperature: divides the logits first (1: the model's own distribution). A sequence of
            temperatures gives one result each from the same forward pass.
        chunk_tokens: positions per LM-head chunk.

    Returns:
        ``[N, T]`` float32 log-probs, 0 where the response is padding (a list of them, one per
        temperature, when ``temperature`` is a sequence).
    """
    single = isinstance(temperature, int | float)
    temps = [float(temperature)] if single else [float(t) for t in temperature]
    outs = packed_logprobs(model, pack(ids, mask, response_start), temps, chunk_tokens)
    return outs[0] if single else outs


@dataclass(frozen=True)
class RowLayout:
    """A pack's tokens laid out as rows side by side, ``[rows, width]``, for attention.

    Each row is its prompt then its response from slot 0, right-padded; a prompt packed once
    for several rows (``pack(share_prompts=True)``) is laid out in every one of them.

    Attributes:
        source: ``[rows * width]`` the packed token in each slot; ``L`` (past the pack) in a
            padded slot.
        slots: ``[L]`` each packed token's slot, where its output is read back (a shared
            prompt's: its first row's).
        rows: how many rows the pack holds.
        width: the longest row's tokens.
    """

    source: Tensor  # [rows * width] long
    slots: Tensor  # [L] long
    rows: int
    width: int

    @classmethod
    def of(cls, mask: Tensor, position: Tensor, index: Tensor, emitted: Tensor) -> RowLayout:
        """From ``pack``'s ``[n, P + T]`` real tokens, their places in their rows, their packed
        indices and which of them are packed (row after row)."""
        n = mask.shape[0]
        width = int(mask.sum(1).max()) if n else 1
        tokens = int(emitted.sum())
        source = torch.full((n, width), tokens, dtype=torch.long, device=mask.device)
        rows, cols = mask.nonzero(as_tuple=True)
        source[rows, position[rows, cols]] = index[rows, cols]
        rows, cols = emitted.nonzero(as_tuple=True)  # row-major: the packed order
        return cls(source.flatten(), rows * width + position[rows, cols], n, width)

    def to(self, device: torch.device) -> RowLayout:
        return RowLayout(self.source.to(device), self.slots.to(device), self.rows, self.width)

    def lay_out(self, packed: Tensor) -> Tensor:
        """``[1, h, L, d]`` -> ``[rows, h, width, d]``, zeros in the padded slots."""
        flat = packed[0].transpose(0, 1)  # [L, h, d]
        # index_select, not a copy per row: its backward adds a shared prompt's gradients up
        # and keeps no copy of the packed tokens
        padded = torch.cat([flat, flat.new_zeros(1, *flat.shape[1:])])
        laid = padded.index_select(0, self.source)
        return laid.view(self.rows, self.width, *flat.shape[1:]).transpose(1, 2)

    def gather(self, laid: Tensor) -> Tensor:
        """``[rows, h, width, d]`` -> ``[1, L, h, d]``, the packed tokens' slots only."""
        flat = laid.transpose(1, 2).reshape(self.rows * self.width, *laid.shape[1:2], -1)
        return flat.index_select(0, self.slots)[None]


def rows_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Causal attention within each row of a pack; ``attention_mask`` is its ``RowLayout``.

    ``query [1, H, L, d]``, ``key``/``value [1, H_kv, L, d]``; returns ``[1, L, H, d]``.
    """
    layout: RowLayout = attention_mask
    out = F.scaled_dot_product_attention(
        layout.lay_out(query),
        layout.lay_out(key),
        layout.lay_out(value),
        dropout_p=dropout,
        scale=scaling,
        is_causal=True,
        # grouped-query heads read their keys as stored, no repeat_kv copy
        enable_gqa=query.shape[1] != key.shape[1],
    )  # [rows, H, width, d]
    return layout.gather(out), None


AttentionInterface.register(ROWS_ATTENTION, rows_attention)


def lays_out_rows(model: nn.Module) -> bool:
    """Whether ``model``'s packed forward can take ``rows_attention``: ``sdpa`` attention (or
    rows attention already, inside ``rows_attention_for``) and every layer full attention (a
    sliding window would need a mask of its own)."""
    config = getattr(model, "config", None)
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return (
        getattr(config, "_attn_implementation", None) in ("sdpa", ROWS_ATTENTION)
        and all(t == "full_attention" for t in layer_types)
        and not getattr(config, "sliding_window", None)
    )


@contextmanager
def rows_attention_for(
    model: nn.Module, packed: Packed, device: torch.device
) -> Iterator[dict[str, Any]]:
    """``model``'s attention is ``rows_attention`` for the block, where it can be; yields the
    extra arguments of its forward (none: transformers' own packed mask).

    A backward that recomputes checkpointed layers (activation checkpointing) must run inside
    the block too: the recomputation reads the attention implementation anew and is handed the
    forward's ``RowLayout`` as its mask. Blocks nest (``tandem.modules.update.accumulate`` holds
    one around a micro-batch's forward and backward)."""
    if not lays_out_rows(model):
        if packed.shares_prompts:
            raise ValueError(
                f"{type(model).__name__} does not lay packed rows out for attention "
                f"(attention {getattr(model.config, '_attn_implementation', None)!r}): its "
                "packs must not share prompts (pack with share_prompts=lays_out_rows(model))."
            )
        yield {}
        return
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = ROWS_ATTENTION
    try:
        yield {"attention_mask": {"full_attention": packed.layout.to(device)}}
    finally:
        config._attn_implementation = before


class _LogProbHead(nn.Module):
    """Stands in for a model's LM head for one forward: from the last hidden states ``[1, L, H]``
    to the log-probs ``[len(temperatures), M]`` of the targets, ``chunk_tokens`` at a time."""

    def __init__(
        self,
        head: nn.Module,
        where: Tensor,
        targets: Tensor,
        temperatures: list[float],
        chunk_tokens: int,
    ) -> None:
        super().__init__()
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens ({chunk_tokens}) must be >= 1.")
        # a plain attribute, not a submodule: the model's parameters stay where they were
        self.__dict__["head"] = head
        self.where, self.targets = where, targets
        self.temperatures, self.chunk_tokens = temperatures, chunk_tokens

    def forward(self, hidden: Tensor) -> Tensor:
        picked = hidden[0, self.where]  # [M, H]
        grad = torch.is_grad_enabled()
        parts = []
        for lo in range(0, picked.shape[0], self.chunk_tokens):
            args = (picked[lo : lo + self.chunk_tokens], self.targets[lo : lo + self.chunk_tokens])
            if grad:  # keep only the chunk's hidden states; its logits are remade in backward
                parts.append(checkpoint(self._chunk, *args, use_reentrant=False))
            else:
                parts.append(self._chunk(*args))
        if not parts:
            return hidden.new_zeros((len(self.temperatures), 0), dtype=torch.float32)
        return torch.cat(parts, dim=1)  # [len(temperatures), M]

    def _chunk(self, hidden: Tensor, targets: Tensor) -> Tensor:
        logits = self.head(hidden).float()  # [c, V]
        out = []
        for t in self.temperatures:
            scaled = logits if t == 1.0 else logits / t
            # log p(target) = logit - logsumexp: no [c, V] log-softmax kept beside the logits
            picked = scaled.gather(1, targets[:, None]).squeeze(1)
            out.append(picked - scaled.logsumexp(dim=1))
        return torch.stack(out)  # [len(temperatures), c]


@contextmanager
def head_swapped(model: nn.Module, head: nn.Module) -> Iterator[None]:
    """``model``'s output embeddings replaced by ``head`` for the block (``nn.Identity``: its
    forward returns the last hidden states as its ``logits``)."""
    original = model.get_output_embeddings()
    owner, name = _owner_of(model, original)
    # on the owner, not through set_output_embeddings: that may re-tie weights
    owner._modules[name] = head
    try:
        yield
    finally:
        owner._modules[name] = original


def _owner_of(model: nn.Module, child: nn.Module) -> tuple[nn.Module, str]:
    """The module holding ``child`` as an attribute, and that attribute's name."""
    for owner in model.modules():
        for name, module in owner._modules.items():
            if module is child:
                return owner, name
    raise ValueError(
        f"{type(model).__name__} has no output embeddings among its modules: its log-probs "
        "cannot be taken through the LM head in chunks."
    )
