"""Reading a right-padded block of tokens per row in one forward: the cross-vocabulary engine's
reader for models ``PackedReader`` cannot read (not sdpa, or sliding-window layers).

What this file leaves out: the packed read (``tandem.engine.packed``), which the engine prefers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tandem.engine.cache import reserved
from tandem.engine.reader import Reader

# ``tidy`` drops the columns no row reads once at least this many of them can go.
_HIDDEN_COLUMNS_WORTH_DROPPING = 16


class BlockReader(Reader):
    """A ``Reader`` that also reads a right-padded block of tokens per row in one forward.

    Rows read different numbers of tokens (a catch-up, one token, or none); the block's padded
    columns are hidden from every later position, and padded queries see the block up to
    themselves so that their (discarded) outputs, which feed the cache's later layers, are finite.
    It serves the models ``PackedReader`` cannot read, at the cost of a padded slot in every layer
    for each row that reads less than the most.
    """

    def feed(self, rows: Tensor, tokens: Tensor, counts: Tensor) -> Tensor:
        """``PackedReader.feed``'s contract: ``counts[i]`` tokens for batch row ``rows[i]``,
        packed in ``tokens [M]``; ``[M, V]`` logits, each after its own token."""
        n, m = self.position.shape[0], tokens.shape[0]
        rows, counts = rows.cpu(), counts.cpu()  # the block is built on the host
        offsets = torch.arange(m) - (counts.cumsum(0) - counts).repeat_interleave(counts)
        at = rows.repeat_interleave(counts)  # [M] batch row of each token
        block = torch.zeros(n, int(counts.max()), dtype=torch.long)
        valid = torch.zeros(n, block.shape[1], dtype=torch.bool)
        block[at, offsets], valid[at, offsets] = tokens.cpu(), True
        return self.feed_block(block, valid)[at.to(self.device), offsets.to(self.device)]

    def feed_block(self, tokens: Tensor, valid: Tensor) -> Tensor:
        """Read ``tokens [n, K]`` where ``valid [n, K]`` (right-padded); ``[n, K, V]`` logits."""
        n, k = tokens.shape
        tokens, valid = tokens.to(self.device), valid.to(self.device)
        self._room(k)
        w = self.width
        causal = torch.ones(k, k, dtype=torch.bool, device=self.device).tril()  # [K, K]
        if self._mask_kind is None:
            self.mask[:, w : w + k] = valid
            attention = self.mask[:, : w + k]
        else:
            past = self.mask[:, :, :, :w].expand(n, 1, k, w)  # [n, 1, K, w]
            block = causal[None, None].expand(n, 1, k, k)
            if self._mask_kind == "sdpa":
                attention = torch.cat([past, block], dim=-1)
                self.mask[:, 0, 0, w : w + k] = valid
            else:
                hidden = torch.tensor(self._hidden, dtype=self.mask.dtype, device=self.device)
                attention = torch.cat([past, torch.where(block, 0.0, hidden)], dim=-1)
                self.mask[:, 0, 0, w : w + k] = torch.where(valid, 0.0, hidden)
        positions = self.position[:, None] + (valid.long().cumsum(1) - 1).clamp(min=0)
        out = self.model(
            input_ids=tokens,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: self.cache},
        )
        self.width += k
        self.position = self.position + valid.long().sum(1)
        return out.logits.float()  # [n, K, V]

    def tidy(self) -> None:
        """Move each row's visible cache columns to the front and drop the columns no row sees.

        Every read adds a column for every row, hidden where the row read nothing, so a cache
        grows by one column per step while rows read fewer tokens; attention reads all of them.
        Positions are the rows' own (counted over what they read), so moving keys changes
        nothing they attend to.
        """
        if self._mask_kind is None or not reserved(self.cache):
            return
        w = self.width
        columns = self.mask[:, 0, 0, :w]
        seen = columns if self._mask_kind == "sdpa" else columns == 0  # [n, w]
        counts = seen.sum(1)  # [n]
        keep = int(counts.max())
        if keep > w - _HIDDEN_COLUMNS_WORTH_DROPPING:
            return
        order = torch.argsort((~seen).to(torch.int8), dim=1, stable=True)[:, :keep]  # [n, keep]
        for layer in self.cache.layers:
            k, v = layer.keys, layer.values  # [n, H_kv, w, d]
            layer.keys = k.gather(2, order[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3]))
            layer.values = v.gather(
                2, order[:, None, :, None].expand(-1, v.shape[1], -1, v.shape[3])
            )
            layer._storage = None  # the next write reserves storage around the kept columns
        front = torch.arange(keep, device=self.device)[None] < counts[:, None]  # [n, keep]
        if self._mask_kind == "sdpa":
            self.mask[:, 0, 0, :] = False
            self.mask[:, 0, 0, :keep] = front
        else:
            self.mask[:, 0, 0, :] = self._hidden
            self.mask[:, 0, 0, :keep] = torch.where(front, 0.0, self._hidden)
        self.width = keep

    def _room(self, k: int) -> None:
        """Grow the mask buffer (by doubling) until ``k`` more columns fit."""
        size = self.mask.shape[-1]
        if self.width + k <= size:
            return
        extra = max(size, self.width + k - size)
        fill = self._hidden if self._mask_kind == "eager" else 0
        pad = torch.full((*self.mask.shape[:-1], extra), fill, device=self.device)
        self.mask = torch.cat([self.mask, pad.to(self.mask.dtype)], dim=-1)
