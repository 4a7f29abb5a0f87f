"""The solo schedule: the senior writes every token (vanilla GRPO, and solo evaluation).

With a junior present the engine still runs it at every step, so its log-probs of the senior's
tokens (legibility, drift) come with the rollouts at no extra pass.
What this file leaves out: everything about boundaries; solo needs none.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tandem.registry import SAMPLERS
from tandem.samplers.base import SENIOR, Handoff, Sampler, State


@SAMPLERS.register("solo")
class SoloSampler(Sampler):
    """The senior authors everything.

    Args:
        tokenizer: unused; accepted so that every sampler is built the same way.
        vocab_size: unused.
    """

    solo = True
    needs_tables = False

    def __init__(self, tokenizer: Any = None, *, vocab_size: int | None = None) -> None:
        super().__init__(None, p=1.0)

    def start(self, context: Tensor, coins: Tensor) -> Handoff:
        return Handoff({"author": torch.full_like(context, SENIOR)})

    def step(self, state: State, token: Tensor, coins: Tensor) -> Handoff:
        return Handoff(state)

    def __repr__(self) -> str:
        return "SoloSampler()"
