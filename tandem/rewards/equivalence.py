r"""Whether a parsed response and a parsed gold answer are the same mathematical object.

Numbers: exact rationals compare exactly; other numbers are evaluated to 60 digits and compared
with a *relative* tolerance, so 1/2^98 and 1/2^99 stay different. The tolerance is ``rel_tol``
(default 1e-9) only when a side was written with a decimal literal; between exact expressions
(``\\sqrt{8}`` vs ``2\\sqrt{2}``) it is 1e-30, i.e. equality up to evaluation noise.
Expressions with variables: equal if they agree at fixed probe points (numerical identity
testing, which also catches branch differences such as ``sqrt(x^2)`` vs ``x``), with
``sympy.simplify`` as the fallback when the probes are undefined.
Structures: tuples ordered, sets and bare lists unordered, intervals by ends and bracket types
(unions in any order, after sympy's canonical merge), matrices elementwise, equations up to a
non-zero factor, inequalities up to a positive one; ``x = 5`` answers ``5``, and so does
``a + b = 5`` (``Relation.assigned_value``); a one-variable inequality answers an interval, and
``\mathbb{R} \setminus \{0\}``, ``(-\infty, 0) \cup (0, \infty)`` and ``x \ne 0`` are one set.
Multiple choice: letters compare without case (``c`` answers ``(C)``), and ``(C)\ 12`` answers
either ``C`` or ``12``. Text answers compare without case or spaces.

What this file leaves out: parsing, and the time limit (a comparison may be slow; the worker pool
bounds it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import mpmath
import sympy

from tandem.rewards.answer import (
    Answer,
    Bag,
    BaseNumber,
    Choice,
    Interval,
    IntervalUnion,
    Matrix,
    Parsed,
    Point,
    Relation,
    SetDifference,
    Text,
)

PRECISION = 60
EXACT_REL_TOL = 1e-30
# Irregular values in both signs, so no probe lands on a root or a branch cut by accident.
_PROBES = (0.5377, -1.3499, 2.7694, -0.8622, 1.8339, -2.2588, 0.3188, 3.5784, -0.4336, 1.4090)
_MIN_PROBES = 3


def answers_match(response: Parsed, gold: Parsed, rel_tol: float = 1e-9) -> bool:
    """Whether ``response`` answers ``gold``. Does not raise on odd input: it says ``False``."""
    if response.source == gold.source:
        return True
    r, g = response.value, gold.value
    if isinstance(g, BaseNumber) or isinstance(r, BaseNumber):
        return _based_match(response, gold)
    comparer = _Comparer(rel_tol if response.inexact or gold.inexact else EXACT_REL_TOL)
    if comparer.match(r, g):
        return True
    # ``25\%`` may be written for 25 or for 0.25; only a one-sided percent sign is ambiguous.
    if response.percent == gold.percent or not isinstance(r, sympy.Expr):
        return False
    if not isinstance(g, sympy.Expr):
        return False
    return comparer.match(r / 100, g) if response.percent else comparer.match(r, g / 100)


def _based_match(response: Parsed, gold: Parsed) -> bool:
    r, g = response.value, gold.value
    if isinstance(r, BaseNumber) and isinstance(g, BaseNumber):
        return r.value == g.value
    if isinstance(g, BaseNumber):
        # The digits without the base (``10110`` for ``10110_2``); never the decimal value,
        # which is the question's input when it asks for a conversion.
        return re.sub(r"\s", "", response.source).upper() == g.digits
    return isinstance(g, sympy.Expr) and g.is_Integer and int(g) == r.value


class _Comparer:
    """Structural comparison at one numeric tolerance."""

    def __init__(self, rel_tol: float) -> None:
        self.rel_tol = rel_tol

    def match(self, r: Answer, g: Answer) -> bool:
        if isinstance(r, Choice) or isinstance(g, Choice):
            return self.choices(r, g)
        r, g = _unify(r, g)
        if isinstance(r, sympy.Expr) and isinstance(g, sympy.Expr):
            return self.scalars(r, g)
        if isinstance(r, Text) or isinstance(g, Text):
            return r == g
        if isinstance(r, Relation) and isinstance(g, Relation):
            return self.relations(r, g)
        if _is_set_like(r, g):
            return self.sets(_as_sympy_set(r), _as_sympy_set(g))
        if isinstance(r, Bag) and isinstance(g, Bag):
            return self.unordered(r.items, g.items)
        if isinstance(r, Matrix) and isinstance(g, Matrix):
            return _shape(r) == _shape(g) and self.ordered(_flat(r), _flat(g))
        seq_r, seq_g = _sequence(r), _sequence(g)
        if seq_r is not None and seq_g is not None:
            return self.ordered(seq_r, seq_g)
        return False

    def ordered(self, rs: Sequence[Answer], gs: Sequence[Answer]) -> bool:
        return len(rs) == len(gs) and all(self.match(r, g) for r, g in zip(rs, gs, strict=True))

    def unordered(self, rs: Sequence[Answer], gs: Sequence[Answer]) -> bool:
        if len(rs) != len(gs):
            return False
        unused = list(gs)
        for r in rs:
            hit = next((i for i, g in enumerate(unused) if self.match(r, g)), None)
            if hit is None:
                return False
            unused.pop(hit)
        return True

    def choices(self, r: Answer, g: Answer) -> bool:
        """Two letters match without case; a letter's value may answer a value."""
        letter_r, letter_g = _letter(r), _letter(g)
        if letter_r is not None and letter_g is not None:
            return letter_r == letter_g
        if isinstance(r, Choice) and r.value is not None and not isinstance(g, Choice):
            return self.match(r.value, g)
        if isinstance(g, Choice) and g.value is not None and not isinstance(r, Choice):
            return self.match(r, g.value)
        return False

    # -- scalars --------------------------------------------------------------------------
    def scalars(self, a: sympy.Expr, b: sympy.Expr) -> bool:
        if a == b:
            return True
        if a.has(sympy.nan) or b.has(sympy.nan):
            return False
        free = a.free_symbols | b.free_symbols
        if free:
            return self.functions_agree(a, b, sorted(free, key=str))
        if a.is_Rational and b.is_Rational and self.rel_tol == EXACT_REL_TOL:
            return False  # two exact rationals that are not equal
        va, vb = _evaluate(a), _evaluate(b)
        if va is None or vb is None:
            return False
        if self.close(va, vb):
            return True
        with mpmath.workdps(PRECISION):
            tiny = abs(va - vb) < mpmath.mpf("1e-40")
        return tiny and _simplifies_to_zero(a - b)  # cancellation noise around 0

    def close(self, x: mpmath.mpc, y: mpmath.mpc) -> bool:
        with mpmath.workdps(PRECISION):
            return abs(x - y) <= self.rel_tol * max(abs(x), abs(y))

    def functions_agree(self, a: sympy.Expr, b: sympy.Expr, symbols: list) -> bool:
        valid = 0
        for subs in _probe_points(symbols):
            va, vb = _evaluate(a, subs), _evaluate(b, subs)
            if va is None or vb is None:
                continue
            if not self.close(va, vb):
                return False
            valid += 1
        return True if valid >= _MIN_PROBES else _simplifies_to_zero(a - b)

    # -- relations ------------------------------------------------------------------------
    def relations(self, r: Relation, g: Relation) -> bool:
        set_r, set_g = relation_as_set(r), relation_as_set(g)
        # Only in the same variable: ``x = 3`` (a vertical line) is not ``y = 3``.
        same_variable = _free(r) == _free(g)
        if set_r is not None and set_g is not None and same_variable:
            return self.sets(set_r, set_g)
        if set(r.ops) == set(g.ops) == {"="}:
            if len(r.terms) != 2 or len(g.terms) != 2:
                return self.ordered(r.terms, g.terms)
            return self.proportional(r.terms[0] - r.terms[1], g.terms[0] - g.terms[1], False)
        ineq_r, ineq_g = _inequalities(r), _inequalities(g)
        if ineq_r is None or ineq_g is None or len(ineq_r) != len(ineq_g):
            return False
        unused = list(ineq_g)
        for expr, kind in ineq_r:
            hit = next(
                (
                    i
                    for i, (other, other_kind) in enumerate(unused)
                    if kind == other_kind and self.proportional(expr, other, kind != "!=")
                ),
                None,
            )
            if hit is None:
                return False
            unused.pop(hit)
        return True

    def proportional(self, f: sympy.Expr, h: sympy.Expr, positive: bool) -> bool:
        """``f = c * h`` for a constant ``c`` that is non-zero (and positive if asked)."""
        if f == h:
            return True
        symbols = sorted(f.free_symbols | h.free_symbols, key=str)
        if not symbols:
            return self.scalars(f, h)
        ratios = []
        for subs in _probe_points(symbols):
            vf, vh = _evaluate(f, subs), _evaluate(h, subs)
            if vf is None or vh is None or vh == 0:
                continue
            ratios.append(vf / vh)
        if len(ratios) < _MIN_PROBES or ratios[0] == 0:
            return False
        if positive and not (abs(ratios[0].imag) == 0 and ratios[0].real > 0):
            return False
        return all(self.close(q, ratios[0]) for q in ratios[1:])

    # -- sets -----------------------------------------------------------------------------
    def sets(self, a: sympy.Set | None, b: sympy.Set | None) -> bool:
        if a is None or b is None:
            return False
        if a == b:
            return True
        parts_a = list(a.args) if isinstance(a, sympy.Union) else [a]
        parts_b = list(b.args) if isinstance(b, sympy.Union) else [b]
        if len(parts_a) != len(parts_b):
            return False
        return all(self.set_parts(x, y) for x, y in zip(parts_a, parts_b, strict=True))

    def set_parts(self, x: sympy.Set, y: sympy.Set) -> bool:
        if isinstance(x, sympy.Interval) and isinstance(y, sympy.Interval):
            return (
                (x.left_open, x.right_open) == (y.left_open, y.right_open)
                and self.scalars(x.start, y.start)
                and self.scalars(x.end, y.end)
            )
        if isinstance(x, sympy.FiniteSet) and isinstance(y, sympy.FiniteSet):
            return self.unordered(list(x.args), list(y.args))
        return x == y


