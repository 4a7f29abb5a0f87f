"""Checked arithmetic for the parser: refuse what would be too costly *before* sympy evaluates it.

sympy evaluates eagerly: ``Pow(9, 9**9)`` starts building a number of a billion digits, and no
exception can interrupt C code holding the GIL. So each power, factorial, binomial and literal
is sized first, from logarithms computed at low precision, and refused (``Refused``) above a limit
no real answer reaches. The worker's deadline stays the last resort for what slips through.
Operands must be scalars; arithmetic on a tuple or a set is a ``ParseError``.

What this file leaves out: parsing and comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import mpmath
import sympy

from tandem.rewards.answer import ParseError, Refused

# Decimal digits in one literal (2^1000 has 302).
MAX_DIGITS = 1000
# log2 of the magnitude of a numeric power: 100k bits is 30k digits, computed in microseconds.
MAX_BITS = 100_000
# Exponent of a symbolic base: (x+1)^5000 expanded is already too much work.
MAX_SYMBOLIC_EXPONENT = 1000
# A root of an exact number this large makes sympy search for perfect powers for minutes.
MAX_ROOT_BITS = 4000
MAX_FACTORIAL = 1000
MAX_BINOMIAL = 100_000


def scalar(x: Any) -> sympy.Expr:
    """``x`` if it is a sympy expression; else ``ParseError`` (arithmetic on a structure)."""
    if not isinstance(x, sympy.Expr):
        raise ParseError(f"arithmetic on a {type(x).__name__}")
    return x


def add(a: Any, b: Any) -> sympy.Expr:
    return scalar(a) + scalar(b)


def neg(a: Any) -> sympy.Expr:
    return -scalar(a)


def mul(a: Any, b: Any) -> sympy.Expr:
    return scalar(a) * scalar(b)


def div(a: Any, b: Any) -> sympy.Expr:
    return scalar(a) / scalar(b)


def literal(text: str) -> sympy.Rational:
    """An exact rational for a decimal literal (``0.5`` is 1/2; ``1.5e3`` is 1500)."""
    mantissa, _, exponent = text.lower().partition("e")
    if sum(c.isdigit() for c in mantissa) > MAX_DIGITS or abs(int(exponent or 0)) > MAX_DIGITS:
        raise Refused(f"numeric literal {text[:40]!r}... is too large")
    return sympy.Rational(text)


def log2_abs(x: sympy.Expr) -> float:
    """log2 |x| for a number, at 15 digits; ``inf`` for infinities, ``-inf`` for zero."""
    value = x.evalf(15)
    if value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        return math.inf
    re, im = value.as_real_imag()
    if not (re.is_Number and im.is_Number):
        return math.inf  # cannot bound it, so do not evaluate it
    mag = mpmath.hypot(mpmath.mpf(sympy.Float(re, 15)._mpf_), mpmath.mpf(sympy.Float(im, 15)._mpf_))
    return -math.inf if mag == 0 else float(mpmath.log(mag, 2))


def power(base: Any, exp: Any) -> sympy.Expr:
    """``base ** exp``, refused when the result would exceed ``MAX_BITS`` bits (or ``1/2**MAX``)."""
    base, exp = scalar(base), scalar(exp)
    if exp.is_number and base.is_number:
        if base not in (0, 1, -1):
            bits = abs(log2_abs(base))
            size = 2.0 ** log2_abs(exp) if log2_abs(exp) < 1024 else math.inf
            if bits > 0 and size * bits > MAX_BITS:
                raise Refused("power too large to evaluate")
            if not exp.is_integer and bits > MAX_ROOT_BITS:
                raise Refused("root of a number too large to evaluate")
    elif exp.is_number and 2.0 ** min(log2_abs(exp), 1023) > MAX_SYMBOLIC_EXPONENT:
        raise Refused("symbolic power with a huge exponent")
    return sympy.Pow(base, exp)


def root(radicand: Any, index: Any) -> sympy.Expr:
    return power(radicand, div(sympy.Integer(1), index))


def factorial(n: Any) -> sympy.Expr:
    n = scalar(n)
    if n.is_number and (log2_abs(n) > math.log2(MAX_FACTORIAL)):
        raise Refused("factorial too large to evaluate")
    return sympy.factorial(n)


def binomial(n: Any, k: Any) -> sympy.Expr:
    n, k = scalar(n), scalar(k)
    if n.is_number and log2_abs(n) > math.log2(MAX_BINOMIAL):
        raise Refused("binomial too large to evaluate")
    return sympy.binomial(n, k)


def apply(fn: Callable[..., Any], *args: Any) -> sympy.Expr:
    """``fn(*args)`` on scalars; sympy's own errors on odd input become ``ParseError``."""
    values = [scalar(a) for a in args]
    try:
        return fn(*values)
    except (TypeError, ValueError, ArithmeticError, AttributeError, NotImplementedError) as err:
        raise ParseError(f"{getattr(fn, '__name__', fn)} failed: {err}") from err


def determinant(rows: Sequence[Sequence[Any]]) -> sympy.Expr:
    """The determinant of a square matrix written with ``vmatrix``."""
    if len(rows) != len(rows[0]):
        raise ParseError(f"a determinant needs a square matrix, got {len(rows)}x{len(rows[0])}")
    return sympy.Matrix([[scalar(c) for c in row] for row in rows]).det()
