"""Handoff samplers: who authors each token of a tandem rollout.

Importing this package registers every sampler in ``tandem.registry.SAMPLERS``; build one with
``SAMPLERS.build(name, tokenizer=tokenizer, **config)``.
"""

from tandem.samplers.base import JUNIOR, PAD, SENIOR, Handoff, Sampler
from tandem.samplers.boundaries import BoundaryTables, boundary_tables
from tandem.samplers.sentence import SentenceSampler
from tandem.samplers.solo import SoloSampler
from tandem.samplers.step import StepSampler
from tandem.samplers.token import TokenSampler
from tandem.samplers.word import WordSampler

__all__ = [
    "JUNIOR",
    "PAD",
    "SENIOR",
    "BoundaryTables",
    "Handoff",
    "Sampler",
    "SentenceSampler",
    "SoloSampler",
    "StepSampler",
    "TokenSampler",
    "WordSampler",
    "boundary_tables",
]
