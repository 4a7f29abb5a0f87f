"""Co-generation of rollouts by a senior and a junior model (pure torch, no Lightning).

``generate(senior, junior, prompts, sampler, params) -> Rollouts``; see ``tandem.engine.base``
for the contract, ``tandem.engine.generate`` for the entry point, ``tandem.engine.loop`` for the
one-vocabulary loop and ``tandem.engine.cross`` for a junior of another vocabulary. Importing
this package registers the rollout backends in ``tandem.registry.BACKENDS`` (``torch``;
``vllm``, which imports vLLM only when built; see ``tandem.engine.backend``).
"""

from tandem.engine import vllm_backend
from tandem.engine.backend import Backend, TorchBackend, build_backend
from tandem.engine.base import JUNIOR, PAD, SENIOR, Rollouts, SamplingParams, StopReason
from tandem.engine.generate import generate

__all__ = [
    "JUNIOR",
    "PAD",
    "SENIOR",
    "Backend",
    "Rollouts",
    "SamplingParams",
    "StopReason",
    "TorchBackend",
    "build_backend",
    "generate",
    "vllm_backend",
]
