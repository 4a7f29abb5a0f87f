"""A model's shape from its ``config.json`` alone: parameter counts and the sizes the memory
formulas read, from a model built on the ``meta`` device (no weights, no memory).

What this file leaves out: what the shape costs in a run (``tandem.plan.memory``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the memory plan needs to know of one causal LM.

    Attributes:
        name: the name or folder it was read from.
        architecture: its class (``Qwen3ForCausalLM``).
        params: parameters, tied ones counted once.
        layer_params: the largest decoder layer's parameters (what FSDP2 gathers at a time).
        root_params: the rest (embeddings, final norm, an untied LM head): FSDP2's root unit,
            gathered for the whole forward and backward.
        head_params: the LM head's weight (cast whole for every step under autocast).
        layers, hidden, intermediate, heads, kv_heads, head_dim, vocab: the config's sizes.
        context: ``max_position_embeddings`` (None if the config names none).
        kv_bytes: KV-cache bytes per token (every layer, keys and values) by dtype name.
        rows_attention: whether the trainer's packed forward lays its rows out side by side
            for attention (``tandem.modules.logprobs.lays_out_rows``: sdpa, full attention),
            rather than reading a ``[tokens, tokens]`` block-diagonal mask.
    """

    name: str
    architecture: str
    params: int
    layer_params: int
    root_params: int
    head_params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int | None
    kv_bytes: dict[str, int]
    rows_attention: bool = False

    @property
    def q(self) -> int:
        """Width of the queries (heads x head_dim)."""
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        """Width of the keys, or of the values (kv_heads x head_dim)."""
        return self.kv_heads * self.head_dim


def _kv_bytes_stand_in(config: Any, dtype: str) -> int:
    """Layers x KV heads x head_dim x 2 (keys and values) x the dtype's bytes."""
    heads = getattr(config, "num_attention_heads", 1)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return config.num_hidden_layers * kv_heads * head_dim * 2 * DTYPE_BYTES[dtype]


def kv_bytes_per_token(config: Any, dtype: str) -> int:
    """The engine's own count where it has one (``tandem.engine.cache``), else the formula."""
    try:  # imported here: the engine package is slow to import and the plan wants to be quick
        from tandem.engine.cache import kv_bytes_per_token as engine_count
    except ImportError:
        return _kv_bytes_stand_in(config, dtype)
    import torch

    return int(engine_count(config, getattr(torch, dtype)))


# the public config.json of models the shipped configs name, so that their plan needs no hub
BUNDLED = Path(__file__).with_name("shapes")


def _config_source(resolved: str) -> str:
    """A local folder as given; a hub name with a bundled config, that config's folder (the
    plan reads the shape only); any other name as given, for transformers to fetch."""
    bundled = BUNDLED / resolved.replace("/", "--")
    if not Path(resolved).exists() and (bundled / "config.json").is_file():
        return str(bundled)
    return resolved


@functools.cache
def model_shape(name_or_path: str) -> ModelShape:
    """The shape of the model at ``name_or_path`` (``tiny``, a folder or a hub name), read from
    its config alone: the model is built on the ``meta`` device, so no weight is read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tandem.assets import resolve

    try:
        config = AutoConfig.from_pretrained(_config_source(resolve(name_or_path)))
    except OSError as err:  # not on disk, and the hub unreachable or without it
        from tandem.errors import ConfigError

        raise ConfigError(
            f"the memory plan cannot read the config of {name_or_path!r} "
            f"({str(err).splitlines()[0]}). Point model.name_or_path at a local folder with "
            "its config.json, or give the machine hub access."
        ) from err
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())  # a tied weight is listed once
    layers = _decoder_layers(model, config.num_hidden_layers)
    layer_params = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    head = model.get_output_embeddings()
    heads = config.num_attention_heads
    context = getattr(config, "max_position_embeddings", None)
    return ModelShape(
        name=str(name_or_path),
        architecture=type(model).__name__,
        params=params,
        layer_params=max(layer_params),
        root_params=params - sum(layer_params),
        head_params=head.weight.numel() if head is not None else 0,
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        heads=heads,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        vocab=config.vocab_size,
        context=context if isinstance(context, int) and context > 0 else None,
        kv_bytes={d: kv_bytes_per_token(config, d) for d in DTYPE_BYTES},
        rows_attention=_lays_out_rows(model),
    )


def _lays_out_rows(model: Any) -> bool:
    """The trainer's own test of its packed attention, where it has one (else the mask)."""
    try:
        from tandem.modules.logprobs import lays_out_rows
    except ImportError:
        return False
    return bool(lays_out_rows(model))


def _decoder_layers(model: Any, count: int) -> Any:
    """The model's list of decoder layers: the module list of ``num_hidden_layers`` entries."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return module
    raise ValueError(
        f"{type(model).__name__} has no list of {count} decoder layers (num_hidden_layers): the "
        "memory plan reads decoder-only causal LMs."
    )
