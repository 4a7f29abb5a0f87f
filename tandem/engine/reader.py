"""One model reading the shared context: its own KV cache, attention mask and positions.

Both models of a tandem read every token, whoever wrote it, so each keeps a cache of its own and
the two are stepped with the same tokens. Prompts arrive left-padded: the attention mask hides the
padding, and explicit ``position_ids`` (counting real tokens only) keep each row's positions what
they would be unpadded. A row that has finished is fed the pad token with mask 0 until the batch
is compacted (``select``), so finished rows never change what live rows see.

Two things make reading cheaper on a CPU, with the same results up to float rounding:

- the prompts are read in chunks of similar lengths (shortest first, at most
  ``_PREFILL_TOKENS`` padded tokens each), then their caches are stacked into one. Less padding
  is read, and a chunk's activations stay in the CPU's caches: at the tiny world's batch of 64
  this makes the prefill about 30% cheaper;
- each step hands the model a ready 4D attention mask (the form its attention implementation
  takes), one column longer than the last, instead of a 2D mask that the model turns into a
  4D one at every call (about 0.2 ms a step, 2% of the tiny world's step at batch 64).

Both need the reserved cache (``tandem.engine.cache``); models whose caches are not reserved
(sliding-window or other special layers) are read in one piece with 2D masks. And a step's logits
are written into a buffer the reader keeps (``tandem.engine.head``), bit for bit the model's own,
instead of a fresh ``[n, V]`` allocation a step (a fifth of a step at a 151k vocabulary).

A model read with a ``Lockstep`` (a senior sharded layer by layer, whose every forward is a
collective) is read with as many prefill forwards on every process: a process whose prompts
fill fewer chunks than another's makes ``idle`` forwards, whose output is dropped.

What this file leaves out: sampling (``tandem.engine.draw``) and the loop
(``tandem.engine.loop``).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from tandem.engine.base import Lockstep
from tandem.engine.cache import new_cache, repeat_rows, reserved, stack_caches
from tandem.engine.head import HeadInto

# Padded prompt tokens per prefill chunk. On a CPU, chunks of a thousand tokens or less keep
# their activations in cache (the tiny world's 64 prompts of up to 74 tokens: 0.26 s in chunks
# of 512 to 1024 tokens, 0.37 s in one piece, 0.33 s in chunks of 192); accelerators want big
# batches, so chunks there only bound memory.
_PREFILL_TOKENS = {"cpu": 1024}
_PREFILL_TOKENS_ELSEWHERE = 32768

# Attention implementations whose 4D masks the reader builds itself: True keeps a position
# (sdpa), or 0 keeps it and the dtype's minimum hides it (eager), as transformers builds them.
_MASK_KINDS = ("sdpa", "eager")


def move(t: Tensor, device: torch.device) -> Tensor:
    """``t`` on ``device`` without the host waiting for the copy where that is safe (to an
    accelerator; a copy into host memory must finish before the host reads it). So the second
    model's forward is queued while the first one's still runs on its own device."""
    return t.to(device, non_blocking=device.type != "cpu")


def model_device(model: Any) -> torch.device:
    """Where a model takes its input ids (its embedding's device)."""
    return model.get_input_embeddings().weight.device


class Reader:
    """A causal LM with a KV cache over the rollouts' shared context.

    Args:
        model: a Hugging Face causal LM.
        lockstep: makes every process read the prompts with as many forwards (``None``: this
            process's own chunks only).
    """

    def __init__(self, model: Any, lockstep: Lockstep | None = None) -> None:
        self.model, self.lockstep = model, lockstep
        self.device = model_device(model)
        params = inspect.signature(model.forward).parameters
        # transformers 5 renamed past_key_values to cache.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._reserved = reserved(new_cache(model, capacity=1))
        attention = getattr(model.config, "_attn_implementation", None)
        self._mask_kind = attention if self._reserved and attention in _MASK_KINDS else None
        self._head = HeadInto(model)

    def prefill_groups(self, lengths: Tensor) -> list[tuple[Tensor, int]]:
        """How ``prefill`` reads prompts of these ``lengths`` (``[B]``): ``(index [b], width)``
        groups, each read at its width; ``[]``: all at once, at the widest prompt's width."""
        return self._chunks(lengths) if self._reserved else []

    def prefill(
        self,
        ids: Tensor,
        mask: Tensor,
        repeats: int,
        max_new_tokens: int,
        groups: list[tuple[Tensor, int]] | None = None,
    ) -> Tensor:
        """Read the prompts once, then repeat each ``repeats`` times (G samples per prompt).

        Args:
            ids: ``[B, P]`` left-padded prompt ids.
            mask: ``[B, P]`` 1 on real prompt tokens.
            repeats: rows per prompt.
            max_new_tokens: how many more tokens the cache must make room for in the mask.
            groups: how to read them (``prefill_groups``); ``None``: those of these prompts.
                A pass over some of a call's prompts reads each as the whole call would (the
                same width: padding changes the last bits of attention's sums).

        Returns:
            ``[B * repeats, V]`` float32 logits for the first response token.
        """
        ids, mask = ids.to(self.device), mask.to(self.device).long()
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)  # [B, P]
        rows, width = mask.shape
        capacity = width + max_new_tokens
        chunks = self.prefill_groups(mask.sum(1)) if groups is None else groups
        if self.lockstep is not None:
            # idle ones first: each forward gathers the same layers, so the order is free
            forwards = max(1, len(chunks))
            for _ in range(self.lockstep(forwards) - forwards):
                self.idle()
        if len(chunks) <= 1 and (not chunks or chunks[0][1] == width):
            # room for the prompt only, when its rows are repeated into storage of their own
            self.cache = new_cache(self.model, width if repeats > 1 else capacity)
            logits = self._forward(ids, mask, positions, self.cache)  # [B, V]
            if repeats > 1:
                repeat_rows(self.cache, repeats, capacity)
        else:
            logits, parts = None, []
            for index, chunk_width in chunks:
                part = new_cache(self.model, chunk_width)
                cols = slice(width - chunk_width, width)  # the chunk's prompts all fit here
                args = (ids[index, cols], mask[index, cols], positions[index, cols])
                out = self._forward(*args, part)
                if logits is None:
                    logits = out.new_empty(rows, out.shape[1])
                logits[index] = out
                parts.append((index, part))
            self.cache = stack_caches(self.model, parts, rows, width, capacity, repeats)
        if repeats > 1:
            logits = logits.repeat_interleave(repeats, dim=0)
            mask = mask.repeat_interleave(repeats, dim=0)
            positions = positions.repeat_interleave(repeats, dim=0)
        self._start_mask(mask, max_new_tokens)
        self.position = positions[:, -1] + 1  # [N] left padding: the last column is real
        return logits

    def _forward(self, ids: Tensor, mask: Tensor, positions: Tensor, cache: Any) -> Tensor:
        """``[b, V]`` float32 logits after the last column of a prompt chunk."""
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_arg: cache},
        )
        return out.logits[:, -1].float()

    def idle(self) -> None:
        """One forward of a single token, its output dropped: where the model's forward is a
        collective, a process with nothing left to read still joins the others' forwards."""
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        self.model(input_ids=ids, use_cache=False, logits_to_keep=1)

    def _chunks(self, lengths: Tensor) -> list[tuple[Tensor, int]]:
        """Rows grouped for the prefill: ``(index [b], width)`` pairs, shortest prompts first."""
        budget = _PREFILL_TOKENS.get(self.device.type, _PREFILL_TOKENS_ELSEWHERE)
        order = torch.argsort(lengths.cpu(), stable=True)
        sizes = lengths.cpu()[order].tolist()
        chunks, start = [], 0
        for end in range(1, len(sizes) + 1):
            # Ascending lengths: a chunk is as wide as its last row.
            if end == len(sizes) or (end + 1 - start) * sizes[end] > budget:
                chunks.append((order[start:end].to(self.device), sizes[end - 1]))
                start = end
        return chunks

    def _start_mask(self, mask: Tensor, max_new_tokens: int) -> None:
        """One mask buffer for the whole generation: each step fills one more column."""
        rows, width = mask.shape
        size = width + max_new_tokens
        if self._mask_kind == "sdpa":  # [N, 1, 1, W] bool, True on positions to attend
            self.mask = torch.zeros(rows, 1, 1, size, dtype=torch.bool, device=self.device)
            self.mask[:, 0, 0, :width] = mask.bool()
        elif self._mask_kind == "eager":  # [N, 1, 1, W] additive
            dtype = self.model.get_input_embeddings().weight.dtype
            self._hidden = torch.finfo(dtype).min
            shape = (rows, 1, 1, size)
            self.mask = torch.full(shape, self._hidden, dtype=dtype, device=self.device)
            self.mask[:, 0, 0, :width] = torch.where(mask.bool(), 0.0, self._hidden)
        else:  # [N, W] long: the model builds its 4D mask from it
            self.mask = torch.zeros(rows, size, dtype=torch.long, device=self.device)
            self.mask[:, :width] = mask
        self.width = width

    def step(self, tokens: Tensor, live: Tensor) -> Tensor:
        """Read one more token per row; rows with ``live`` False are masked out.

        Args:
            tokens: ``[n]`` the token each row appends.
            live: ``[n]`` bool, False for rows that have finished.

        Returns:
            ``[n, V]`` float32 logits for the next token: for a float32 model on a CPU, a view
            of a buffer that the next step overwrites (``tandem.engine.head``).
        """
        live = move(live, self.device)
        if self._mask_kind == "sdpa":
            self.mask[:, 0, 0, self.width] = live
        elif self._mask_kind == "eager":
            self.mask[:, 0, 0, self.width] = torch.where(live, 0.0, self._hidden)
        else:
            self.mask[:, self.width] = live
        self.width += 1
        with self._head.writing(tokens.shape[0]):  # the logits: a view of the head's buffer
            out = self.model(
                input_ids=move(tokens, self.device)[:, None],
                attention_mask=self.mask[..., : self.width],
                position_ids=self.position[:, None],
                use_cache=True,
                **{self._cache_arg: self.cache},
            )
        self.position = self.position + 1
        return out.logits[:, -1].float()

    def release(self) -> None:
        """Drop the cache and the mask, so that the next pass's are not reserved beside them."""
        self.cache = self.mask = None

    def select(self, keep: Tensor) -> None:
        """Keep only batch rows ``keep`` (``[n']`` indices) in the cache, mask and positions."""
        keep = keep.to(self.device)
        self.cache.batch_select_indices(keep)
        self.mask = self.mask[keep]
        self.position = self.position[keep]
