"""Where words, sentences and reasoning steps begin and end, decided once per vocabulary.

Each token's *surface* (the raw bytes it stands for) is recovered from its vocabulary entry, for
byte-level BPE vocabularies (GPT-2's alphabet: ``Ġ`` is a space, ``Ċ`` a newline; Qwen, Llama 3)
and for SentencePiece ones (``▁`` is a space, ``<0x0A>`` a byte-fallback newline; Llama 2,
Mistral, Gemma). From the surfaces come boolean tables over the vocabulary, one entry per id:

- a **word** is a maximal run of non-whitespace bytes. A word begins inside a token when the
  token holds whitespace followed by a word byte (``Ġapples``, ``Ġ(``, ``▁the``), and at the
  token's first byte when that is a word byte and the text before ends in whitespace (``5``
  after ``Ġ``, ``Then`` after ``.ĊĊ``). So ``onset``, ``leads`` and ``trails`` together with the
  previous token decide it; :func:`word_onset` is that rule. A bare ``Ġ`` or ``ĊĊ`` begins no
  word: the digits or the word that follow it do;
- a **sentence** ends at a token whose text ends in a blank line (``\\n\\n``), the reference
  implementation's rule; a **reasoning step** ends at a token whose text contains one. Both also
  fire where a newline run reaches two across a token boundary (SentencePiece spells
  ``\\n\\n`` as two byte tokens; a small BPE vocabulary may lack ``ĊĊ``), but not where it
  only grows (``.ĊĊ`` then ``Ċ`` is one blank line). Looking one token back cannot see a run
  split over three or more tokens, nor one whose two parts each hold ``\\n\\n``; such runs may
  count twice. ``\\r`` is ignored, so ``\\r\\n\\r\\n`` counts when it is one token
  (Qwen's ``čĊčĊ``), but not when every byte is a token of its own;
- a **leading space** is a token whose surface starts with a space byte (``Ġ``/``▁``): the
  authors' code's word boundary (``Ġ`` surfaces over ``tokenizer.vocab_size``, 53,021 ids on
  Qwen3). It looks at no context: a bare ``Ġ`` is one, a word after a newline is not;
- special and added tokens (``<|im_end|>``, ``<think>``) are never boundaries and hold no word;
- partial UTF-8 tokens are handled on their bytes: a continuation byte (``0x80``-``0xBF``) never
  begins a word, a lead byte does like any other word byte.

The model's logits may be wider than the tokenizer (padding rows, e.g. Qwen3's 151,936 logits
for 151,669 tokens): tables are padded with ``False`` to the requested size, so ids that no text
maps to are never boundaries.

What this file leaves out: *when* a boundary hands the pen over (the samplers), and non-byte
vocabularies other than SentencePiece's.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

_WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@dataclass(frozen=True)
class BoundaryTables:
    """Per-token boundary facts, each a bool tensor ``[V]`` over the model's logits width.

    Attributes:
        special: special and added tokens (never boundaries).
        onset: a word begins inside the token (whitespace then a word byte).
        leads: the token's first byte is a word byte (a word begins there after whitespace).
        trails: the token's last byte is whitespace.
        sentence_end: the token's text ends with a blank line.
        step_end: the token's text contains a blank line.
        newline: the token's text is exactly one newline.
        newline_start: the token's text starts with a newline.
        newline_end: the token's text ends with a newline.
        leading_space: the token's text starts with a space (the authors' word boundary).
    """

    special: Tensor  # [V]
    onset: Tensor  # [V]
    leads: Tensor  # [V]
    trails: Tensor  # [V]
    sentence_end: Tensor  # [V]
    step_end: Tensor  # [V]
    newline: Tensor  # [V]
    newline_start: Tensor  # [V]
    newline_end: Tensor  # [V]
    leading_space: Tensor  # [V]

    def __post_init__(self) -> None:
        sizes = {f.name: tuple(getattr(self, f.name).shape) for f in dataclasses.fields(self)}
        assert len(set(sizes.values())) == 1 and len(next(iter(sizes.values()))) == 1, (
            f"every boundary table must be one [V] vector of the same V, got {sizes}"
        )

    @property
    def size(self) -> int:
        """V, the number of ids the tables cover."""
        return self.special.shape[0]

    def to(self, device: torch.device | str) -> BoundaryTables:
        """The same tables on ``device``."""
        return BoundaryTables(**{k: v.to(device) for k, v in self._items()})

    def padded(self, size: int) -> BoundaryTables:
        """The tables widened to ``size`` ids; the new ids are no boundary of any kind.

        Raises:
            ValueError: ``size`` is smaller than the tables: the model cannot emit ids the
                tokenizer has, which means model and tokenizer do not belong together.
        """
        if size < self.size:
            raise ValueError(
                f"the model's logits are {size} wide but the tokenizer has {self.size} ids: "
                "the boundary tables cannot be narrowed, since model and tokenizer must share "
                "one vocabulary. Pass the tokenizer that belongs to the model."
            )
        if size == self.size:
            return self
        return BoundaryTables(
            **{k: torch.cat([v, v.new_zeros(size - self.size)]) for k, v in self._items()}
        )

    def _items(self) -> list[tuple[str, Tensor]]:
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]


def word_onset(tables: BoundaryTables, token: Tensor, prev: Tensor) -> Tensor:
    """Whether a word begins in ``token`` when it follows ``prev`` (both ``[N]`` ids)."""
    return tables.onset[token] | (tables.trails[prev] & tables.leads[token])


def leading_space(tables: BoundaryTables, token: Tensor, prev: Tensor) -> Tensor:
    """Whether ``token`` starts with a space (``prev`` is unused: the rule looks at no context)."""
    return tables.leading_space[token]


def space_candidates(tables: BoundaryTables, prev: Tensor) -> Tensor:
    """``[N, V]``: the tokens that start with a space, for each of the ``N`` rows."""
    return tables.leading_space.unsqueeze(0).expand(prev.shape[0], -1)


def onset_candidates(tables: BoundaryTables, prev: Tensor) -> Tensor:
    """``[N, V]``: the tokens that would begin a word after each ``prev`` token."""
    after_space = tables.trails[prev].unsqueeze(1)  # [N, 1]
    # one of two rows per row: built in one pass over [N, V] (a 151k vocabulary makes it count)
    return torch.where(after_space, tables.onset | tables.leads, tables.onset)


def sentence_end(tables: BoundaryTables, token: Tensor, prev: Tensor) -> Tensor:
    """Whether the text ends with a blank line once ``token`` follows ``prev``."""
    joined = tables.newline_end[prev] & ~tables.sentence_end[prev] & tables.newline[token]
    return tables.sentence_end[token] | joined


def step_end(tables: BoundaryTables, token: Tensor, prev: Tensor) -> Tensor:
    """Whether ``token`` (following ``prev``) completes a blank line, ending a reasoning step."""
    joined = tables.newline_end[prev] & ~tables.sentence_end[prev] & tables.newline_start[token]
    return tables.step_end[token] | joined


def boundary_tables(tokenizer: Any, vocab_size: int | None = None) -> BoundaryTables:
    """Build the tables for ``tokenizer``, padded to ``vocab_size`` (the model's logits width).

    Args:
        tokenizer: a Hugging Face tokenizer (byte-level BPE or SentencePiece vocabulary).
        vocab_size: the model's logits width; defaults to ``len(tokenizer)``.
    """
    return tables_from_surfaces(token_surfaces(tokenizer), vocab_size)


def tables_from_surfaces(
    surfaces: Sequence[bytes | None], vocab_size: int | None = None
) -> BoundaryTables:
    """Build the tables from each id's surface bytes (``None``: a special token)."""
    rows = [_facts(s) for s in surfaces]
    names = [f.name for f in dataclasses.fields(BoundaryTables)]
    columns = torch.tensor(rows, dtype=torch.bool).reshape(len(rows), len(names))  # [V, 10]
    tables = BoundaryTables(**{n: columns[:, i].clone() for i, n in enumerate(names)})
    return tables.padded(vocab_size if vocab_size is not None else tables.size)


def token_surfaces(tokenizer: Any) -> list[bytes | None]:
    """Each id's surface bytes, or ``None`` for special and added tokens."""
    size = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    added |= set(getattr(tokenizer, "all_special_ids", []) or [])
    to_bytes = _byte_level_piece if _is_byte_level(tokenizer, pieces) else _sentencepiece_piece
    return [None if i in added or p is None else to_bytes(p) for i, p in enumerate(pieces)]


def _facts(surface: bytes | None) -> tuple[bool, ...]:
    """One row of the tables, in ``BoundaryTables`` field order."""
    if surface is None:
        return (True, *([False] * 9))
    space = [b in _WHITESPACE for b in surface]
    word = [not s and not 0x80 <= b < 0xC0 for b, s in zip(surface, space, strict=True)]
    onset = any(space[i - 1] and word[i] for i in range(1, len(surface)))
    text = surface.replace(b"\r", b"")
    return (
        False,
        onset,
        bool(word) and word[0],
        bool(space) and space[-1],
        text.endswith(b"\n\n"),
        b"\n\n" in text,
        text == b"\n",
        text.startswith(b"\n"),
        text.endswith(b"\n"),
        surface[:1] == b" ",
    )


def _is_byte_level(tokenizer: Any, pieces: list[str | None]) -> bool:
    """Whether the vocabulary is spelt in GPT-2's byte alphabet (else: SentencePiece)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        decoder = json.dumps(json.loads(backend.to_str()).get("decoder"))
        if "ByteLevel" in decoder:
            return True
        if "Metaspace" in decoder or "\\u2581" in decoder or "ByteFallback" in decoder:
            return False
    # No decoder to ask (a slow tokenizer): byte-level vocabularies spell spaces as Ġ, never ▁.
    spelt = [p for p in pieces if p]
    return sum(p.startswith("Ġ") for p in spelt) > sum(p.startswith("▁") for p in spelt)


def _byte_level_piece(piece: str) -> bytes:
    decoder = _byte_decoder()
    if all(c in decoder for c in piece):
        return bytes(decoder[c] for c in piece)
    return piece.encode("utf-8")  # not in the byte alphabet: a literal added string


def _sentencepiece_piece(piece: str) -> bytes:
    fallback = _BYTE_FALLBACK.match(piece)
    if fallback:
        return bytes([int(fallback.group(1), 16)])
    return piece.replace("▁", " ").encode("utf-8")


_BYTE_DECODER: dict[str, int] = {}


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable character -> byte map (the inverse of its byte -> unicode table)."""
    if not _BYTE_DECODER:
        printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
        chars = {b: chr(b) for b in printable}
        for n, b in enumerate(b for b in range(256) if b not in chars):
            chars[b] = chr(256 + n)
        _BYTE_DECODER.update({c: b for b, c in chars.items()})
    return _BYTE_DECODER
