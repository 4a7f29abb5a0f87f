"""Handoff samplers: who authors each token of a tandem rollout.

Each sampler registers itself in ``tandem.registry.SAMPLERS`` when its module is imported, and
the registry's first lookup imports every module of this package, so a new file joins with no
edit here; build one with ``SAMPLERS.build(name, tokenizer=tokenizer, **config)``. This package
re-exports the built-in ones for direct use.
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
