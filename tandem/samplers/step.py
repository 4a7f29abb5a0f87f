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
        max_rounds: end a row after this many steps (turns), as the authors' handoff
            evaluation does (150); None: no cap.
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
        max_rounds: int | None = None,
        seed: int = 0,
        vocab_size: int | None = None,
    ) -> None:
        if first not in FIRST:
            raise ValueError(f"first ({first!r}) must be one of {FIRST}.")
        if max_rounds is not None and max_rounds < 1:
            raise ValueError(
                f"max_rounds ({max_rounds}) must be at least 1 step, or None for no cap."
            )
        self.max_rounds = max_rounds
        super().__init__(tokenizer, p=p, seed=seed, vocab_size=vocab_size)
        self.first = first
        self.alternate = alternate

    def start(self, context: Tensor, vocab_size: int) -> None:
        super().start(context, vocab_size)
        self.author.fill_(JUNIOR if self.first == "junior" else SENIOR)
        self._due = torch.full_like(self._drawn, self.first == "coin")  # [N]
        self.rounds = torch.zeros_like(self.author)  # [N] steps ended so far
        if self.max_rounds is not None:
            self.done = torch.zeros_like(self._drawn)

    def _draw_now(self) -> Tensor:
        return self._due

    def _after(self, token: Tensor) -> None:
        end = self.boundary(self._tables, token, self.prev)  # [N]
        self.rounds += end.long()
        if self.max_rounds is not None:
            self.done = self.rounds >= self.max_rounds
        if self.alternate:
            self.author = torch.where(end, SENIOR + JUNIOR - self.author, self.author)
            self._due = torch.zeros_like(end)
        else:
            self._due = end

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(first={self.first!r}, alternate={self.alternate}, "
            f"p={self.p}, max_rounds={self.max_rounds}, seed={self.seed})"
        )
