"""The embedded tiny world: a tokenizer and a tiny base model that ship with the package.

``TINY_WORLD`` is a Hugging Face folder; load it like any checkpoint::

    AutoTokenizer.from_pretrained(TINY_WORLD)
    AutoModelForCausalLM.from_pretrained(TINY_WORLD)

``python -m tandem.assets.build`` rebuilds it; ``python -m tandem.assets.build_junior`` builds
``TINY_BPE_SMALL`` (``tiny-bpe-small``), a smaller junior with a tokenizer of its own.
"""

from __future__ import annotations

from pathlib import Path

TINY_WORLD = Path(__file__).resolve().parent / "tiny"
# a smaller junior with its own BPE vocabulary (``python -m tandem.assets.build_junior``)
TINY_BPE_SMALL = Path(__file__).resolve().parent / "tiny-bpe-small"
_NAMES = {"tiny": TINY_WORLD, "tiny-bpe-small": TINY_BPE_SMALL}


def resolve(name_or_path: str | Path) -> str:
    """The folder or hub name behind ``name_or_path`` (``tiny`` is the embedded world,
    ``tiny-bpe-small`` its junior of another vocabulary)."""
    return str(_NAMES.get(str(name_or_path), name_or_path))