def _unify(r: Answer, g: Answer) -> tuple[Answer, Answer]:
    """Bring two answers to comparable forms: ``x = 5`` -> ``5``, ``\\{5\\}`` -> ``5``, ..."""
    return _toward(r, g), _toward(g, r)


def _toward(x: Answer, other: Answer) -> Answer:
    if isinstance(x, Relation) and not isinstance(other, Relation):
        if isinstance(other, (Interval, IntervalUnion, SetDifference)) or (
            isinstance(other, Bag) and other.braced
        ):
            return x
        value = x.assigned_value()
        return x if value is None else value
    if isinstance(x, Bag) and len(x.items) == 1 and not isinstance(other, Bag):
        return x.items[0]
    if isinstance(x, Point) and x.may_be_interval and _is_interval_like(other):
        return Interval(x.items[0], x.items[1], False, False)
    return x


def _free(rel: Relation) -> set:
    return set().union(*(t.free_symbols for t in rel.terms))


def _letter(x: Answer) -> str | None:
    """The upper-case choice letter ``x`` stands for: a ``Choice``, or one letter a-e alone."""
    if isinstance(x, Choice):
        return x.letter
    if isinstance(x, sympy.Symbol) and len(x.name) == 1 and x.name.upper() in "ABCDE":
        return x.name.upper()
    return None


