"""The reasoning-step schedule for inference: authors hand over where a step ends.

A step ends at a token that completes a blank line (``\\n\\n``; see
:mod:`tandem.samplers.boundaries`). By default the senior writes the first step and the authors
alternate at every step end, as in the paper's handoff evaluation. Options: the junior (or a
coin) writes the first step, and ``alternate=False`` draws each later step's author with a coin
(senior with probability ``p``) instead of alternating.

What this file leaves out: ``max_gap_tokens`` (a step is as long as its author makes it) and the
training-time sentence ablation (``tandem.samplers.sentence``, the same machinery).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tandem.registry import SAMPLERS
from tandem.samplers.base import JUNIOR, SENIOR, Sampler
from tandem.samplers.boundaries import step_end

FIRST = ("senior", "junior", "coin")


@SAMPLERS.register("step")
class StepSampler(Sampler):
    """Authors take turns by reasoning step.

    Args:
        tokenizer: the tokenizer both models share (or ``BoundaryTables``).
        first: who writes the first step: ``"senior"``, ``"junior"`` or ``"coin"``.
        alternate: hand over at every step end; if False, a coin draws each later step's author.
        p: the coin's probability of the senior (used by ``first="coin"`` and
            ``alternate=False``).
        seed: seeds the coin.
        vocab_size: the models' logits width, if wider than the tokenizer.
    """

    # The boundary rule: (tables, token, prev) -> [N] bool.
    boundary = staticmethod(step_end)

    def __init__(
        self,
        tokenizer: Any,
        *,
        first: str = "senior",
        alternate: bool = True,
        p: float = 0.5,
        seed: int = 0,
        vocab_size: int | None = None,
    ) -> None:
        if first not in FIRST:
            raise ValueError(f"first ({first!r}) must be one of {FIRST}.")
        super().__init__(tokenizer, p=p, seed=seed, vocab_size=vocab_size)
        self.first = first
        self.alternate = alternate

    def start(self, context: Tensor, vocab_size: int) -> None:
        super().start(context, vocab_size)
        self.author.fill_(JUNIOR if self.first == "junior" else SENIOR)
        self._due = torch.full_like(self._drawn, self.first == "coin")  # [N]

    def _draw_now(self) -> Tensor:
        return self._due

    def _after(self, token: Tensor) -> None:
        end = self.boundary(self._tables, token, self.prev)  # [N]
        if self.alternate:
            self.author = torch.where(end, SENIOR + JUNIOR - self.author, self.author)
            self._due = torch.zeros_like(end)
        else:
            self._due = end

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(first={self.first!r}, alternate={self.alternate}, "
            f"p={self.p}, seed={self.seed})"
        )
