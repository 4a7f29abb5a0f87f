"""Loading causal LMs and tokenizers by name: ``tiny`` (the embedded world), a folder, a hub name.

What this file leaves out: freezing and placement (``tandem.modules.junior``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tandem.assets import EMBEDDED, resolve
from tandem.hub import hub_problem

# the embedded worlds' names, for messages
_EMBEDDED = " or ".join(f"`{name}`" for name in EMBEDDED)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def looks_local(name_or_path: str) -> bool:
    """True for things that can only be a path (hub names are ``owner/name`` or ``name``)."""
    s = str(name_or_path)
    return s.startswith(("/", ".", "~")) or s.count("/") > 1 or Path(s).exists()


def check_model_path(name_or_path: str, key: str) -> str | None:
    """Why ``name_or_path`` (the value of ``key``) cannot be loaded here, or None.

    A local folder must hold a ``config.json``; a hub name must be in the local cache or the hub
    must be reachable (``tandem.hub``), so that an offline machine refuses it in seconds.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        return f"{key} ({name_or_path!r}) must name a model: a hub name, a folder, or {_EMBEDDED}."
    path = resolve(name_or_path)
    if looks_local(path):
        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            return (
                f"{key} ({name_or_path!r}) is not a model folder: {folder} has no config.json. "
                "Give a Hugging Face hub name, a folder written by save_pretrained, or "
                f"{_EMBEDDED}."
            )
        return None
    return hub_problem(path, key)


def context_length(name_or_path: str) -> int | None:
    """The most positions the model attends to (``max_position_embeddings``), if it says."""
    config = AutoConfig.from_pretrained(resolve(name_or_path))
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def load_causal_lm(name_or_path: str, dtype: str = "float32") -> torch.nn.Module:
    """A Hugging Face causal LM in ``dtype``."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} must be one of {sorted(DTYPES)}.")
    return AutoModelForCausalLM.from_pretrained(resolve(name_or_path), dtype=DTYPES[dtype])


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer of a checkpoint, left-padded for generation."""
    tokenizer = AutoTokenizer.from_pretrained(resolve(name_or_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
