"""The embedded tiny world: a tokenizer and a tiny base model that ship with the package.

``TINY_WORLD`` is a Hugging Face folder; load it like any checkpoint::

    AutoTokenizer.from_pretrained(TINY_WORLD)
    AutoModelForCausalLM.from_pretrained(TINY_WORLD)

``python -m tandem.assets.build`` rebuilds it.
"""

from __future__ import annotations

from pathlib import Path

TINY_WORLD = Path(__file__).resolve().parent / "tiny"
# the notation world's base: the tiny world's tokenizer, a base that knows two notations
NOTATION_WORLD = Path(__file__).resolve().parent / "notation"
# the embedded models, by the name configs give them
EMBEDDED = {"tiny": TINY_WORLD, "notation": NOTATION_WORLD}


def resolve(name_or_path: str | Path) -> str:
    """The folder or hub name behind ``name_or_path`` (``tiny`` and ``notation`` are embedded)."""
    return str(EMBEDDED.get(str(name_or_path), name_or_path))
