"""Tandem in one vLLM engine: one registered model holding the senior and the junior.

``TandemPairForCausalLM`` is an out-of-tree vLLM model (registered through ``ModelRegistry``, the
public extension point). It builds the senior's architecture twice, ``senior.*`` and
``junior.*``, so both are forwarded on every token of every request, each attention layer with
its own KV cache in the same paged block table: a token is read once, by both models, and
never again. ``compute_logits`` returns, row by row, the logits of the model that writes that
row's next token; who that is, the pen processor (``tandem.engine.vllm_pens``) decided before
the forward, by stepping the handoff sampler over the tokens written so far. Both models'
logits of the step stay on the ``Board`` the two share, for the processor to redraw a retracted
word onset from the other model and to read each token's raw log-prob under both.

The engine is started from the senior's folder with ``hf_overrides`` naming this architecture,
the senior's own (``tandem_architecture``), the junior's folder (``tandem_junior``) and the
board's key (``tandem_board``). The first ``load_weights`` (vLLM's loader, from the senior's
folder) also loads the junior from its folder; every later one (``reload_weights``, the
trainer's weight sync) loads the senior's half only.

What this file leaves out: the schedule (``tandem.engine.vllm_pens``), the requests and the
rollouts (``tandem.engine.vllm_backend``), and pairs of different shapes (the turn path).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tandem.samplers.base import JUNIOR

ARCHITECTURE = "TandemPairForCausalLM"
TESTED = "0.32"  # the vLLM minor version the pair is tested with (.ci/vllm)
_warned: set[str] = set()
log = logging.getLogger(__name__)
# What one engine's model and processor share, by the key in the engine's hf_overrides: both
# live in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0).
BOARDS: dict[str, Board] = {}
# The config keys two models must agree on to share one engine's layers and KV cache
SHAPE_KEYS = (
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
)


@dataclass
class Board:
    """One engine's step, as its model and its pen processor see it.

    Attributes:
        authors: ``[R]`` who writes each batch row's next token, set before the forward.
        logits: ``(senior, junior)`` ``[R, V]`` float32 raw logits of the last sampling step.
        lse: ``(senior, junior)`` ``[R]`` their log-softmax normalisers.
        expect: the rows of the coming sampling step (0: none armed; other calls, such as
            warm-up runs, get the senior's logits and leave the board as it is).
    """

    authors: Tensor | None = None
    logits: tuple[Tensor, Tensor] | None = None
    lse: tuple[Tensor, Tensor] | None = None
    expect: int = 0

    def arm(self, authors: Tensor) -> None:
        self.authors, self.expect = authors, int(authors.shape[0])

    def choose(self, senior: Tensor, junior: Tensor) -> Tensor:
        """``[R, V]`` each row's author's logits; keeps both for the processor."""
        if self.expect == 0 or senior.shape[0] != self.expect:
            return senior
        self.expect = 0
        both = (senior.float(), junior.float())
        self.logits = both
        self.lse = (torch.logsumexp(both[0], dim=-1), torch.logsumexp(both[1], dim=-1))
        juniors = (self.authors == JUNIOR).to(senior.device)[:, None]  # [R, 1]
        return torch.where(juniors, junior, senior)

    def logprobs(self, slots: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """``[n]`` twice: the raw log-prob of ``tokens`` at ``slots`` (rows of the last step)
        under the senior and under the junior."""
        assert self.logits is not None and self.lse is not None
        out = []
        for logits, lse in zip(self.logits, self.lse, strict=True):
            s, t = slots.to(logits.device), tokens.to(logits.device)
            out.append((logits[s, t] - lse[s]).cpu())
        return out[0], out[1]


def register() -> None:
    """Register the pair model with vLLM (idempotent); says once where vLLM is not a version
    the pair is tested with (``TESTED``)."""
    import vllm
    from vllm import ModelRegistry

    if not vllm.__version__.startswith(TESTED) and TESTED not in _warned:
        _warned.add(TESTED)
        log.warning(
            "vLLM %s: the tandem pair engine is tested with vLLM %s. If rollouts look wrong, "
            "run tests/engine/test_vllm_pair.py, or use module.backend.engine=turns (see "
            "docs/vllm.md, 'When vLLM moves').",
            vllm.__version__,
            TESTED,
        )

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "tandem.engine.vllm_pair:TandemPairForCausalLM")


def shape_mismatch(senior: dict[str, Any], junior: dict[str, Any]) -> list[str]:
    """The ``SHAPE_KEYS`` two model configs disagree on (empty: one engine can hold both)."""
    return [k for k in SHAPE_KEYS if senior.get(k) != junior.get(k)]


def _inner(vllm_config: Any) -> type:
    from vllm import ModelRegistry

    config = vllm_config.model_config.hf_config
    cls, _ = ModelRegistry.resolve_model_cls([config.tandem_architecture], vllm_config.model_config)
    return cls


class TandemPairForCausalLM(torch.nn.Module):
    """The senior and the junior in one vLLM model (see the module)."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        from vllm.model_executor.models.utils import maybe_prefix

        config = vllm_config.model_config.hf_config
        inner = _inner(vllm_config)
        self.config = config
        self.senior = inner(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "senior"))
        self.junior = inner(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "junior"))
        self.board = BOARDS.setdefault(config.tandem_board, Board())
        self.junior_folder: str = config.tandem_junior
        self.junior_loaded = False
        self.make_empty_intermediate_tensors = self.senior.make_empty_intermediate_tensors

    def embed_input_ids(self, input_ids: Tensor) -> Tensor:
        return self.senior.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: Tensor | None,
        positions: Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: Tensor | None = None,
        **kwargs: Any,
    ) -> Tensor:
        if input_ids is None:
            raise NotImplementedError(
                "the tandem pair reads token ids: prompt embeddings are not supported"
            )
        senior = self.senior(input_ids, positions, intermediate_tensors, None)
        junior = self.junior(input_ids, positions, intermediate_tensors, None)
        return torch.cat([senior, junior], dim=-1)  # [T, 2H]: split again in compute_logits

    def compute_logits(self, hidden_states: Tensor) -> Tensor:
        half = hidden_states.shape[-1] // 2
        senior = self.senior.compute_logits(hidden_states[..., :half])
        junior = self.junior.compute_logits(hidden_states[..., half:])
        return self.board.choose(senior, junior)

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> set[str]:
        """The senior's weights (HF names); the first call also loads the junior's folder."""
        loaded = {f"senior.{n}" for n in self.senior.load_weights(weights)}
        if not self.junior_loaded:
            loaded |= {f"junior.{n}" for n in self.junior.load_weights(_folder(self.junior_folder))}
            self.junior_loaded = True
        else:  # the trainer's sync: the junior's layers keep their weights, as they should
            loaded |= {n for n, _ in self.junior.named_parameters(prefix="junior")}
        return loaded


def _folder(path: str) -> Iterable[tuple[str, Tensor]]:
    """A model folder's safetensors weights, one tensor at a time."""
    from pathlib import Path

    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"the junior's folder {path} holds no *.safetensors weights")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                yield name, f.get_tensor(name)


class QuietJuniorReload(logging.Filter):
    """Drops vLLM's "Failed to load weights" warnings for the layers a sync leaves alone (the
    junior's, by design) while a sync runs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Failed to load weights" not in record.getMessage()
