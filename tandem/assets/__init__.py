"""The embedded tiny world: a tokenizer and a tiny base model that ship with the package.

``TINY_WORLD`` is a Hugging Face folder; load it like any checkpoint::

    AutoTokenizer.from_pretrained(TINY_WORLD)
    AutoModelForCausalLM.from_pretrained(TINY_WORLD)

``python -m tandem.assets.build`` rebuilds it.
"""

from __future__ import annotations

from pathlib import Path

TINY_WORLD = Path(__file__).resolve().parent / "tiny"


def resolve(name_or_path: str | Path) -> str:
    """The folder or hub name behind ``name_or_path`` (``tiny`` is the embedded world)."""
    return str(TINY_WORLD) if str(name_or_path) == "tiny" else str(name_or_path)
