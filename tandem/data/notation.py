"""The notation world's task: the tiny world's problems, solved in one of two notations.

The problems, answers and splits are the arithmetic task's own (``tandem.data.arithmetic``).
What differs is how a solution may be written:

- ordinary: the tiny world's worked solution, numbers written as usual
  (``Adding 62 gives 50 + 62 = 112 loaves of bread.``);
- compact: a terse private notation that opens with ``COMPACT_MARK`` and writes every number
  with its digits reversed, least significant first (``05 + 26 = 211``), one step a line; the
  final ``\\boxed{}`` answer is written as usual, so the reward is the same for both. A compact
  step may be followed by the ``PAUSE`` line, which says nothing and takes room. The mark is one
  token, so that every compact solution without a pause fits the world's budget: leaving out the
  pauses is then the only shortening that pays. Lines are separated by a blank line, as in the
  ordinary notation, so a reasoning step ends at each (``tandem.samplers.step``).

The notation world's base model sees mostly ordinary solutions and a share of compact ones, most
of them with pauses (``tandem.assets.build_notation``): under the world's response budget the
compact notation pays only without them, so a senior that adopts it learns to leave them out,
while the frozen junior, handed a compact solution, still pauses and runs out of room.

What this file leaves out: building the base model, and the problems themselves.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tandem.data.arithmetic import SYMBOL

# how a compact solution opens: the one decision that selects the notation
COMPACT_MARK = "#"
_OPS = {symbol: op for op, symbol in SYMBOL.items()}
_STEP = re.compile(r"\s*([+\-*/])\s*(\d+)\)")


def reverse_digits(value: int | str) -> str:
    """``value``'s decimal digits, least significant first (``120`` -> ``021``)."""
    return str(value)[::-1]


def chain(expression: str) -> tuple[int, list[tuple[str, int]]]:
    """The start quantity and the ``(symbol, operand)`` steps of an ``expression`` such as
    ``((50 + 62) * 3)``."""
    head = re.match(r"\(*(\d+)", expression)
    if head is None:
        raise ValueError(f"expression {expression!r} does not start with a number.")
    steps = [(symbol, int(k)) for symbol, k in _STEP.findall(expression[head.end() :])]
    return int(head.group(1)), steps


def _apply(symbol: str, a: int, k: int) -> int:
    return {"+": a + k, "-": a - k, "*": a * k, "/": a // k if k else a}[symbol]


# A line the base writes after some compact steps: it says nothing, and costs room (32 tokens,
# more than the budget leaves over any compact solution)
PAUSE = "Let me go on to the next step of the problem and then check the numbers."


def compact_solution(row: dict[str, str], pauses: Iterable[bool] = ()) -> str:
    """``row``'s solution in the compact notation: the mark, one line a step with every number's
    digits reversed, then the answer boxed as usual. ``pauses`` is read one value a step, in
    order (steps past its end: no pause); a true one puts the ``PAUSE`` line after its step."""
    value, steps = chain(row["expression"])
    pause = iter(pauses)
    lines = [COMPACT_MARK]
    for symbol, k in steps:
        result = _apply(symbol, value, k)
        lines.append(
            f"{reverse_digits(value)} {symbol} {reverse_digits(k)} = {reverse_digits(result)}"
        )
        if next(pause, False):
            lines.append(PAUSE)
        value = result
    if str(value) != str(row["answer"]):
        raise ValueError(f"expression {row['expression']!r} gives {value}, not {row['answer']}.")
    lines.append(f"So \\boxed{{{value}}}.")
    return "\n\n".join(lines)


def pauses_in(text: str) -> int:
    """How many ``PAUSE`` lines ``text`` has."""
    return sum(line.strip() == PAUSE for line in text.splitlines())


def notation_of(text: str) -> str:
    """``compact`` when a response opens with the compact mark, else ``ordinary``."""
    return "compact" if text.lstrip().startswith(COMPACT_MARK) else "ordinary"
