"""The notation world's compact notation: every number reversed, every answer still right."""

from __future__ import annotations

import re

import pytest

from tandem.data.arithmetic import answer_is_correct, make_splits
from tandem.data.notation import (
    COMPACT_MARK,
    PAUSE,
    chain,
    compact_solution,
    notation_of,
    pauses_in,
    reverse_digits,
)


@pytest.fixture(scope="module")
def rows():
    return make_splits(0, sizes={"train": 300, "validation": 10, "test": 10})["train"]


def test_reverse_digits():
    assert reverse_digits(120) == "021"
    assert reverse_digits("7") == "7"


def test_chain_reads_the_expression():
    assert chain("((50 + 62) * 3)") == (50, [("+", 62), ("*", 3)])
    with pytest.raises(ValueError, match="does not start with a number"):
        chain("(x + 1)")


def test_compact_lines_are_the_ordinary_steps_reversed(rows):
    for row in rows:
        text = compact_solution(row)
        assert notation_of(text) == "compact" and notation_of(row["solution"]) == "ordinary"
        assert answer_is_correct(text, row["answer"])
        lines = text.split("\n\n")[1:-1]
        # the ordinary solution's equations, in order, with every number read back reversed
        ordinary = re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", row["solution"])
        assert len(lines) == len(ordinary) > 0
        for line, (a, op, k, r) in zip(lines, ordinary, strict=True):
            ra, rop, rk, _, rr = line.split(" ")
            assert (ra[::-1], rop, rk[::-1], rr[::-1]) == (a, op, k, r)


def test_compact_refuses_an_inconsistent_row(rows):
    row = dict(rows[0], answer="-1")
    with pytest.raises(ValueError, match="gives"):
        compact_solution(row)


def test_mark_opens_the_compact_notation():
    assert notation_of(f"  {COMPACT_MARK}\n\n01 + 1 = 11") == "compact"
    assert notation_of(f"We begin with 3. {COMPACT_MARK}") == "ordinary"


def test_pause_lines_follow_the_chosen_steps_and_change_nothing_else(rows):
    for row in rows:
        plain = compact_solution(row).split("\n\n")
        steps = len(plain) - 2
        for pattern in ([True] * steps, [False] * steps, [i % 2 == 0 for i in range(steps)]):
            text = compact_solution(row, pattern)
            lines = text.split("\n\n")
            assert pauses_in(text) == lines.count(PAUSE) == sum(pattern)
            assert [line for line in lines if line != PAUSE] == plain
            assert answer_is_correct(text, row["answer"])
            # each right after a step the pattern chose
            followed, step = [], -1
            for line in lines[1:-1]:
                step += line != PAUSE
                followed += [step] if line == PAUSE else []
            assert followed == [j for j, on in enumerate(pattern) if on]


def test_pauses_in_counts_whole_pause_lines_only():
    assert pauses_in(f"05 + 26 = 211\n\n{PAUSE}\n\nSo \\boxed{{112}}.") == 1
    assert pauses_in(f"Sum.\n\n{PAUSE}\n\n{PAUSE}") == 2
    assert pauses_in(f"{PAUSE} 05 + 26 = 211") == 0
    assert pauses_in("") == 0
