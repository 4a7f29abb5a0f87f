"""One model reading the shared context: its own KV cache, attention mask and positions.

Both models of a tandem read every token, whoever wrote it, so each keeps a cache of its own and
the two are stepped with the same tokens. Prompts arrive left-padded: the attention mask hides the
padding, and explicit ``position_ids`` (counting real tokens only) keep each row's positions what
they would be unpadded. A row that has finished is fed the pad token with mask 0 until the batch
is compacted (``select``), so finished rows never change what live rows see.

What this file leaves out: sampling (``tandem.engine.draw``) and the loop
(``tandem.engine.generate``).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from tandem.engine.cache import new_cache


def model_device(model: Any) -> torch.device:
    """Where a model takes its input ids (its embedding's device)."""
    return model.get_input_embeddings().weight.device


class Reader:
    """A causal LM with a KV cache over the rollouts' shared context.

    Args:
        model: a Hugging Face causal LM.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.device = model_device(model)
        params = inspect.signature(model.forward).parameters
        # transformers 5 renamed past_key_values to cache.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def prefill(self, ids: Tensor, mask: Tensor, repeats: int, max_new_tokens: int) -> Tensor:
        """Read the prompts once, then repeat each ``repeats`` times (G samples per prompt).

        Args:
            ids: ``[B, P]`` left-padded prompt ids.
            mask: ``[B, P]`` 1 on real prompt tokens.
            repeats: rows per prompt.
            max_new_tokens: how many more tokens the cache must make room for in the mask.

        Returns:
            ``[B * repeats, V]`` float32 logits for the first response token.
        """
        ids, mask = ids.to(self.device), mask.to(self.device).long()
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)  # [B, P]
        self.cache = new_cache(self.model, capacity=ids.shape[1] + max_new_tokens)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_arg: self.cache},
        )
        logits = out.logits[:, -1].float()  # [B, V]
        if repeats > 1:
            self.cache.batch_repeat_interleave(repeats)
            logits = logits.repeat_interleave(repeats, dim=0)
            mask = mask.repeat_interleave(repeats, dim=0)
            positions = positions.repeat_interleave(repeats, dim=0)
        rows, width = mask.shape
        # One mask buffer for the whole generation: each step fills one more column.
        self.mask = torch.zeros(rows, width + max_new_tokens, dtype=torch.long, device=self.device)
        self.mask[:, :width] = mask
        self.width = width
        self.position = positions[:, -1] + 1  # [N] left padding: the last column is real
        return logits

    def step(self, tokens: Tensor, live: Tensor) -> Tensor:
        """Read one more token per row; rows with ``live`` False are masked out.

        Args:
            tokens: ``[n]`` the token each row appends.
            live: ``[n]`` bool, False for rows that have finished.

        Returns:
            ``[n, V]`` float32 logits for the next token.
        """
        self.mask[:, self.width] = live.to(self.device)
        self.width += 1
        out = self.model(
            input_ids=tokens.to(self.device)[:, None],
            attention_mask=self.mask[:, : self.width],
            position_ids=self.position[:, None],
            use_cache=True,
            **{self._cache_arg: self.cache},
        )
        self.position = self.position + 1
        return out.logits[:, -1].float()

    def select(self, keep: Tensor) -> None:
        """Keep only batch rows ``keep`` (``[n']`` indices) in the cache, mask and positions."""
        keep = keep.to(self.device)
        self.cache.batch_select_indices(keep)
        self.mask = self.mask[keep]
        self.position = self.position[keep]
