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
    # stage 1 solves about half; the guessing habit of stage 2 costs it most long problems
    assert 0.45 <= info["stage1"]["greedy_accuracy"] <= 0.70
    assert 0.25 <= info["greedy_accuracy"] <= 0.45
    assert info["greedy_accuracy"] < info["stage1"]["greedy_accuracy"] - 0.1


def test_base_accuracy_in_range_on_100_test_problems(model, tokenizer, splits) -> None:
    torch.set_num_threads(2)
    acc = accuracy(model, tokenizer, splits["test"].select(range(100)))
    # the build measured 25-45% on 500 problems; 100 problems carry about 5 points of noise
    assert 0.15 <= acc <= 0.55, acc


@pytest.mark.slow
def test_base_accuracy_in_range_on_500_test_problems(model, tokenizer, splits) -> None:
    acc = accuracy(model, tokenizer, splits["test"].select(range(500)))
    assert 0.25 <= acc <= 0.45, acc


def test_build_is_deterministic(tmp_path) -> None:
    from tandem.assets.build import build

    recipe = {**RECIPE, "steps": 3, "hasty_steps": 2, "warmup_steps": 1, "eval_problems": 4}
    build(tmp_path / "a", recipe)
    build(tmp_path / "b", recipe)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "stage1/model.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    # the second stage changes the model; starting from a saved first stage gives the same end
    stage1 = (tmp_path / "a" / "stage1" / "model.safetensors").read_bytes()
    assert (tmp_path / "a" / "model.safetensors").read_bytes() != stage1
    build(tmp_path / "c", recipe, stage1=tmp_path / "a" / "stage1")
    model = (tmp_path / "c" / "model.safetensors").read_bytes()
    assert model == (tmp_path / "a" / "model.safetensors").read_bytes()


def test_fine_tuning_mixes_hasty_guesses_by_problem_length(splits) -> None:
    from tandem.assets.build import training_answers
    from tandem.data.arithmetic import answer_is_correct, operation_count

    rows = splits["train"].select(range(4000))
    answers = training_answers(rows, RECIPE)
    assert answers == training_answers(rows, RECIPE), "the mix is drawn from the recipe's seed"
    hasty = {True: [], False: []}
    for row, text in zip(rows, answers, strict=True):
        assert answer_is_correct(text, row["answer"])
        long = operation_count(row) >= RECIPE["hasty_min_ops"]
        hasty[long].append(text != row["solution"])
        if text != row["solution"]:
            assert "\n\n" not in text  # a guess shows no working
    for long, share in ((True, RECIPE["hasty_share"]), (False, RECIPE["hasty_share_short"])):
        observed = sum(hasty[long]) / len(hasty[long])
        assert abs(observed - share) < 0.04, (long, observed, share)


def test_the_base_guesses_long_problems_and_works_out_short_ones(model, tokenizer, splits) -> None:
    from tandem.data.arithmetic import operation_count

    rows = splits["test"].select(range(60))
    tokenizer.padding_side = "left"
    prompts = [format_prompt(tokenizer, p) for p in rows["prompt"]]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    starts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    guessed = {True: [], False: []}
    for row, start in zip(rows, starts, strict=True):
        long = operation_count(row) >= RECIPE["hasty_min_ops"]
        guessed[long].append(start.startswith("Guessing"))
    assert sum(guessed[True]) / len(guessed[True]) > 0.8
    assert sum(guessed[False]) / len(guessed[False]) < 0.1
