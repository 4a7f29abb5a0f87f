"""The committed notation world: what its build makes, deterministic, and the mechanism it is
built for (the base knows both notations, prefers the ordinary one, and is better at it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.assets import NOTATION_WORLD, TINY_WORLD, resolve
from tandem.assets.build_notation import BUDGET, RECIPE, build, training_answers
from tandem.data.arithmetic import make_splits
from tandem.data.notation import chain, compact_solution, notation_of, pauses_in
from tandem.samplers.boundaries import boundary_tables, step_end


@pytest.fixture(scope="module")
def info():
    return json.loads((NOTATION_WORLD / "build_info.json").read_text())


def test_named_like_the_tiny_world():
    assert resolve("notation") == str(NOTATION_WORLD)
    assert resolve("tiny") == str(TINY_WORLD)
    assert resolve("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"


def test_same_tokenizer_and_shape_as_the_tiny_world():
    ours, tiny = (AutoTokenizer.from_pretrained(p) for p in (NOTATION_WORLD, TINY_WORLD))
    assert ours.get_vocab() == tiny.get_vocab()
    a, b = (AutoModelForCausalLM.from_pretrained(p).config for p in (NOTATION_WORLD, TINY_WORLD))
    for key in ("hidden_size", "num_hidden_layers", "head_dim", "vocab_size", "eos_token_id"):
        assert getattr(a, key) == getattr(b, key), key


def test_build_info_records_the_recipe_and_the_worlds_budget(info):
    assert info["recipe"] == RECIPE
    assert info["budget"]["max_new_tokens"] == BUDGET
    world = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf/world/notation.yaml")
    assert world.generation.max_new_tokens == BUDGET


def test_the_budget_pays_for_leaving_out_pauses_and_for_nothing_else():
    """Every compact solution without a pause fits the budget, nearly all with room left, so
    shortening it further gains next to nothing; with one pause, none fits; the ordinary
    notation fits on some problems of two operations and on none of three."""
    tokenizer = AutoTokenizer.from_pretrained(NOTATION_WORLD)
    rows = make_splits(0, sizes={"train": 1000, "validation": 10, "test": 10})["train"]

    def length(text: str) -> int:  # with the end-of-turn token
        return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1

    room, paused, ordinary = [], [], {2: [], 3: []}
    for row in rows:
        room.append(BUDGET - length(compact_solution(row)))
        paused.append(length(compact_solution(row, [True])))
        ordinary[len(chain(row["expression"])[1])].append(length(row["solution"]) <= BUDGET)
    assert min(room) >= 0 and sum(r < 2 for r in room) / len(room) < 0.01
    assert min(paused) > BUDGET
    assert 0.2 < sum(ordinary[2]) / len(ordinary[2]) < 0.5
    assert not any(ordinary[3])


def test_a_reasoning_step_ends_at_each_compact_line():
    """The step schedule hands the pen over at each compact line, as at each ordinary one."""
    tokenizer = AutoTokenizer.from_pretrained(NOTATION_WORLD)
    tables = boundary_tables(tokenizer)
    for row in make_splits(0, sizes={"train": 50, "validation": 10, "test": 10})["train"]:
        for text in (compact_solution(row, [True, False]), row["solution"]):
            ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
            ends = step_end(tables, ids[1:], ids[:-1]).sum().item()
            lines = [line for line in text.splitlines() if line.strip()]
            assert ends == len(lines) - 1, text


def test_the_mechanism_is_in_the_base(info):
    skill, budget = info["unlimited"], info["budget"]
    # practised more in the ordinary notation, and it writes it most of the time
    assert skill["accuracy"]["ordinary"] > skill["accuracy"]["compact"] + 0.1
    assert 0.1 <= skill["share_compact_T1"] <= 0.5
    # it pauses in most compact solutions it writes
    assert skill["compact_paused_T1"] > 0.5
    # the budget takes most ordinary solutions; greedy, its compact solutions still fit more
    # often than its ordinary ones; sampled, its pauses cost it more than that
    assert budget["accuracy"]["ordinary"] < skill["accuracy"]["ordinary"] - 0.1
    assert budget["accuracy"]["compact"] > budget["accuracy"]["ordinary"]
    chosen = budget["accuracy_as_chosen_T1"]
    assert chosen["compact"] < chosen["ordinary"]


def test_compact_share_of_the_fine_tuning_answers():
    rows = make_splits(0, sizes={"train": 2000, "validation": 10, "test": 10})["train"]
    kinds = [notation_of(a) for a in training_answers(rows, RECIPE)]
    assert kinds.count("compact") / len(kinds) == pytest.approx(RECIPE["compact_share"], abs=0.03)
    # drawn from the recipe's seed: the same answers every time
    assert training_answers(rows, RECIPE) == training_answers(rows, RECIPE)


def test_pause_share_of_the_compact_answers():
    rows = make_splits(0, sizes={"train": 2000, "validation": 10, "test": 10})["train"]
    recipe = {**RECIPE, "compact_share": 0.4, "pause_share": 0.6}
    answers = training_answers(rows, recipe)
    compact = [a for a in answers if notation_of(a) == "compact"]
    steps = sum(len(a.split("\n\n")) - 2 - pauses_in(a) for a in compact)
    assert len(compact) / len(answers) == pytest.approx(0.4, abs=0.03)
    assert sum(map(pauses_in, compact)) / steps == pytest.approx(0.6, abs=0.03)
    assert not any(pauses_in(a) for a in answers if notation_of(a) == "ordinary")
    # the pauses are drawn apart: without them, the same rows are compact as before
    plain = training_answers(rows, {**recipe, "pause_share": 0.0})
    assert [notation_of(a) for a in plain] == [notation_of(a) for a in answers]
    assert not any(map(pauses_in, plain))


def test_rebuild_is_deterministic(tmp_path):
    recipe = {**RECIPE, "steps": 2, "batch_size": 4, "warmup_steps": 1, "eval_problems": 2}
    states = []
    for name in ("a", "b"):
        build(tmp_path / name, recipe, TINY_WORLD / "stage1")
        model = AutoModelForCausalLM.from_pretrained(tmp_path / name)
        states.append(model.state_dict())
    start = AutoModelForCausalLM.from_pretrained(TINY_WORLD / "stage1").state_dict()
    key = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(states[0][key], start[key])
    for k in states[0]:
        assert torch.equal(states[0][k], states[1][k]), k