def _is_interval_like(x: Answer) -> bool:
    if isinstance(x, Relation):
        return relation_as_set(x) is not None
    return isinstance(x, (Interval, IntervalUnion, SetDifference))


def _is_set_like(r: Answer, g: Answer) -> bool:
    """An interval (or a one-variable relation) on one side, a set-like answer on the other."""
    kinds = (Interval, IntervalUnion, SetDifference, Relation)
    if not (isinstance(r, kinds) or isinstance(g, kinds)):
        return False
    return all(isinstance(x, kinds) or (isinstance(x, Bag) and x.braced) for x in (r, g))


def _as_sympy_set(x: Answer) -> sympy.Set | None:
    try:
        if isinstance(x, Interval):
            return sympy.Interval(x.lo, x.hi, not x.left_closed, not x.right_closed)
        if isinstance(x, IntervalUnion):
            parts = [_as_sympy_set(p) for p in x.parts]
            return None if any(p is None for p in parts) else sympy.Union(*parts)
        if isinstance(x, Bag) and all(isinstance(i, sympy.Expr) for i in x.items):
            return sympy.FiniteSet(*x.items)
        if isinstance(x, SetDifference):
            whole, removed = _as_sympy_set(x.whole), _as_sympy_set(x.removed)
            if whole is None or removed is None:
                return None
            return sympy.Complement(whole, removed)
        if isinstance(x, Relation):
            return relation_as_set(x)
    except (TypeError, ValueError):
        return None  # symbolic ends sympy cannot order
    return None


