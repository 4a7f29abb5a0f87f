"""The token schedule: a fresh coin picks the author of every single token.

The finest granularity, and the one whose statistics are plain binomials: each token is the
senior's with probability ``p``, independently of everything else.
What this file leaves out: boundaries; the token schedule needs none.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from tandem.registry import SAMPLERS
from tandem.samplers.base import Handoff, Sampler, State


@SAMPLERS.register("token")
class TokenSampler(Sampler):
    """A coin with probability ``p`` of the senior, at every token.

    Args:
        tokenizer: unused; accepted so that every sampler is built the same way.
        p: the probability that the senior writes a given token.
        vocab_size: unused.
    """

    needs_tables = False

    def __init__(self, tokenizer: Any = None, *, p: float = 0.5, vocab_size: int | None = None):
        super().__init__(None, p=p)

    def start(self, context: Tensor, coins: Tensor) -> Handoff:
        return Handoff({"author": self.coin(coins)})

    def step(self, state: State, token: Tensor, coins: Tensor) -> Handoff:
        return Handoff({"author": self.coin(coins)})
