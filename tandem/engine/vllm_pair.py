"""Tandem in one vLLM engine: one registered model holding the senior and the junior.

``TandemPairForCausalLM`` is an out-of-tree vLLM model (registered through ``ModelRegistry``, the
public extension point). It builds the senior (``senior.*``) from the senior's config and the
junior (``junior.*``) from the junior's own config, so a junior of another depth, width, rope or
norm setting is served as it is. Both are forwarded on every token of every request, each
attention layer with its own KV cache in one paged block table (vLLM groups layers of one kind
of attention, whatever their head counts, into one table): a token is read once, by both
models, and never again. ``compute_logits`` keeps both models' logits of the step on the
``Board`` the model shares with the pen processor (``tandem.engine.vllm_processors``) and
returns the senior's; the processor then puts the junior's in the rows it writes, restricts
what the schedule restricts, and reads each token's raw log-prob under both models.

The engine is started from the senior's folder with ``hf_overrides`` naming this architecture,
the senior's own (``tandem_architecture``), the junior's folder (``tandem_junior``) and the
board's key (``tandem_board``). The first ``load_weights`` (vLLM's loader, from the senior's
folder) also loads the junior from its folder; every later one (``reload_weights``, the
trainer's weight sync) loads the senior's half only.

``pair_refusal`` says, before any engine starts, why two models cannot share one engine: another
vocabulary, attention layers of another kind (their KV pages need their own block tables), or a
junior whose positions end before the engine's.

What this file leaves out: the schedule (``tandem.engine.vllm_pens``), the processors
(``tandem.engine.vllm_processors``), the requests and rollouts (``tandem.engine.vllm_backend``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

ARCHITECTURE = "TandemPairForCausalLM"
TESTED = "0.32"  # the vLLM minor version the pair is tested with (.ci/vllm)
_warned: set[str] = set()
log = logging.getLogger(__name__)
# What one engine's model and processor share, by the key in the engine's hf_overrides: both
# live in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0).
BOARDS: dict[str, Board] = {}


@dataclass(frozen=True)
class Step:
    """Both models' logits of one sampling step.

    Attributes:
        senior, junior: ``[R, V]`` float32 raw logits, one row per sampled batch row.
        lse: ``(senior, junior)`` ``[R]`` their log-softmax normalisers.
    """

    senior: Tensor
    junior: Tensor
    lse: tuple[Tensor, Tensor]

    @classmethod
    def of(cls, senior: Tensor, junior: Tensor) -> Step:
        # a copy of the senior's: vLLM's sampler changes the logits it is given in place
        s, j = senior.to(torch.float32, copy=True), junior.float()
        return cls(s, j, (torch.logsumexp(s, dim=-1), torch.logsumexp(j, dim=-1)))

    @property
    def rows(self) -> int:
        return int(self.senior.shape[0])

    def logprobs(self, rows: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """``[n]`` twice: the raw log-prob of ``tokens`` at ``rows`` under the senior and
        under the junior."""
        rows, tokens = rows.to(self.senior.device), tokens.to(self.senior.device)
        out = [
            (logits[rows, tokens] - lse[rows]).cpu()
            for logits, lse in zip((self.senior, self.junior), self.lse, strict=True)
        ]
        return out[0], out[1]

    def keep(self, row: int) -> Step:
        """A copy of one row (``[1, V]``), so the rest of the step can be freed."""
        pick = slice(row, row + 1)
        return Step(
            self.senior[pick].clone(), self.junior[pick].clone(), tuple(x[pick] for x in self.lse)
        )


@dataclass
class Board:
    """One engine's last sampling step, as its model and its pen processor see it."""

    step: Step | None = None


def register() -> None:
    """Register the pair model with vLLM (idempotent); says once where vLLM is not a version
    the pair is tested with (``TESTED``)."""
    import vllm
    from vllm import ModelRegistry

    if not vllm.__version__.startswith(TESTED) and TESTED not in _warned:
        _warned.add(TESTED)
        log.warning(
            "vLLM %s: the tandem pair engine is tested with vLLM %s. If rollouts look wrong, "
            "run tests/engine/test_vllm_pair.py (see docs/vllm.md, 'When vLLM moves').",
            vllm.__version__,
            TESTED,
        )
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "tandem.engine.vllm_pair:TandemPairForCausalLM")


