"""A KV cache that reserves room for the whole rollout instead of growing by concatenation.

Hugging Face's ``DynamicCache`` appends each step's keys and values with ``torch.cat``, which
copies the whole cache at every step (a seventh of a small model's step time on CPU). Here each
full-attention layer keeps storage for ``capacity`` positions, writes a step's keys in place, and
hands attention a view of the filled part: same values, same interface (``get_seq_length``,
``batch_select_indices``, ``batch_repeat_interleave``), no copy. Anything this does not
recognise (sliding-window or linear-attention layers, transformers versions whose caches have no
``layers``) gets the plain ``DynamicCache``.

``stack_caches`` joins the caches of prompts read in separate chunks (see ``Reader.prefill``) into
one reserved cache, each chunk's keys right-aligned to the widest prompt as if the whole batch had
been read at once, left-padded.

What this file leaves out: paged or static caches (no fixed batch, no compiled graphs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import DynamicCache

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # transformers < 4.56: caches have no layer objects
    DynamicLayer = None


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """The bytes one position's keys and values take in every layer of a model: layers x
    key/value heads x head size x 2 x the bytes of ``dtype`` (147,456 for Qwen3-4B in bf16)."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    size = torch.empty((), dtype=dtype).element_size()
    return config.num_hidden_layers * heads * head_dim * 2 * size


def new_cache(model: Any, capacity: int) -> Any:
    """A cache for ``model`` with room for ``capacity`` positions per row, or a plain one."""
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if DynamicLayer is None or not layers or any(type(x) is not DynamicLayer for x in layers):
        return cache
    cache.layers = [ReservedLayer(capacity) for _ in layers]
    return cache


def reserved(cache: Any) -> bool:
    """Whether every layer of ``cache`` is a full-attention ``ReservedLayer``."""
    layers = getattr(cache, "layers", None)
    if DynamicLayer is None or not layers:
        return False
    return all(type(x) is ReservedLayer for x in layers)


def stack_caches(
    model: Any, parts: list[tuple[Tensor, Any]], rows: int, width: int, capacity: int, repeats: int
) -> Any:
    """One reserved cache for ``rows * repeats`` rows from caches of disjoint groups of rows.

    Args:
        model: the model the caches belong to.
        parts: ``(index [n], cache)`` pairs: a reserved cache of ``n`` left-padded rows, and
            which of the ``rows`` rows they are.
        rows: rows in all.
        width: the widest part's length; shorter parts are right-aligned to it.
        capacity: positions to reserve per row.
        repeats: copies of each row, placed next to each other (row ``i`` becomes rows
            ``i * repeats ... i * repeats + repeats - 1``).
    """
    cache = new_cache(model, capacity)
    assert reserved(cache) and all(reserved(c) for _, c in parts), "only reserved caches stack"
    for i, layer in enumerate(cache.layers):
        layer.stack([(index, part.layers[i]) for index, part in parts], rows, width, repeats)
    return cache


if DynamicLayer is not None:

    class ReservedLayer(DynamicLayer):
        """A full-attention layer whose keys and values are views of reserved storage.

        Args:
            capacity: positions to reserve at the first write (grown by doubling if exceeded).
        """

        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity = capacity
            self._storage: tuple[Tensor, Tensor] | None = None

        def update(
            self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
        ) -> tuple[Tensor, Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start = self.get_seq_length()
            end = start + key_states.shape[-2]
            if self._storage is None or end > self._storage[0].shape[-2]:
                self._reserve(key_states, value_states, max(end, self.capacity, 2 * start), start)
            keys, values = self._storage
            keys[:, :, start:end] = key_states
            values[:, :, start:end] = value_states
            self.keys, self.values = keys[:, :, :end], values[:, :, :end]
            return self.keys, self.values

        def _reserve(self, key: Tensor, value: Tensor, size: int, filled: int) -> None:
            """Fresh storage for ``size`` positions, holding the ``filled`` ones already cached."""
            n, heads, _, dim = key.shape
            keys = key.new_empty(n, heads, size, dim)
            values = value.new_empty(n, value.shape[1], size, value.shape[-1])
            if filled:
                keys[:, :, :filled] = self.keys
                values[:, :, :filled] = self.values
            self._storage = (keys, values)

        def stack(
            self, pieces: list[tuple[Tensor, ReservedLayer]], rows: int, width: int, repeats: int
        ) -> None:
            """Take over the pieces' keys and values (see ``stack_caches``)."""
            first = pieces[0][1]
            self.lazy_initialization(first.keys, first.values)
            k, v = first.keys, first.values
            size = max(self.capacity, width)
            keys = k.new_empty(rows * repeats, k.shape[1], size, k.shape[-1])
            values = v.new_empty(rows * repeats, v.shape[1], size, v.shape[-1])
            for index, piece in pieces:
                filled = piece.get_seq_length()
                for copy in range(repeats):
                    dest = index * repeats + copy  # [n]
                    # Left of a shorter piece: masked out, but must be finite (0 * NaN is NaN).
                    keys[dest, :, : width - filled] = 0.0
                    values[dest, :, : width - filled] = 0.0
                    keys[dest, :, width - filled : width] = piece.keys
                    values[dest, :, width - filled : width] = piece.values
            self._storage = (keys, values)
            self.keys, self.values = keys[:, :, :width], values[:, :, :width]

        def batch_repeat_interleave(self, repeats: int) -> None:
            super().batch_repeat_interleave(repeats)
            self._storage = None  # the next write reserves storage for the new batch

        def batch_select_indices(self, indices: Tensor) -> None:
            super().batch_select_indices(indices)
            self._storage = None

        def reset(self) -> None:
            self._storage = None
            super().reset()
