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
from tandem.samplers.base import JUNIOR, SENIOR, Handoff, Sampler, State
from tandem.samplers.boundaries import step_end

FIRST = ("senior", "junior", "coin")


@SAMPLERS.register("step")
class StepSampler(Sampler):
    """Authors take turns by reasoning step.

    State (each ``[N]``): ``author``; ``prev``, the last token; ``rounds``, steps ended so far.

    Args:
        tokenizer: the tokenizer both models share (or ``BoundaryTables``).
        first: who writes the first step: ``"senior"``, ``"junior"`` or ``"coin"``.
        alternate: hand over at every step end; if False, a coin draws each later step's author.
        p: the coin's probability of the senior (used by ``first="coin"`` and
            ``alternate=False``).
        max_rounds: end a row after this many steps (turns), as the authors' handoff
            evaluation does (150); None: no cap.
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
        vocab_size: int | None = None,
    ) -> None:
        if first not in FIRST:
            raise ValueError(f"first ({first!r}) must be one of {FIRST}.")
        if max_rounds is not None and max_rounds < 1:
            raise ValueError(
                f"max_rounds ({max_rounds}) must be at least 1 step, or None for no cap."
            )
        super().__init__(tokenizer, p=p, vocab_size=vocab_size)
        self.first = first
        self.alternate = alternate
        self.max_rounds = max_rounds

    def start(self, context: Tensor, coins: Tensor) -> Handoff:
        named = torch.full_like(context, JUNIOR if self.first == "junior" else SENIOR)
        author = self.coin(coins) if self.first == "coin" else named
        return Handoff({"author": author, "prev": context, "rounds": torch.zeros_like(context)})

    def step(self, state: State, token: Tensor, coins: Tensor) -> Handoff:
        author = state["author"]
        end = self.boundary(self.bound, token, state["prev"])  # [N]
        rounds = state["rounds"] + end.long()
        after = SENIOR + JUNIOR - author if self.alternate else self.coin(coins)
        new = {"author": torch.where(end, after, author), "prev": token, "rounds": rounds}
        done = None if self.max_rounds is None else rounds >= self.max_rounds
        return Handoff(new, done=done)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(first={self.first!r}, alternate={self.alternate}, "
            f"p={self.p}, max_rounds={self.max_rounds})"
        )
