"""The sentence schedule (a training ablation): strict alternation at every blank line.

A boundary is a token after which the text ends in ``\\n\\n`` (the reference implementation's
rule), and the authors alternate there, the senior first. Kept faithful on purpose, loophole
included: the senior can keep the junior out by never ending a sentence, which is the failure
the paper names for this granularity.

What this file leaves out: any guard against that loophole (no ``max_gap_tokens``), and the
inference-time step schedule (``tandem.samplers.step``, whose machinery this reuses).
"""

from __future__ import annotations

from typing import Any

from tandem.registry import SAMPLERS
from tandem.samplers.boundaries import sentence_end
from tandem.samplers.step import StepSampler


@SAMPLERS.register("sentence")
class SentenceSampler(StepSampler):
    """Authors alternate at every ``\\n\\n``.

    Args:
        tokenizer: the tokenizer both models share (or ``BoundaryTables``).
        first: who writes the first sentence: ``"senior"`` or ``"junior"``.
        alternate: strict alternation (the ablation, the default); if False, a coin draws each
            later sentence's author with probability ``p``.
        p: the coin's probability of the senior; unused under strict alternation, accepted so
            that sweeps over ``sampler.p`` compose for every sampler.
        vocab_size: the models' logits width, if wider than the tokenizer.
    """

    boundary = staticmethod(sentence_end)

    def __init__(
        self,
        tokenizer: Any,
        *,
        first: str = "senior",
        alternate: bool = True,
        p: float = 0.5,
        vocab_size: int | None = None,
    ) -> None:
        if first not in ("senior", "junior"):
            raise ValueError(f"first ({first!r}) must be 'senior' or 'junior'.")
        super().__init__(tokenizer, first=first, alternate=alternate, p=p, vocab_size=vocab_size)