def attention_kinds(config: dict[str, Any]) -> set[str]:
    """The kinds of attention layer a model config names (``full_attention``, or a sliding
    window of its size): layers of one kind share one block table, whatever their shapes."""
    window = config.get("sliding_window")
    types = config.get("layer_types")
    if not types:
        sliding = config.get("use_sliding_window", window is not None) and window is not None
        types = ["sliding_attention" if sliding else "full_attention"]
    return {f"sliding_attention({window})" if t == "sliding_attention" else t for t in types}


def pair_refusal(
    senior: dict[str, Any], junior: dict[str, Any], max_model_len: int | None
) -> str | None:
    """Why one engine cannot hold these two models (their config dicts), or None.

    Args:
        senior, junior: the models' ``config.json`` contents.
        max_model_len: the engine's longest prompt + response (None: the senior's own limit).
    """
    fix = "Use module.backend.name=torch (the torch engine serves any pair)."
    if senior.get("vocab_size") != junior.get("vocab_size"):
        return (
            f"vocab_size differs (senior {senior.get('vocab_size')}, junior "
            f"{junior.get('vocab_size')}): the pair samples both models' logits over one "
            f"vocabulary. {fix}"
        )
    kinds = attention_kinds(senior), attention_kinds(junior)
    if kinds[0] != kinds[1]:
        return (
            f"their attention layers differ in kind (layer_types / sliding_window: senior "
            f"{sorted(kinds[0])}, junior {sorted(kinds[1])}), so their KV pages cannot share "
            f"one block table. {fix}"
        )
    longest = max_model_len or senior.get("max_position_embeddings")
    reach = junior.get("max_position_embeddings")
    if longest is not None and reach is not None and reach < longest:
        return (
            f"the junior's max_position_embeddings ({reach}) is below the engine's "
            f"max_model_len ({longest}). Set module.backend.max_model_len to at most {reach}."
        )
    return None


def _inner(architectures: list[str], model_config: Any) -> type:
    from vllm import ModelRegistry

    cls, _ = ModelRegistry.resolve_model_cls(architectures, model_config)
    return cls


def own_config(vllm_config: Any, folder: str) -> Any:
    """``vllm_config`` with the model config of the model in ``folder`` (vLLM's own reading
    of it): the cache, compilation and parallel settings stay the engine's, shared."""
    from vllm.transformers_utils.config import get_config, get_hf_text_config

    model_config = copy.copy(vllm_config.model_config)
    model_config.hf_config = get_config(folder, model_config.trust_remote_code)
    model_config.hf_text_config = get_hf_text_config(model_config.hf_config)
    model_config.model_arch_config = model_config.get_model_arch_config()
    config = copy.copy(vllm_config)
    config.model_config = model_config
    return config


class TandemPairForCausalLM(torch.nn.Module):
    """The senior and the junior in one vLLM model (see the module)."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__()
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.models.utils import maybe_prefix

        config = vllm_config.model_config.hf_config
        senior = _inner([config.tandem_architecture], vllm_config.model_config)
        self.config = config
        self.senior = senior(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "senior"))
        mine = own_config(vllm_config, config.tandem_junior)
        junior = _inner(mine.model_config.hf_config.architectures, mine.model_config)
        with set_current_vllm_config(mine):  # layers that read the current config read its own
            self.junior = junior(vllm_config=mine, prefix=maybe_prefix(prefix, "junior"))
        self.width = int(config.hidden_size)  # the senior's part of the hidden states
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
        return torch.cat([senior, junior], dim=-1)  # [T, Hs + Hj]: split in compute_logits

    def compute_logits(self, hidden_states: Tensor) -> Tensor:
        senior = self.senior.compute_logits(hidden_states[..., : self.width])
        junior = self.junior.compute_logits(hidden_states[..., self.width :])
        self.board.step = Step.of(senior, junior)
        return senior

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
