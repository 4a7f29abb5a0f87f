"""The committed tiny world: tokenizer and base model load, are what the build makes, and work."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.assets import TINY_WORLD
from tandem.assets.build import RECIPE, accuracy, build_tokenizer
from tandem.assets.tokenizer import IM_END, IM_START, PAD
from tandem.data.arithmetic import make_splits
from tandem.data.prompts import format_prompt

VARIED = [
    "Ava has 37 apples. She buys 4 more.\n\nThe answer is \\boxed{41}.",
    "x^2 + y^2 = z^2, \\frac{1}{2} and \\sqrt{3}",
    "def f(x):\n    return x * 2  # doubled\n",
    "naïve café, 東京, emoji 🙂🚀, tabs\tand   spaces",
    "\n\n\n  leading and trailing  \n",
    "1234567890 3.14159 -42",
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY_WORLD)


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(TINY_WORLD)


@pytest.fixture(scope="module")
def splits():
    return make_splits(RECIPE["seed"])


def test_tokenizer_round_trip(tokenizer, splits) -> None:
    texts = VARIED + splits["test"]["solution"][:50] + splits["test"]["prompt"][:50]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text


def test_word_onsets_carry_the_space_marker(tokenizer) -> None:
    tokens = tokenizer.tokenize("Ava has apples and buys more")
    assert tokens[0] == "Ava"
    # every word after a space starts a token with the marker, and frequent words are whole
    assert tokens[1:] == ["Ġhas", "Ġapples", "Ġand", "Ġbuys", "Ġmore"]
    inner = tokenizer.tokenize(" unbelievably")
    assert inner[0].startswith("Ġ") and not any(t.startswith("Ġ") for t in inner[1:])


def test_numbers_split_into_single_digits(tokenizer) -> None:
    assert tokenizer.tokenize(" 2048") == ["Ġ", "2", "0", "4", "8"]
    vocab = tokenizer.get_vocab()
    multi_digit = [t for t in vocab if sum(c.isdigit() for c in t) > 1]
    assert multi_digit == []


def test_step_end_tokens_exist(tokenizer) -> None:
    tokens = tokenizer.tokenize("There are 5 apples.\n\nThe")
    # a step's closing period and the blank line are one token, as in Qwen's vocabulary
    assert tokens[-2:] == [".ĊĊ", "The"]


def test_special_tokens_and_chat_template(tokenizer) -> None:
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == PAD
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    for special in (PAD, IM_START, IM_END):
        assert tokenizer.tokenize(special) == [special]
    prompt = format_prompt(tokenizer, "What is 2 + 2?")
    assert prompt == (
        "<|im_start|>user\nWhat is 2 + 2?\nPut the final answer in \\boxed{}.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tokenizer_is_what_the_build_makes(tokenizer, splits) -> None:
    rebuilt = build_tokenizer(splits["train"])
    assert rebuilt.get_vocab() == tokenizer.get_vocab()


def test_vocabulary_is_not_a_few_hundred_entries(tokenizer) -> None:
    assert len(tokenizer) > 1000


def test_model_config_is_what_the_build_makes(model, tokenizer) -> None:
    config = model.config
    assert type(model).__name__ == "Qwen3ForCausalLM"
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
    ):
        assert getattr(config, key) == RECIPE[key], key
    assert config.head_dim >= 32, "vLLM serves only head_dim >= 32"
    assert config.vocab_size == len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id
    eos = model.generation_config.eos_token_id
    assert tokenizer.eos_token_id in (eos if isinstance(eos, list) else [eos])


def test_build_info_records_the_recipe_and_accuracy() -> None:
    info = json.loads((TINY_WORLD / "build_info.json").read_text())
    assert {k: info["recipe"][k] for k in RECIPE if k != "probe_every"} == {
        k: v for k, v in RECIPE.items() if k != "probe_every"
    }
    assert info["eval_problems"] >= 500
    assert 0.45 <= info["greedy_accuracy"] <= 0.70


def test_base_accuracy_in_range_on_100_test_problems(model, tokenizer, splits) -> None:
    torch.set_num_threads(2)
    acc = accuracy(model, tokenizer, splits["test"].select(range(100)))
    # the build measured 45-70% on 500 problems; 100 problems carry about 5 points of noise
    assert 0.35 <= acc <= 0.80, acc


@pytest.mark.slow
def test_base_accuracy_in_range_on_500_test_problems(model, tokenizer, splits) -> None:
    acc = accuracy(model, tokenizer, splits["test"].select(range(500)))
    assert 0.45 <= acc <= 0.70, acc


def test_build_is_deterministic(tmp_path) -> None:
    from tandem.assets.build import build

    recipe = {**RECIPE, "steps": 3, "warmup_steps": 1, "eval_problems": 4}
    build(tmp_path / "a", recipe)
    build(tmp_path / "b", recipe)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
