"""The embedded tiny world: a tokenizer and a tiny base model that ship with the package.

``TINY_WORLD`` is a Hugging Face folder; load it like any checkpoint::

    AutoTokenizer.from_pretrained(TINY_WORLD)
    AutoModelForCausalLM.from_pretrained(TINY_WORLD)

``python -m tandem.assets.build`` rebuilds it; ``python -m tandem.assets.build_junior`` builds
``TINY_BPE_SMALL`` (``tiny-bpe-small``), a smaller junior with a tokenizer of its own;
``python -m tandem.assets.build_notation`` builds ``NOTATION_WORLD`` (``notation``), the second
world's base (``docs/worlds.md``).
"""

from __future__ import annotations

from pathlib import Path

TINY_WORLD = Path(__file__).resolve().parent / "tiny"
# the notation world's base: the tiny world's tokenizer, a base that knows two notations
NOTATION_WORLD = Path(__file__).resolve().parent / "notation"
# a smaller junior with its own BPE vocabulary (``python -m tandem.assets.build_junior``)
TINY_BPE_SMALL = Path(__file__).resolve().parent / "tiny-bpe-small"
# the embedded models, by the name configs give them
EMBEDDED = {"tiny": TINY_WORLD, "notation": NOTATION_WORLD, "tiny-bpe-small": TINY_BPE_SMALL}


def resolve(name_or_path: str | Path) -> str:
    """The folder or hub name behind ``name_or_path`` (``tiny`` and ``notation`` are the
    embedded worlds' bases, ``tiny-bpe-small`` a junior of another vocabulary)."""
    return str(EMBEDDED.get(str(name_or_path), name_or_path))
