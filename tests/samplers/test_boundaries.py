"""Boundary tables on byte-level BPE (tiny world, Qwen3) and SentencePiece vocabularies."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tandem.samplers.boundaries import (
    boundary_tables,
    sentence_end,
    step_end,
    token_surfaces,
    word_onset,
)

# Fields in BoundaryTables order, for readable expectations.
FIELDS = (
    "special",
    "onset",
    "leads",
    "trails",
    "sentence_end",
    "step_end",
    "newline",
    "newline_start",
    "newline_end",
)

TEXTS = [
    "Ava has 12 apples.\n\nThen she buys 3 more, so 12 + 3 = 15.\n\nThe answer is \\boxed{15}.",
    "  Two  spaces, a\ttab; (parens) and x=5*y.\nNew line.\n\n\nThree newlines.",
    "Naïve café: 你好世界, emoji 🙂 and math $\\frac{1}{2}$ \\(x^2\\) end.\r\n\r\nCRLF.",
]


def facts(tables, token_id: int) -> dict[str, bool]:
    return {f: bool(getattr(tables, f)[token_id]) for f in FIELDS}


def expect(**true: bool) -> dict[str, bool]:
    return {f: true.get(f, False) for f in FIELDS}


def word_starts(data: bytes) -> list[int]:
    """Oracle: byte positions where a word begins (a word byte right after whitespace)."""
    space = [b in b" \t\n\r\x0b\x0c" for b in data]
    word = [not s and not 0x80 <= b < 0xC0 for b, s in zip(data, space, strict=True)]
    return [i for i in range(1, len(data)) if space[i - 1] and word[i]]


_BUILT: dict[int, tuple] = {}


def built(tokenizer):
    """Tables and surfaces, built once per tokenizer (Qwen's take a second)."""
    if id(tokenizer) not in _BUILT:
        _BUILT[id(tokenizer)] = (boundary_tables(tokenizer), token_surfaces(tokenizer), tokenizer)
    return _BUILT[id(tokenizer)][:2]


def check_against_text(tokenizer, text: str, prefix: str = "") -> int:
    """Compare the table rules with oracles computed on the text's own bytes.

    ``prefix`` is what the tokenizer adds in front (SentencePiece's dummy space).
    """
    tables, surfaces = built(tokenizer)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    data = b"".join(surfaces[i] for i in ids)
    assert data == (prefix + text).encode("utf-8"), "surfaces must spell the text back exactly"
    ends = torch.tensor([len(surfaces[i]) for i in ids]).cumsum(0).tolist()
    starts = [0, *ends[:-1]]
    begun = set(word_starts(data))
    token, prev = torch.tensor(ids[1:]), torch.tensor(ids[:-1])
    got = word_onset(tables, token, prev).tolist()
    want = [any(p in begun for p in range(s, e)) for s, e in zip(starts[1:], ends[1:], strict=True)]
    assert got == want
    plain = data.replace(b"\r", b"")
    # a blank line is completed where a run of newlines reaches two
    blanks = [k for k in range(1, len(plain)) if plain[k - 1 : k + 1] == b"\n\n"]
    blanks = [k for k in blanks if k < 2 or plain[k - 2] != 0x0A]
    lengths = [len(surfaces[i].replace(b"\r", b"")) for i in ids]
    ends = torch.tensor(lengths).cumsum(0).tolist()
    for j in range(1, len(ids)):
        one, two = torch.tensor([ids[j]]), torch.tensor([ids[j - 1]])
        completes = any(ends[j] - lengths[j] <= k < ends[j] for k in blanks)
        assert bool(step_end(tables, one, two)) == completes, (j, plain[: ends[j]][-12:])
        mine = surfaces[ids[j]].replace(b"\r", b"")
        assert bool(sentence_end(tables, one, two)) == (completes and mine.endswith(b"\n")), j
    return sum(want) + len(blanks)


@pytest.mark.parametrize("text", TEXTS)
def test_tiny_rules_match_the_text(tiny_tokenizer, text):
    if "你" in text:  # the tiny world's vocabulary spells these in partial-UTF-8 byte tokens
        assert any(b >= 0x80 for s in token_surfaces(tiny_tokenizer) if s for b in s)
    # the tiny vocabulary spells \r\n\r\n as four one-byte tokens, which one token of
    # look-back cannot join (see tandem.samplers.boundaries); Qwen's has a token for it
    assert check_against_text(tiny_tokenizer, text.replace("\r\n", "\n")) > 3


@pytest.mark.parametrize("text", TEXTS)
def test_qwen_rules_match_the_text(qwen_tokenizer, text):
    assert check_against_text(qwen_tokenizer, text) > 3


def test_tiny_named_tokens(tiny_tokenizer):
    t = boundary_tables(tiny_tokenizer)
    ids = tiny_tokenizer.convert_tokens_to_ids
    assert facts(t, ids("Ġapples")) == expect(onset=True)
    assert facts(t, ids("Ġ=")) == expect(onset=True)
    assert facts(t, ids("boxed")) == expect(leads=True)
    assert facts(t, ids("5")) == expect(leads=True)
    assert facts(t, ids("Ġ")) == expect(trails=True)
    assert facts(t, ids("Ċ")) == expect(
        trails=True, newline=True, newline_start=True, newline_end=True
    )
    assert facts(t, ids(".ĊĊ")) == expect(
        leads=True, trails=True, sentence_end=True, step_end=True, newline_end=True
    )
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert facts(t, ids(special)) == expect(special=True)


def test_qwen_named_tokens(qwen_tokenizer):
    tables, surfaces = built(qwen_tokenizer)
    t = tables.padded(151936)  # Qwen3's logits width
    assert boundary_tables(qwen_tokenizer, vocab_size=151936).onset.equal(t.onset)
    ids = qwen_tokenizer.convert_tokens_to_ids
    assert t.size == 151936
    assert facts(t, ids("Ġthe")) == expect(onset=True)
    assert facts(t, ids("the")) == expect(leads=True)
    assert facts(t, ids("Ġ\\")) == expect(onset=True)
    assert facts(t, ids("5")) == expect(leads=True)
    assert facts(t, ids(".")) == expect(leads=True)
    assert facts(t, ids("Ġ")) == expect(trails=True)
    assert facts(t, ids("ĊĊ")) == expect(
        trails=True, sentence_end=True, step_end=True, newline_start=True, newline_end=True
    )
    assert facts(t, ids(".ĊĊ")) == expect(
        leads=True, trails=True, sentence_end=True, step_end=True, newline_end=True
    )
    assert facts(t, ids("ĠĊĊ")) == expect(
        trails=True, sentence_end=True, step_end=True, newline_end=True
    )
    # carriage returns are ignored: \r\n\r\n is a blank line
    assert facts(t, ids("čĊčĊ")) == expect(
        trails=True, sentence_end=True, step_end=True, newline_start=True, newline_end=True
    )
    # partial UTF-8: 你 is e4 bd a0; "ä½" holds its first two bytes (a lead byte first)
    assert facts(t, ids("ä½")) == expect(leads=True)
    tail = next(i for i, s in enumerate(surfaces) if s and len(s) == 1 and 0x80 <= s[0] < 0xC0)
    assert facts(t, tail) == expect()
    for special in ("<|endoftext|>", "<|im_end|>", "<think>", "<tool_call>"):
        assert facts(t, ids(special)) == expect(special=True)
    assert not any(getattr(t, f)[151669:].any() for f in FIELDS)


def test_tables_widen_but_never_narrow(tiny_tokenizer):
    n = len(tiny_tokenizer)
    wide = boundary_tables(tiny_tokenizer, vocab_size=n + 10)
    assert wide.size == n + 10 and not wide.onset[n:].any() and not wide.special[n:].any()
    with pytest.raises(ValueError, match="cannot be narrowed"):
        boundary_tables(tiny_tokenizer, vocab_size=n - 1)


def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """A Llama-2-style vocabulary: ▁ for spaces, <0xNN> byte fallback, no byte alphabet."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "▁t", "he", "▁the", "▁cat", "t", "h", "e", "c", "a", ".", "5", "▁5"]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "c"), ("▁c", "a")]
    merges = [m for m in merges if "".join(m) in vocab]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def test_sentencepiece_vocabulary():
    sp = sentencepiece_tokenizer()
    t = boundary_tables(sp)
    ids = sp.convert_tokens_to_ids
    assert facts(t, ids("▁the")) == expect(onset=True)
    assert facts(t, ids("he")) == expect(leads=True)
    assert facts(t, ids("▁")) == expect(trails=True)
    newline = ids("<0x0A>")
    assert facts(t, newline) == expect(
        trails=True, newline=True, newline_start=True, newline_end=True
    )
    assert facts(t, ids("<0xBD>")) == expect()  # a lone continuation byte begins nothing
    assert facts(t, ids("</s>")) == expect(special=True)
    # "\n\n" is two byte tokens here: the second one ends the sentence and the step
    nl = torch.tensor([newline])
    assert sentence_end(t, nl, nl) and step_end(t, nl, nl)
    assert not sentence_end(t, nl, torch.tensor([ids("▁the")]))
    # a word after a newline byte begins at its first byte
    assert word_onset(t, torch.tensor([ids("he")]), nl)
    assert check_against_text(sp, "the cat.\n\nthe 5 cat", prefix=" ") > 3
