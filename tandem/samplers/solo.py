"""The solo schedule: the senior writes every token (vanilla GRPO, and solo evaluation).

With a junior present the engine still runs it at every step, so its log-probs of the senior's
tokens (legibility, drift) come with the rollouts at no extra pass.
What this file leaves out: everything about boundaries; solo needs none.
"""

from __future__ import annotations

from typing import Any

from tandem.registry import SAMPLERS
from tandem.samplers.base import Sampler


@SAMPLERS.register("solo")
class SoloSampler(Sampler):
    """The senior authors everything.

    Args:
        tokenizer: unused; accepted so that every sampler is built the same way.
        seed: seeds the (unused) coin, for a uniform interface.
        vocab_size: unused.
    """

    solo = True
    needs_tables = False

    def __init__(self, tokenizer: Any = None, *, seed: int = 0, vocab_size: int | None = None):
        super().__init__(None, p=1.0, seed=seed, vocab_size=vocab_size)

    def __repr__(self) -> str:
        return "SoloSampler()"
