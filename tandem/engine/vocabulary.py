"""Text between two vocabularies: what the cross-vocabulary engine knows of each tokenizer.

A pair of different vocabularies shares its response as bytes. Each writer's tokens spell bytes
(their surfaces, ``tandem.samplers.boundaries.token_surfaces``); the other model reads the same
bytes in its own tokens (``Vocabulary.encode``): runs of valid UTF-8 through its tokenizer, and
any byte outside one (a character cut by a change of pen, or a byte a model wrote that begins no
valid character) as that byte's own token, so the two sequences always spell the same bytes.

``split_problem`` is the pair check: a tokenizer whose text, cut before each space and tokenized
piece by piece, gives other tokens than the whole (or that cannot spell every byte) cannot share
words exactly. ``same_vocabulary`` tells whether a pair needs any of this.

What this file leaves out: the engine (``tandem.engine.cross``) and where a schedule hands the pen
over (the samplers, whose tables ``Vocabulary.tables`` are).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tandem.metrics.per_byte import byte_table
from tandem.samplers.boundaries import BoundaryTables, tables_from_surfaces, token_surfaces


@dataclass(frozen=True)
class Vocabulary:
    """One tokenizer's ids as bytes, and its boundary tables.

    Attributes:
        tokenizer: the Hugging Face tokenizer.
        surfaces: each id's bytes (``None``: a special token, which spells nothing).
        byte_ids: the id spelling each byte value alone (``-1`` where none does).
        tables: the samplers' boundary tables over its ids.
        nbytes: ``[V]`` bytes each id spells (0 for special tokens).
    """

    tokenizer: Any
    surfaces: list[bytes | None]
    byte_ids: list[int]
    tables: BoundaryTables
    nbytes: Tensor  # [V] long

    def spelt(self, ids: Sequence[int]) -> bytes:
        """The bytes ``ids`` spell, special tokens skipped."""
        return b"".join(s for s in map(self.surfaces.__getitem__, ids) if s is not None)

    def encode(self, texts: Sequence[bytes]) -> list[list[int]]:
        """Each byte string in this vocabulary's ids."""
        pieces = [_pieces(data) for data in texts]
        runs = [p for row in pieces for p in row if isinstance(p, str)]
        encoded = iter(_encode(self.tokenizer, runs))
        out = []
        for row in pieces:
            ids: list[int] = []
            for p in row:
                ids += next(encoded) if isinstance(p, str) else [self.byte_ids[p]]
            out.append(ids)
        return out


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """``tokenizer(texts, add_special_tokens=False)["input_ids"]``, text by text through a fast
    tokenizer's own backend where that gives the same ids.

    The engine encodes a few words at a time, hundreds of times a rollout: the tokenizer's call
    costs tens of microseconds of Python around the backend's own, and its batch encoding hands
    the words to a pool of threads, whose waking costs milliseconds on a busy machine. One text
    at a time through the backend gives the call's ids when nothing in the backend's state
    changes them: no truncation, no padding to a fixed length (padding to the longest of one
    text pads nothing), and special tokens read as the call reads them.
    """
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    padding = None if backend is None else backend.padding
    if (
        backend is None
        or backend.truncation is not None
        or (padding is not None and padding.get("length") is not None)
        or backend.encode_special_tokens != getattr(tokenizer, "split_special_tokens", False)
    ):
        return tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [backend.encode(text, add_special_tokens=False).ids for text in texts]


def _pieces(data: bytes) -> list[str | int]:
    """``data`` as runs of valid UTF-8 text and the single bytes outside them."""
    try:
        return [data.decode("utf-8")] if data else []
    except UnicodeDecodeError:
        pass
    out: list[str | int] = []
    run: list[str] = []
    for ch in data.decode("utf-8", "surrogateescape"):
        if "\udc80" <= ch <= "\udcff":  # a byte that is no part of a valid character
            if run:
                out.append("".join(run))
                run = []
            out.append(ord(ch) - 0xDC00)
        else:
            run.append(ch)
    if run:
        out.append("".join(run))
    return out


