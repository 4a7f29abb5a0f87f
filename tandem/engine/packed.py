"""Reading packed tokens: each row reads however many tokens it has, in one forward per model.

A cross-vocabulary pair's models read unevenly: at a given step one row's model reads its own
last token, another's a word the other author has just finished, a third's nothing. A batched
forward over a right-padded ``[rows, K]`` block pays for every padded slot in every layer, and
a cache that grows by K columns for every row. Here the tokens that are really read are packed
into one sequence ``[1, M]``: the projections and MLPs see only them, and each row's keys and
values go to its own next free columns of a per-row cache (``[N, H_kv, capacity, d]`` a layer,
the layout attention reads: a row's keys of one head are one block, as in a reserved cache), so
the cache grows with what each row has read, not with the steps.

Attention is the one part that needs rows. An attention function registered with transformers'
``AttentionInterface`` (``tandem_packed``), selected for the duration of each packed forward,
writes the packed keys and values into the rows' columns, lays the packed queries out as
``[rows, K]`` (padding here costs one small matmul, not a layer), and runs
``scaled_dot_product_attention`` over the rows' caches with each query seeing its row's prompt and
its row's tokens up to itself. Grouped-query heads are folded into the query axis, so keys and
values are read as they are stored (no ``repeat_kv`` copy). The packing travels to the attention
function as the model's ``attention_mask`` mapping (transformers passes a dict of masks through
untouched).

It serves decoder-only models whose layers are all full attention and whose attention goes
through ``AttentionInterface`` (Qwen3, Qwen2, Llama, Mistral and their kin, read with ``sdpa``):
``packable`` says which; the cross engine reads other models with right-padded blocks.

What this file leaves out: the prompts (read by ``tandem.engine.reader.Reader.prefill``, whose
cache becomes the first columns here) and sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface

from tandem.engine.cache import new_cache, reserved, take_storage
from tandem.engine.reader import Reader

PACKED = "tandem_packed"
# Attention reads the caches of every batch row in place when at least this share of the rows
# reads, else gathers the reading rows' caches (``index_select``) and reads those. A gathered
# cache is dense, which attention reads faster than rows of a wider storage: at the tiny world's
# sizes (50 rows, 160-270 columns, each layer's storage cold), in place takes 0.9 ms a layer
# whatever the share, gathered 0.3 ms at 16 rows, 0.5 at 24, 0.75 at 40 and 0.9 at 50.
_READ_IN_PLACE = 0.9


@dataclass
class Layout:
    """Some of a packed forward's queries laid out as ``[r, K]`` for attention.

    Attributes:
        gather: which rows' caches this layout reads, as ``[r]`` indices among those the layout
            before it read (the first: among the batch rows); None: those same caches, in place
            (every batch row's, for the first; rows with nothing here get padded queries).
        tokens: ``[Q]`` which packed tokens are laid out here (None: all, in order).
        slots: ``[Q]`` their places in the ``[r, K]`` layout.
        width: ``K``.
        mask: ``[r, 1, groups * K, C]``, 0 where a query sees one of the first ``C`` columns and
            -inf where it does not, repeated for the query heads that share a key/value head.
        queries: ``[r, H_kv, groups * K, d]`` zeros, the queries' buffer.
        places: ``[Q * H]`` where each laid-out token's heads go in the buffer seen as
            ``[r * H * K, d]`` (query head ``h`` of the token in slot ``i * K + j``: row ``i``,
            then ``h`` as key/value head and group, then ``j``).
    """

    gather: Tensor | None
    tokens: Tensor | None
    slots: Tensor
    width: int
    mask: Tensor
    queries: Tensor
    places: Tensor


@dataclass
class Packing:
    """Where each packed token of one forward belongs.

    Attributes:
        reader: the reader whose per-row caches the keys and values go to.
        places: ``[H_kv * M]`` where each packed token's keys and values of each head go, head
            by head: ``(row * H_kv + head) * capacity + column``, in the storage seen as
            ``[N * H_kv * capacity, d]``.
        layouts: the queries' layouts: each row's first token, one per row, then the rest of
            the rows that read more (few, at a change of pen), so that a long read by a few
            rows does not pad every row's queries.
    """

    reader: PackedReader
    places: Tensor
    layouts: list[Layout]


def packed_attention(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention for a packed forward (see the module); ``attention_mask`` is a ``Packing``.

    ``query [1, H, M, d]``, ``key``/``value [1, H_kv, M, d]``; returns ``[1, M, H, d]``.
    """
    pack: Packing = attention_mask
    stored_keys, stored_values = pack.reader.storage[module.layer_idx]  # [N, H_kv, capacity, d]
    for stored, new in ((stored_keys, key), (stored_values, value)):
        # [N * H_kv * capacity, d] <- [H_kv * M, d], head by head
        stored.view(-1, stored.shape[3]).index_copy_(0, pack.places, new[0].flatten(0, 1))
    heads, m, d = query.shape[1:]
    packed = query[0].transpose(0, 1)  # [M, H, d]
    out = None if len(pack.layouts) == 1 else packed.new_empty(m, heads, d)
    c = pack.layouts[0].mask.shape[-1]  # every layout reads the same columns
    keys, values = stored_keys[:, :, :c], stored_values[:, :, :c]  # [N, H_kv, C, d]
    for lay in pack.layouts:
        if lay.gather is not None:  # [r, H_kv, C, d] (index_select: 4x an index's speed)
            keys, values = keys.index_select(0, lay.gather), values.index_select(0, lay.gather)
        mine = packed if lay.tokens is None else packed.index_select(0, lay.tokens)  # [Q, H, d]
        # the queries' buffer, [r, H_kv, groups * K, d] (a key/value head's query heads side by
        # side): its padded slots stay zero, as every layer fills the same places
        lay.queries.view(-1, d).index_copy_(0, lay.places, mine.reshape(-1, d))
        o = F.scaled_dot_product_attention(
            lay.queries, keys, values, attn_mask=lay.mask, scale=scaling
        )
        o = o.reshape(-1, d).index_select(0, lay.places).view(-1, heads, d)  # [Q, H, d]
        if out is None:  # one layout: every packed token, in order
            return o[None], None
        out.index_copy_(0, lay.tokens, o)
    return out[None], None  # [1, M, H, d]


AttentionInterface.register(PACKED, packed_attention)


def packable(model: Any) -> bool:
    """Whether ``model`` can be read packed: sdpa attention, every layer full attention (no
    sliding window), and a cache the reader can reserve (``tandem.engine.cache``)."""
    config = model.config
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return (
        getattr(config, "_attn_implementation", None) == "sdpa"
        and all(t == "full_attention" for t in layer_types)
        and not getattr(config, "sliding_window", None)
        and reserved(new_cache(model, capacity=1))
    )


class PackedReader(Reader):
    """A model reading packed tokens into per-row caches (see the module).

    ``prefill`` is ``Reader``'s; then ``feed`` reads any number of tokens per row, and
    ``select`` keeps some rows.
    """

    def prefill(self, ids: Tensor, mask: Tensor, repeats: int, max_new_tokens: int) -> Tensor:
        logits = super().prefill(ids, mask, repeats, max_new_tokens)
        width = ids.shape[1]
        # the reserved cache's storage, room for every response token included, is read on
        self.storage = take_storage(self.cache, width)  # per layer: [N, H_kv, capacity, d] x 2
        self.cache = None
        self._heads = self.model.config.num_attention_heads
        self._groups = self._heads // self.storage[0][0].shape[1]  # query heads per key head
        self._head_dim = self.storage[0][0].shape[3]
        rows = logits.shape[0]
        lengths = mask.to(self.device).long().sum(1).repeat_interleave(repeats)  # [N]
        self.first = width - lengths  # [N] each row's first visible column (left padding)
        self.filled = torch.full((rows,), width, dtype=torch.long, device=self.device)  # [N]
        return logits

    def feed(self, rows: Tensor, tokens: Tensor, counts: Tensor) -> Tensor:
        """Read ``counts[i]`` tokens for batch row ``rows[i]``, packed in ``tokens [M]`` row by
        row; returns ``[M, V]`` float32 logits, each after its own token."""
        dev = self.device
        rows, tokens, counts = rows.to(dev), tokens.to(dev), counts.to(dev)
        m, n = tokens.shape[0], self.filled.shape[0]
        k = int(counts.max())
        offsets = torch.arange(m, device=dev) - (counts.cumsum(0) - counts).repeat_interleave(
            counts, output_size=m
        )  # [M] each token's place in its row's block
        token_rows = rows.repeat_interleave(counts, output_size=m)  # [M]
        columns = self.filled[token_rows] + offsets
        end = int((self.filled[rows] + counts).max())
        self._room(end)
        r = rows.shape[0]
        local = torch.arange(r, device=dev).repeat_interleave(counts, output_size=m)  # [M]
        # each row's first token, one query per row: over every batch row (the caches read in
        # place) when nearly all of them read, else over the reading rows (theirs gathered)
        leading = (offsets == 0).nonzero().squeeze(1)  # [r]
        every = None if k == 1 else leading  # with one token a row, every token leads its row
        in_place = r >= _READ_IN_PLACE * n
        if in_place:
            layouts = [self._layout(None, None, every, token_rows[leading], 0, 1, end)]
        else:
            layouts = [self._layout(rows, rows, every, local[leading], 0, 1, end)]
        if k > 1:  # the rest of the few rows that read more (a change of pen), theirs gathered
            more = counts > 1
            rest = (offsets > 0).nonzero().squeeze(1)  # [M - r]
            index = (more.long().cumsum(0) - 1)[local[rest]]  # [M - r] place among them
            slots = index * (k - 1) + offsets[rest] - 1
            # from the first layout's caches: gathered already (dense), or the storage
            among = rows[more] if in_place else more.nonzero().squeeze(1)
            layouts.append(self._layout(rows[more], among, rest, slots, 1, k - 1, end))
        _, kv_heads, capacity, _ = self.storage[0][0].shape
        heads = torch.arange(kv_heads, device=dev)[:, None]  # [H_kv, 1]
        places = ((token_rows * kv_heads + heads) * capacity + columns).flatten()  # [H_kv * M]
        pack = Packing(self, places, layouts)
        positions = self.position[token_rows] + offsets  # [M]
        config = self.model.config
        before = config._attn_implementation
        config._attn_implementation = PACKED
        try:
            out = self.model(
                input_ids=tokens[None],
                attention_mask={"full_attention": pack},
                position_ids=positions[None],
                use_cache=False,
            )
        finally:
            config._attn_implementation = before
        self.filled[rows] += counts
        self.position[rows] += counts
        return out.logits[0].float()  # [M, V]

    def _layout(
        self,
        rows: Tensor | None,
        gather: Tensor | None,
        tokens: Tensor | None,
        slots: Tensor,
        skip: int,
        k: int,
        end: int,
    ) -> Layout:
        """A ``Layout`` of packed ``tokens`` at ``slots`` of ``rows`` (None: all batch rows),
        their caches read as ``gather`` says (``Layout``), each row's queries being its tokens
        after its first ``skip``; the mask lets each see its row's columns from the first
        visible one up to its own, among the first ``end``."""
        first, filled = (
            (self.first, self.filled) if rows is None else (self.first[rows], self.filled[rows])
        )
        seen = torch.arange(end, device=self.device)  # [C]
        top = filled[:, None] + skip + torch.arange(k, device=self.device)  # [r, K]
        seen = (seen >= first[:, None, None]) & (seen <= top[:, :, None])  # [r, K, C]
        # additive (0 or -inf): sdpa adds it as it is, where a bool mask is converted per layer
        dtype = self.storage[0][0].dtype
        mask = torch.zeros(seen.shape, dtype=dtype, device=self.device)
        mask.masked_fill_(~seen, float("-inf"))
        g = self._groups
        mask = mask[:, None].expand(-1, g, -1, -1).reshape(-1, 1, g * k, end)
        h = self._heads
        queries = mask.new_zeros(mask.shape[0], h // g, g * k, self._head_dim)
        heads = torch.arange(h, device=self.device)
        places = ((slots // k) * h * k + slots % k)[:, None] + heads[None] * k  # [Q, H]
        return Layout(gather, tokens, slots, k, mask, queries, places.flatten())

    def _room(self, end: int) -> None:
        """Grow every layer's storage (by doubling) until ``end`` columns fit."""
        size = self.storage[0][0].shape[2]
        if end <= size:
            return
        new = max(end, 2 * size)
        grown = []
        for pair in self.storage:
            grown.append(
                tuple(
                    torch.cat([t, t.new_zeros(*t.shape[:2], new - size, t.shape[3])], 2)
                    for t in pair
                )
            )
        self.storage = grown

    def select(self, keep: Tensor) -> None:
        keep = keep.to(self.device)
        self.first, self.filled = self.first[keep], self.filled[keep]
        end = int(self.filled.max()) if keep.numel() else 0
        n = keep.shape[0]
        # The kept rows' filled columns move to the front of the same storage (the gather copies
        # them out before any is overwritten). Past its own columns a row keeps what the row
        # before it there held: zeros or keys, hidden from it and finite, as attention needs.
        for pair in self.storage:
            for t in pair:
                t[:n, :, :end] = t[:, :, :end].index_select(0, keep)
        self.storage = [(k[:n], v[:n]) for k, v in self.storage]
        self.position = self.position[keep]

    def tidy(self) -> None:
        """Nothing to tidy: a row's cache holds only what it read."""
