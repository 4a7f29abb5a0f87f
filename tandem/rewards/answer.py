"""What a parsed answer is: a sympy expression, or one of a few structures around expressions.

Scalars are plain ``sympy.Expr`` values. The structures keep what the written answer meant, which
is what equivalence depends on: a ``Point`` is ordered, a ``Bag`` is not, an ``Interval`` keeps
its bracket types, a ``Relation`` keeps its operators. ``Parsed`` wraps the value with the flags
the comparison needs (a percent sign, a decimal literal) and the normalised source text.

What this file leaves out: building these (``parse``) and comparing them (``equivalence``).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy


class ParseError(ValueError):
    """The text is not an answer we can read (the verdict is ``unparsable``)."""


class Refused(ParseError):
    """The answer would be too costly to evaluate (a huge power, factorial or literal)."""


@dataclass(frozen=True)
class Point:
    """An ordered tuple ``(a, b, ...)``; ``(a, b)`` may also be read as an open interval."""

    items: tuple[Answer, ...]
    may_be_interval: bool = False


@dataclass(frozen=True)
class Bag:
    """An unordered collection: ``\\{a, b\\}`` (``braced``) or a bare list ``a, b``."""

    items: tuple[Answer, ...]
    braced: bool = False


@dataclass(frozen=True)
class Interval:
    """A real interval with its bracket types; infinite ends are always open."""

    lo: sympy.Expr
    hi: sympy.Expr
    left_closed: bool
    right_closed: bool


@dataclass(frozen=True)
class IntervalUnion:
    """``A \\cup B \\cup ...`` of intervals and finite sets, in any order."""

    parts: tuple[Answer, ...]


@dataclass(frozen=True)
class SetDifference:
    """``A \\setminus B``: the set ``whole`` without the set ``removed``."""

    whole: Answer
    removed: Answer


@dataclass(frozen=True)
class Matrix:
    """A matrix (or vector) written with a ``matrix`` environment, row by row."""

    rows: tuple[tuple[sympy.Expr, ...], ...]


@dataclass(frozen=True)
class Relation:
    """A chain ``t0 op0 t1 op1 t2 ...`` with ops among ``= != < <= > >=``."""

    terms: tuple[sympy.Expr, ...]
    ops: tuple[str, ...]

    def assigned_value(self) -> sympy.Expr | None:
        """The value an equation gives, or ``None`` when it is not an assignment.

        ``5`` for ``x = 5`` (or ``5 = x``, ``x = 2y = 5``), and for ``a + b = 5``, ``abc = 5``:
        a left side in variables with no constant term names the quantity asked for, and the
        number on the right is its value. ``x + 1 = 5`` is not an assignment (it is a step
        before solving for ``x``), nor is ``y = 2x + 3``, whose right side is not a number.
        """
        if set(self.ops) != {"="}:
            return None
        if isinstance(self.terms[0], sympy.Symbol):
            return self.terms[-1]
        if len(self.terms) != 2:
            return None
        if isinstance(self.terms[1], sympy.Symbol):
            return self.terms[0]
        lhs, rhs = self.terms
        if lhs.free_symbols and not rhs.free_symbols and lhs.as_coeff_Add()[0] == 0:
            return rhs
        return None


@dataclass(frozen=True)
class Text:
    """A word answer (a name, a day, ``yes``), lower-cased with spaces removed."""

    text: str


@dataclass(frozen=True)
class Choice:
    """A multiple-choice letter, ``(C)`` or ``\\textbf{(C)}\\ 12``, with the value after it.

    Attributes:
        letter: the upper-case letter.
        value: what follows the letter (``12``), or ``None``.
    """

    letter: str
    value: Answer | None = None


@dataclass(frozen=True)
class BaseNumber:
    """An integer written in another base, such as ``1011_2``."""

    digits: str
    base: int

    @property
    def value(self) -> int:
        return int(self.digits, self.base)


# A scalar answer is a plain sympy expression; everything else is one of the structures above.
Answer = (
    sympy.Expr
    | Point
    | Bag
    | Interval
    | IntervalUnion
    | SetDifference
    | Matrix
    | Relation
    | Text
    | Choice
    | BaseNumber
)


@dataclass(frozen=True)
class Parsed:
    """A parsed answer and what the comparison needs to know about how it was written.

    Attributes:
        value: the answer.
        source: the normalised text, compared verbatim before anything else.
        percent: it ended in a percent sign (``25\\%`` may mean 25 or 0.25).
        inexact: it contains a decimal literal, so numbers compare within a tolerance.
    """

    value: Answer
    source: str
    percent: bool = False
    inexact: bool = False
