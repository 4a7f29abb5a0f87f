"""Co-generation of rollouts by a senior and a junior model (pure torch, no Lightning).

``generate(senior, junior, prompts, sampler, params) -> Rollouts``; see ``tandem.engine.base``
for the contract and ``tandem.engine.generate`` for the loop.
"""

from tandem.engine.base import JUNIOR, PAD, SENIOR, Rollouts, SamplingParams, StopReason
from tandem.engine.generate import generate

__all__ = ["JUNIOR", "PAD", "SENIOR", "Rollouts", "SamplingParams", "StopReason", "generate"]
