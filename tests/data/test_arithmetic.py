"""The tiny world's task: deterministic, disjoint splits, answers that check out."""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

import pytest

from tandem.data.arithmetic import Difficulty, answer_is_correct, make_splits

SIZES = {"train": 2000, "validation": 200, "test": 300}


@pytest.fixture(scope="module")
def splits():
    return make_splits(seed=7, sizes=SIZES)


def evaluate(expression: str) -> Fraction:
    """Recompute an expression with exact fractions, independently of the generator."""
    ops = {
        ast.Add: operator.add,
        ast.Sub: operator.sub,
        ast.Mult: operator.mul,
        ast.Div: operator.truediv,
    }

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        raise AssertionError(f"unexpected node {ast.dump(node)}")

    return walk(ast.parse(expression, mode="eval").body)


def test_same_seed_same_splits_other_seed_other_splits(splits) -> None:
    again = make_splits(seed=7, sizes=SIZES)
    for name in SIZES:
        assert splits[name].to_list() == again[name].to_list()
    other = make_splits(seed=8, sizes=SIZES)
    assert other["test"]["prompt"] != splits["test"]["prompt"]


def test_sizes_and_columns(splits) -> None:
    for name, size in SIZES.items():
        assert splits[name].num_rows == size
        assert {"prompt", "answer", "solution", "expression"} <= set(splits[name].column_names)


def test_splits_never_share_a_problem(splits) -> None:
    seen: dict[str, str] = {}
    for name in SIZES:
        for key in ("prompt", "expression"):
            values = set(splits[name][key])
            assert len(values) == splits[name].num_rows or key == "prompt"
            for other, other_values in seen.items():
                assert not values & other_values, f"{name} and {other} share a {key}"
        seen[name] = set(splits[name]["expression"])
    prompts = [set(splits[n]["prompt"]) for n in SIZES]
    assert not (prompts[0] & prompts[1]) and not (prompts[0] & prompts[2])
    assert not (prompts[1] & prompts[2])


def test_every_answer_recomputed_independently(splits) -> None:
    for name in SIZES:
        for row in splits[name]:
            value = evaluate(row["expression"])
            assert value.denominator == 1 and value > 0, row
            assert str(value.numerator) == row["answer"], row
            # every equation written in the solution is true
            for a, op, b, c in re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", row["solution"]):
                assert evaluate(f"{a} {op} {b}") == int(c), row["solution"]


def test_solution_steps_and_boxed_answer(splits) -> None:
    for row in splits["test"]:
        steps = row["solution"].split("\n\n")
        assert len(steps) >= 4, "start, at least two operations, conclusion"
        assert row["solution"].endswith(f"\\boxed{{{row['answer']}}}.")
        assert answer_is_correct(row["solution"], row["answer"])
        assert not answer_is_correct(row["solution"], str(int(row["answer"]) + 1))


def test_difficulty_knob_changes_problems() -> None:
    easy = make_splits(
        0, {"train": 50}, Difficulty(min_ops=1, max_ops=1, digits=1, operations=("add",))
    )
    for row in easy["train"]:
        assert row["expression"].count("+") == 1 and "*" not in row["expression"]
    hard = make_splits(0, {"train": 200}, Difficulty(min_ops=4, max_ops=4, digits=3))
    assert all(row["expression"].count("(") == 4 for row in hard["train"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_ops": 0}, "min_ops"),
        ({"min_ops": 3, "max_ops": 2}, "max_ops"),
        ({"operations": ("pow",)}, "unknown: \\['pow'\\]"),
        ({"max_factor": 1}, "max_factor"),
    ],
)
def test_bad_difficulty_is_named(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        Difficulty(**kwargs)


def test_too_many_rows_for_the_space_fails_clearly() -> None:
    tiny = Difficulty(min_ops=1, max_ops=1, digits=1, operations=("add",))
    with pytest.raises(ValueError, match="distinct problems"):
        make_splits(0, {"train": 5000}, tiny)
