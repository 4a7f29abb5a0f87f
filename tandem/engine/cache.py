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

Sizes: ``kv_bytes_per_token`` is the one count of a model's cache bytes per position (the engine's
budget, ``tandem.engine.budget``, and the memory plan, ``tandem.plan``, both use it), and
``kv_chunk_bytes`` / ``kv_chunk_rows`` what a batch of prompt groups holds at most. A reserved
cache never holds more: its storage is reserved once per row for the prompt and every response
token, repeating a prompt's rows (G samples) writes them straight into that storage, and
dropping finished rows moves the kept ones within it. The only extra is each prompt's own keys,
held once while the prefill hands them to the prompt's rows (and, while rows are dropped, a
gather of one layer's kept rows).

What this file leaves out: paged or static caches (no fixed batch, no compiled graphs).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import DynamicCache

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # transformers < 4.56: caches have no layer objects
    DynamicLayer = None


def kv_bytes_per_token(
    config: Any, dtype: torch.dtype, value_dtype: torch.dtype | None = None
) -> int:
    """The bytes one position of one row takes in a model's KV cache, every layer's keys and
    values: layers x KV heads x head_dim x (the bytes of ``dtype`` + those of ``value_dtype``).

    Args:
        config: the model's Hugging Face config (a multimodal one's text config is read);
            ``head_dim`` defaults to ``hidden_size / num_attention_heads`` and
            ``num_key_value_heads`` to ``num_attention_heads``.
        dtype: the keys' dtype (``cache_dtypes`` gives a loaded model's).
        value_dtype: the values', when it differs (``None``: ``dtype``).

    Returns:
        Bytes (147,456 for Qwen3-4B in bfloat16: 36 layers x 8 heads x 128 x 2 x 2).
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    values = value_dtype if value_dtype is not None else dtype
    return text.num_hidden_layers * kv_heads * head_dim * (dtype.itemsize + values.itemsize)


def cache_dtypes(model: Any) -> tuple[torch.dtype, torch.dtype]:
    """The dtypes of the keys and of the values that ``model`` caches if it runs now.

    The projections compute in the weights' dtype, or in the one FSDP2 gathers them in
    (``param_dtype``), or under autocast in autocast's; the values keep it. The keys pass through
    the rotary embedding (and Qwen3's ``k_norm``), whose float32 tables and weights promote them:
    under bfloat16 autocast over float32 weights the keys are float32 and the values bfloat16.
    Where a model keeps its keys narrower, this over-counts them (the safe side for a budget).
    """
    weight = model.get_input_embeddings().weight
    dtype = weight.dtype
    # FSDP2's MixedPrecisionPolicy: the weights are stored in one dtype and computed in another
    with contextlib.suppress(AttributeError):
        dtype = model._get_fsdp_state()._mp_policy.param_dtype or dtype
    device = weight.device.type
    if torch.is_autocast_enabled(device):
        fast = torch.get_autocast_dtype(device)
        return torch.promote_types(dtype, fast), fast
    return dtype, dtype


def kv_chunk_bytes(
    bytes_per_token: int, prompts: int, samples_per_prompt: int, width: int, max_new_tokens: int
) -> int:
    """The most bytes the KV caches of ``prompts`` prompt groups hold in one pass.

    Each of the ``prompts * samples_per_prompt`` rows reserves ``width + max_new_tokens``
    positions (the left-padded prompts' width, and every response token), and each prompt's own
    keys are held once more while the prefill repeats them into its rows.

    Args:
        bytes_per_token: ``kv_bytes_per_token`` summed over the models sharing the memory.
        prompts: prompt groups in the pass.
        samples_per_prompt: rows per prompt (G).
        width: positions of the left-padded prompts.
        max_new_tokens: response positions per row.
    """
    rows = prompts * samples_per_prompt
    return bytes_per_token * (rows * (width + max_new_tokens) + prompts * width)


def kv_chunk_rows(
    budget_bytes: int,
    bytes_per_token: int,
    samples_per_prompt: int,
    width: int,
    max_new_tokens: int,
) -> int:
    """The most rows, in whole groups of ``samples_per_prompt``, whose KV caches fit in
    ``budget_bytes`` (``kv_chunk_bytes``); 0 when not even one group fits."""
    group = kv_chunk_bytes(bytes_per_token, 1, samples_per_prompt, width, max_new_tokens)
    return max(0, int(budget_bytes)) // group * samples_per_prompt


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


def repeat_rows(cache: Any, repeats: int, capacity: int) -> None:
    """Each row of ``cache`` ``repeats`` times, side by side (row ``i`` becomes rows
    ``i * repeats ... i * repeats + repeats - 1``); a reserved cache's storage then holds
    ``capacity`` positions per row."""
    if reserved(cache):
        for layer in cache.layers:
            layer.capacity = capacity
    cache.batch_repeat_interleave(repeats)


def reserved(cache: Any) -> bool:
    """Whether every layer of ``cache`` is a full-attention ``ReservedLayer``."""
    layers = getattr(cache, "layers", None)
    if DynamicLayer is None or not layers:
        return False
    return all(type(x) is ReservedLayer for x in layers)


def take_storage(cache: Any, filled: int) -> list[tuple[Tensor, Tensor]]:
    """Each layer's whole storage of a reserved ``cache`` (keys and values ``[N, H_kv, size,
    d]``), its columns past ``filled`` zeroed, for a reader that writes into it itself
    (``tandem.engine.packed``); the cache is not to be used after.

    Zeros, not what the storage held: columns a row has not filled are hidden from it, but
    attention still weighs their values by 0, and 0 * NaN is NaN.
    """
    assert reserved(cache), "only a reserved cache has storage to hand over"
    out = []
    for layer in cache.layers:
        keys, values = layer._storage
        keys[:, :, filled:] = 0.0
        values[:, :, filled:] = 0.0
        out.append((keys, values))
    return out


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
            """Each row ``repeats`` times, written straight into storage for ``capacity``
            positions: no repeated copy of the prompt is made and then copied again."""
            filled = self.get_seq_length()
            if not filled:
                return
            size = max(self.capacity, filled)
            pair = []
            for t in (self.keys, self.values):  # [n, H, filled, d]
                n, heads, _, dim = t.shape
                storage = t.new_empty(n * repeats, heads, size, dim)
                storage.view(n, repeats, heads, size, dim)[:, :, :, :filled] = t[:, None]
                pair.append(storage)
            self._storage = (pair[0], pair[1])
            self.keys, self.values = pair[0][:, :, :filled], pair[1][:, :, :filled]

        def batch_select_indices(self, indices: Tensor) -> None:
            """Keep rows ``indices``, moved to the front of the same storage (which is kept: it
            was reserved for these rows anyway, and the next pass frees it)."""
            if self._storage is None:
                super().batch_select_indices(indices)
                return
            filled, n = self.get_seq_length(), indices.shape[0]
            keys, values = self._storage
            for storage in (keys, values):
                # the gather copies the kept rows out before any is overwritten
                storage[:n, :, :filled] = storage[indices, :, :filled]
            self._storage = (keys[:n], values[:n])
            self.keys, self.values = keys[:n, :, :filled], values[:n, :, :filled]

        def reset(self) -> None:
            self._storage = None
            super().reset()
