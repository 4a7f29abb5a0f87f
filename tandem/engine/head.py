"""The LM head's logits of a decode step written into one buffer, reused at every step.

On a CPU a step's logits are a fresh ``[n, V]`` tensor: 39 MB at Qwen's 151,936-wide vocabulary
and a batch of 64. An allocation that large is mapped from the system and given back when freed,
so every step pays the page faults of touching it anew: a fifth of a small model's step at that
width (measured: 9,500 faults a step, 2.3 s of system time in 128 steps of 64 rows). ``HeadInto``
has the model's own head write into a buffer the reader keeps instead: the same matrix product
(``torch.mm`` on the rows, as ``F.linear`` computes a bias-free head), so the logits are the
same bit for bit, and everything the model does around its head (soft-capping, scaling) still
happens.

It serves a plain ``nn.Linear`` head without bias, with its weight a CPU tensor, outside
autocast (which would cast the product, and takes no ``out``); any other head computes as it
always does. Accelerators keep their own caching allocators, so they gain nothing here.

What this file leaves out: the reader that steps the model (``tandem.engine.reader``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


class HeadInto:
    """A model's LM head, made to write a decode step's logits into a buffer of its own.

    Args:
        model: a Hugging Face causal LM.
    """

    def __init__(self, model: Any) -> None:
        head = model.get_output_embeddings()
        plain = type(head) is torch.nn.Linear and head.bias is None
        self.head = head if plain and head.weight.device.type == "cpu" else None
        self.buffer: Tensor | None = None  # [rows, V], grown when a step has more rows

    @contextlib.contextmanager
    def writing(self, rows: int) -> Iterator[None]:
        """Within this block the head writes the logits of ``rows`` tokens into the buffer (the
        model's output then holds a view of it, valid until the next step)."""
        head = self.head
        if head is None or torch.is_autocast_enabled("cpu"):
            yield
            return
        weight = head.weight
        if self.buffer is None or self.buffer.shape[0] < rows or self.buffer.dtype != weight.dtype:
            self.buffer = weight.new_empty(rows, weight.shape[0])
        out = self.buffer[:rows]
        # an instance attribute shadows the class's forward for the model's one call
        head.forward = lambda x: _linear_into(x, head.weight, out)
        try:
            yield
        finally:
            del head.forward


def _linear_into(x: Tensor, weight: Tensor, out: Tensor) -> Tensor:
    """``F.linear(x, weight)`` (no bias) for ``x [..., h]``, written into ``out [rows, V]``.

    For a contiguous ``x`` (a decode step's), ``F.linear`` folds it to ``[rows, h]`` and calls
    ``mm`` with ``weight.t()``: this makes the same call into ``out``. A strided ``x`` it may
    multiply batch by batch instead, with other roundings, so that, and anything else this
    cannot write into ``out``, goes to ``F.linear`` itself."""
    rows = x.numel() // x.shape[-1]
    plain = x.is_contiguous() and x.dtype == weight.dtype and type(weight.data) is Tensor
    if not plain or rows != out.shape[0]:
        return F.linear(x, weight)
    torch.mm(x.reshape(rows, x.shape[-1]), weight.t(), out=out)
    return out.view(*x.shape[:-1], weight.shape[0])
