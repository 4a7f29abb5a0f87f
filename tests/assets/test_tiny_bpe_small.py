"""The committed second junior, ``tiny-bpe-small``: what its build makes, and a partner that
writes the task's words in a vocabulary of its own."""

from __future__ import annotations

import json

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tandem.assets import TINY_BPE_SMALL, TINY_WORLD, resolve
from tandem.assets.build_junior import RECIPE, build
from tandem.assets.tokenizer import train_tokenizer
from tandem.data.arithmetic import make_splits
from tandem.data.prompts import format_prompt, user_message


def test_the_name_resolves_to_the_folder() -> None:
    assert resolve("tiny-bpe-small") == str(TINY_BPE_SMALL)
    assert resolve("tiny") == str(TINY_WORLD)


def test_the_tokenizer_is_what_the_recipe_trains() -> None:
    rows = make_splits(RECIPE["seed"])["train"]
    texts = (
        f"user\n{user_message(p)}\nassistant\n{s}"
        for p, s in zip(rows["prompt"], rows["solution"], strict=True)
    )
    fresh = train_tokenizer(texts, vocab_size=RECIPE["vocab_size"])
    shipped = AutoTokenizer.from_pretrained(TINY_BPE_SMALL)
    assert fresh.get_vocab() == shipped.get_vocab()
    assert len(shipped) == RECIPE["vocab_size"] < len(AutoTokenizer.from_pretrained(TINY_WORLD))


def test_the_model_is_the_recipes_and_smaller_than_the_base() -> None:
    config, base = (
        AutoConfig.from_pretrained(TINY_BPE_SMALL),
        AutoConfig.from_pretrained(TINY_WORLD),
    )
    for key in ("hidden_size", "num_hidden_layers", "head_dim", "intermediate_size"):
        assert getattr(config, key) == RECIPE[key], key
    assert config.hidden_size < base.hidden_size and config.vocab_size < base.vocab_size
    info = json.loads((TINY_BPE_SMALL / "build_info.json").read_text())
    assert info["recipe"] == RECIPE


def test_it_writes_the_tasks_words() -> None:
    tok = AutoTokenizer.from_pretrained(TINY_BPE_SMALL)
    model = AutoModelForCausalLM.from_pretrained(TINY_BPE_SMALL).eval()
    row = make_splits(0, sizes={"train": 1, "validation": 1, "test": 1})["test"][0]
    ids = tok(format_prompt(tok, row["prompt"]), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=60, do_sample=False)
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    # a worked solution's shape: words, numbers, an operation
    assert any(op in text for op in ("+", "-", "*")) and "=" in text, text


def test_rebuild_is_deterministic_and_trains_the_committed_tokenizer(tmp_path) -> None:
    """Two short builds give the same tokenizer and the same weights tensor for tensor, and the
    tokenizer (which the number of steps does not touch) is the committed one."""
    recipe = {**RECIPE, "steps": 2, "batch_size": 4, "warmup_steps": 1, "eval_problems": 2}
    states, vocabs = [], []
    for name in ("a", "b"):
        build(tmp_path / name, recipe)
        states.append(AutoModelForCausalLM.from_pretrained(tmp_path / name).state_dict())
        vocabs.append(AutoTokenizer.from_pretrained(tmp_path / name).get_vocab())
    assert vocabs[0] == vocabs[1] == AutoTokenizer.from_pretrained(TINY_BPE_SMALL).get_vocab()
    assert states[0].keys() == states[1].keys()
    for k in states[0]:
        assert torch.equal(states[0][k], states[1][k]), k