def relation_as_set(rel: Relation) -> sympy.Set | None:
    """The solution set of a one-variable chain such as ``1 < x <= 5``; else ``None``."""
    free = set().union(*(t.free_symbols for t in rel.terms))
    if len(free) != 1:
        return None
    (x,) = free
    result: sympy.Set = sympy.Interval(-sympy.oo, sympy.oo)
    flipped = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "!=": "!="}
    for left, op, right in zip(rel.terms[:-1], rel.ops, rel.terms[1:], strict=True):
        if left == x and right.is_real:
            bound, op = right, op
        elif right == x and left.is_real:
            bound, op = left, flipped[op]
        else:
            return None
        result = result.intersect(_ray(op, bound))
    return result


def _ray(op: str, c: sympy.Expr) -> sympy.Set:
    oo = sympy.oo
    return {
        "<": sympy.Interval(-oo, c, True, True),
        "<=": sympy.Interval(-oo, c, True, False),
        ">": sympy.Interval(c, oo, True, True),
        ">=": sympy.Interval(c, oo, False, True),
        "=": sympy.FiniteSet(c),
        "!=": sympy.Union(sympy.Interval(-oo, c, True, True), sympy.Interval(c, oo, True, True)),
    }[op]


def _inequalities(rel: Relation) -> list[tuple[sympy.Expr, str]] | None:
    """Each link as ``(f, kind)`` meaning ``f > 0``, ``f >= 0`` or ``f != 0``."""
    out = []
    for left, op, right in zip(rel.terms[:-1], rel.ops, rel.terms[1:], strict=True):
        if op in ("<", "<="):
            out.append((right - left, op.replace("<", ">")))
        elif op in (">", ">=", "!="):
            out.append((left - right, op))
        else:
            return None  # ``=`` mixed into a chain of inequalities
    return out


def _sequence(x: Answer) -> Sequence[Answer] | None:
    if isinstance(x, Point) or (isinstance(x, Bag) and not x.braced):
        return x.items
    if isinstance(x, Matrix) and 1 in _shape(x):
        return _flat(x)  # a row or column vector answers a tuple
    return None


def _shape(m: Matrix) -> tuple[int, int]:
    return len(m.rows), len(m.rows[0])


def _flat(m: Matrix) -> list[sympy.Expr]:
    return [c for row in m.rows for c in row]


def _probe_points(symbols: list) -> list[dict]:
    n = len(_PROBES)
    return [
        {s: sympy.Float(_PROBES[(k + 3 * j) % n], PRECISION) for j, s in enumerate(symbols)}
        for k in range(n // 2)
    ]


def _evaluate(expr: sympy.Expr, subs: dict | None = None) -> mpmath.mpc | None:
    """``expr`` as a finite complex number at ``PRECISION`` digits, or ``None``."""
    try:
        value = expr.evalf(PRECISION, subs=subs)
        if value.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
            return None
        re, im = value.as_real_imag()
        if not (re.is_Number and im.is_Number):
            return None
        with mpmath.workdps(PRECISION):
            return mpmath.mpc(
                mpmath.mpf(sympy.Float(re, PRECISION)._mpf_),
                mpmath.mpf(sympy.Float(im, PRECISION)._mpf_),
            )
    except (TypeError, ValueError, ArithmeticError, AttributeError):
        return None


def _simplifies_to_zero(expr: sympy.Expr) -> bool:
    try:
        return sympy.simplify(expr) == 0
    except (TypeError, ValueError, ArithmeticError, AttributeError, RecursionError):
        return False