# tokenizer -> its Vocabulary, built once: a training run generates with the same two tokenizers
# at every step, and a 151k vocabulary takes a while
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocabulary(tokenizer: Any) -> Vocabulary:
    """``tokenizer``'s ``Vocabulary`` (built once per tokenizer)."""
    if tokenizer not in _BUILT:
        surfaces = token_surfaces(tokenizer)
        byte_ids = [-1] * 256
        for i, s in reversed(list(enumerate(surfaces))):  # the lowest id spelling each byte
            if s is not None and len(s) == 1:
                byte_ids[s[0]] = i
        tables = tables_from_surfaces(surfaces)
        _BUILT[tokenizer] = Vocabulary(tokenizer, surfaces, byte_ids, tables, byte_table(tokenizer))
    return _BUILT[tokenizer]


# Texts on which a pair's tokenizers must both split before every space (the pair check): prose,
# arithmetic in the tiny world's style, LaTeX, code, runs of spaces and newlines.
PROBE_TEXTS = (
    "We begin with 41 toy cars.\n\nMultiplying by 4 gives 41 * 4 = 164 toy cars.",
    "So the final count is \\boxed{200}. It's (about) 3.5 km, isn't it?",
    "Let $x^2 + y_1 = \\frac{1}{2}$ and  two  spaces,\n then a newline and\ttab.",
    "def f(a, b):\n    return a + b  # ok",
)


def split_problem(tokenizer: Any, texts: Sequence[str] = PROBE_TEXTS) -> str | None:
    """Why ``tokenizer`` cannot take part in a cross-vocabulary pair, or None.

    Each model reads the other's words on its own, in pieces cut where the pen passed. That is
    exact only if decoding the tokens gives the text back and every byte has a token of its own
    (a cut may fall inside a character), and it tokenizes as the whole text would where the
    pieces are cut before a space (the pre-tokenizer splits there: Qwen's, GPT-2's, Llama 3's
    do; one whose words carry the space after them does not), which is where the engine cuts
    whenever the schedule lets it; and its words must begin with a space-led token.
    """
    vocab = vocabulary(tokenizer)
    missing = [b for b, i in enumerate(vocab.byte_ids) if i < 0]
    if missing:
        return f"no token spells byte {missing[0]:#04x} alone, so a character cut in two is lost"
    spaced = vocab.tables.leading_space
    for text in texts:
        whole = tokenizer(text, add_special_tokens=False)["input_ids"]
        back = tokenizer.decode(whole, skip_special_tokens=True)
        if back != text:
            return f"decoding its tokens of {text!r} gives {back!r}, not the text"
        cuts = [i for i in range(1, len(text)) if text[i] == " "]
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        joined = [
            t for piece in pieces for t in tokenizer(piece, add_special_tokens=False)["input_ids"]
        ]
        if joined != whole:
            return (
                f"tokenizing {text!r} word by word (cut before each space) gives other tokens "
                "than tokenizing it whole: its pre-tokenizer does not split before a space"
            )
        if not any(bool(spaced[t]) for t in whole):
            return f"none of its tokens of {text!r} starts with a space"
    return None


def same_vocabulary(tokenizer: Any, other: Any) -> bool:
    """Whether two tokenizers map every token to the same id (then the one-loop engine serves)."""
    if tokenizer is other or tokenizer is None or other is None:
        return True  # nothing to tell them apart: the one-loop engine checks the logits' widths
    return len(tokenizer) == len(other) and tokenizer.get_vocab() == other.get_vocab()


def padded_to(x: Tensor, width: int) -> Tensor:
    """``x [V]`` padded with zeros (False) to ``width`` ids: a model's logits may be wider than
    its tokenizer, and ids no text maps to spell nothing."""
    return torch.cat([x, x.new_zeros(max(0, width - x.numel()))])
