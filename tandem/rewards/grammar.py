r"""The grammar of answers: a recursive-descent parser from tokens to an ``Answer``.

Covers numbers (decimals, repeating decimals ``0.\overline{3}``, scientific notation, mixed
numbers ``2\frac{1}{2}``), ``\frac``/``\sqrt``/``\binom`` with braced or single-token arguments
(``\frac12``, ``\sqrt2``), powers, factorials, functions (``\sin^2 x``, ``\log_2 8``,
``sqrt(2)``), implicit multiplication, ``|x|``, floor and ceiling; and structures: tuples, sets,
intervals and their unions and differences (``\mathbb{R} \setminus \{0\}``), ``matrix``
environments, equation and inequality chains, ``x \in S``, a structure given a name
(``(x, y) = (0, 1)`` answers ``(0, 1)``, ``S = \{1, 2\}`` the set), bare lists ``a, b``; and
closed forms that evaluate to a value: ``\lim_{x \to a}`` (two-sided unless ``a^+``/``a^-``),
``\int_a^b ... dx`` (definite only: an indefinite integral has a free constant) and
``\sum_{k=a}^{b}``, evaluated by sympy, whose time the worker's deadline bounds. ``i`` is the
imaginary unit and ``e`` Euler's number.
Every value is built through ``guards``, which size-check powers, factorials, binomials and
literals *before* sympy evaluates them.

What this file leaves out: tokenizing (``tokens``), whole-answer forms that are not grammar
(``parse``: based numbers, ``\pm``, text answers), and comparison. Nothing here calls ``eval``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy

from tandem.rewards import guards
from tandem.rewards.answer import (
    Answer,
    Bag,
    Interval,
    IntervalUnion,
    Matrix,
    ParseError,
    Point,
    Refused,
    Relation,
    SetDifference,
)
from tandem.rewards.tokens import Token

# Brackets and braces deeper than this are refused: no answer needs it, and each level costs
# about ten stack frames here and more in sympy.
MAX_NESTING = 300
_RELATIONS = {"=", "!=", "<", "<=", ">", ">=", "in"}
_FUNCTIONS = {
    "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "cot": sympy.cot, "sec": sympy.sec,
    "csc": sympy.csc, "arcsin": sympy.asin, "arccos": sympy.acos, "arctan": sympy.atan,
    "sinh": sympy.sinh, "cosh": sympy.cosh, "tanh": sympy.tanh, "exp": sympy.exp,
    "ln": sympy.log, "log": sympy.log, "floor": sympy.floor, "ceil": sympy.ceiling,
    "abs": sympy.Abs,
}  # fmt: skip
_INVERSE = {"sin": sympy.asin, "cos": sympy.acos, "tan": sympy.atan}
_VARIADIC = {"gcd": sympy.gcd, "lcm": sympy.lcm, "max": sympy.Max, "min": sympy.Min}
_CONSTANTS = {"pi": sympy.pi, "oo": sympy.oo, "e": sympy.E, "i": sympy.I}
_MATRIX_ENVS = {
    "matrix", "pmatrix", "bmatrix", "Bmatrix", "vmatrix", "Vmatrix", "smallmatrix", "array",
}  # fmt: skip


class Parser:
    """Recursive descent over tokens; one instance parses one answer."""

    def __init__(self, tokens: list[Token]) -> None:
        self.toks = list(tokens)  # copied: ``\frac12`` splits a number token in place
        self.pos = 0
        self.abs_depth = 0
        self.depth = 0
        self.inexact = False

    # -- token access ---------------------------------------------------------------------
    def peek(self, offset: int = 0) -> Token | None:
        i = self.pos + offset
        return self.toks[i] if i < len(self.toks) else None

    def at(self, kind: str, *texts: str) -> bool:
        t = self.peek()
        return t is not None and t.kind == kind and (not texts or t.text in texts)

    def take(self) -> Token:
        t = self.peek()
        if t is None:
            raise ParseError("unexpected end of answer")
        self.pos += 1
        return t

    def expect(self, kind: str, text: str) -> None:
        t = self.take()
        if t.kind != kind or t.text != text:
            raise ParseError(f"expected {text!r}, found {t.text!r}")

    # -- structure ------------------------------------------------------------------------
    def parse(self) -> Answer:
        items = self.comma_list()
        if self.peek() is not None:
            raise ParseError(f"unexpected {self.peek().text!r}")
        return items[0] if len(items) == 1 else Bag(tuple(items))

    def comma_list(self) -> list[Answer]:
        items = [self.relation()]
        while self.at("op", ",", ";"):
            self.take()
            items.append(self.relation())
        return items

    def relation(self) -> Answer:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise Refused(f"answer nested more than {MAX_NESTING} levels deep")
        try:
            return self.relation_chain()
        finally:
            self.depth -= 1

    def relation_chain(self) -> Answer:
        terms, ops = [self.union()], []
        while self.at("op", *_RELATIONS):
            ops.append(self.take().text)
            terms.append(self.union())
        if not ops:
            return terms[0]
        if ops == ["in"]:  # ``x \in [1, 2)`` answers with the set
            return terms[1]
        if ops == ["="] and _assigns_structure(terms[0], terms[1]):
            return terms[1]
        if "in" in ops or not all(isinstance(t, sympy.Expr) for t in terms):
            raise ParseError("a relation between sets")
        return Relation(tuple(terms), tuple(ops))

    def union(self) -> Answer:
        value = self.additive()
        while self.at("op", "cup", "setminus"):
            op = self.take().text
            rhs = _as_set_part(self.additive())
            if op == "setminus":
                value = SetDifference(_as_set_part(value), rhs)
            elif isinstance(value, IntervalUnion):
                value = IntervalUnion((*value.parts, rhs))
            else:
                value = IntervalUnion((_as_set_part(value), rhs))
        return value

    # -- arithmetic -----------------------------------------------------------------------
    def additive(self) -> Answer:
        value = self.term()
        while self.at("op", "+", "-"):
            op = self.take().text
            rhs = self.term()
            value = guards.add(value, rhs if op == "+" else guards.neg(rhs))
        return value

    def term(self) -> Answer:
        value = self.factor()
        while True:
            if self.at("op", "*", "/"):
                op = self.take().text
                rhs = self.factor()
                value = guards.mul(value, rhs) if op == "*" else guards.div(value, rhs)
            elif self.starts_primary():
                if self.at("num") and self.toks[self.pos - 1].kind == "num":
                    raise ParseError("two numbers side by side")  # ``1 000``, ``2 3``
                value = guards.mul(value, self.factor())
            else:
                return value

    def factor(self) -> Answer:
        if self.at("op", "-"):
            self.take()
            return guards.neg(self.factor())
        if self.at("op", "+"):
            self.take()
            return self.factor()
        return self.postfix(self.primary())

    def postfix(self, value: Answer) -> Answer:
        while True:
            if self.at("op", "^"):
                self.take()
                value = guards.power(value, self.exponent())
            elif self.at("op", "!"):
                self.take()
                value = guards.factorial(value)
            else:
                return value

    def exponent(self) -> Answer:
        if self.at("op", "{"):
            return self.group()
        if self.at("op", "-", "+"):
            return self.factor()
        return self.postfix(self.primary())

    def starts_primary(self) -> bool:
        t = self.peek()
        if t is None:
            return False
        if t.kind in ("num", "var", "fn", "const"):
            return True
        if t.kind == "cmd":
            return t.text in ("frac", "sqrt", "binom", "lfloor", "lceil", "begin", "lim", "int",
                              "sum")  # fmt: skip
        if t.kind == "op" and t.text == "[":
            return self.grouping_bracket()
        return t.kind == "op" and (t.text in ("(", "{") or (t.text == "|" and not self.abs_depth))

    def grouping_bracket(self) -> bool:
        """Whether the ``[`` here groups one value (``\\lambda^5 [e^x - 1]``) rather than opening
        an interval: it holds no comma of its own and a ``]`` closes it. Only such a bracket may
        follow a value as a factor; ``2 [0, 1]`` stays unreadable."""
        depth = 0
        for i in range(self.pos, len(self.toks)):
            text = self.toks[i].text if self.toks[i].kind == "op" else ""
            if text in ("(", "[", "{", "\\{"):
                depth += 1
            elif text in (")", "]", "}", "\\}"):
                depth -= 1
                if depth == 0:
                    return text == "]"
            elif text == "," and depth == 1:
                return False
        return False

    # -- atoms ----------------------------------------------------------------------------
    def primary(self) -> Answer:
        t = self.take()
        if t.kind == "num":
            return self.number(t.text)
        if t.kind == "var":
            return self.variable(t.text)
        if t.kind == "const":
            return _CONSTANTS[t.text] if t.text in _CONSTANTS else _special_set(t.text)
        if t.kind == "fn":
            return self.function(t.text)
        if t.kind == "cmd":
            return self.command(t.text)
        if t.kind == "op":
            if t.text in ("(", "["):
                return self.bracketed(t.text)
            if t.text == "{":
                self.pos -= 1
                return self.group(allow_list=True)
            if t.text == "\\{":
                items = [] if self.at("op", "\\}") else self.comma_list()
                self.expect("op", "\\}")
                return Bag(tuple(items), braced=True)
            if t.text == "|":
                return self.delimited(sympy.Abs, "|", inside_abs=True)
        raise ParseError(f"unexpected {t.text!r}")

    def number(self, text: str) -> sympy.Expr:
        if self.at("cmd", "overline") and "." in text:
            self.take()
            return _repeating(text, self.raw_digits())
        if "." in text or "e" in text.lower():
            self.inexact = True
        value = guards.literal(text)
        if self.at("cmd", "frac") and value.is_Integer:
            mixed = self.try_mixed(value)
            if mixed is not None:
                return mixed
        return value

    def try_mixed(self, whole: sympy.Integer) -> sympy.Expr | None:
        """``2\\frac{1}{2}`` is the mixed number 5/2, not 2 * 1/2; else rewind."""
        start = self.pos
        self.take()
        frac = guards.div(self.argument(), self.argument())
        if isinstance(frac, sympy.Rational) and 0 < frac < 1:
            return whole + frac
        self.pos = start
        return None

    def variable(self, name: str) -> sympy.Expr:
        if self.at("op", "_"):
            self.take()
            sub = self.raw_argument()
            return sympy.Symbol(f"{name}_{sub}")
        return _CONSTANTS.get(name) or sympy.Symbol(name)

    def function(self, name: str) -> Answer:
        if name in _VARIADIC:
            self.expect("op", "(")
            args = self.comma_list()
            self.expect("op", ")")
            return guards.apply(_VARIADIC[name], *args)
        power, base = None, None
        if self.at("op", "^"):
            self.take()
            power = self.exponent()
        if name == "log" and self.at("op", "_"):
            self.take()
            base = self.argument()
        arg = self.function_argument()
        if power == -1 and name in _INVERSE:
            return guards.apply(_INVERSE[name], arg)
        value = guards.apply(_FUNCTIONS[name], arg)
        if base is not None:
            value = guards.div(value, guards.apply(sympy.log, base))
        return value if power is None else guards.power(value, power)

    def function_argument(self) -> Answer:
        if self.at("op", "(", "{"):
            return self.primary()
        return self.operand()

    def operand(self) -> Answer:
        """A factor and the run of implicit products after it: ``\\sin 2x`` reads as sin(2x)."""
        value = self.factor()
        while self.starts_primary() and not self.at("fn"):
            value = guards.mul(value, self.factor())
        return value

    def command(self, name: str) -> Answer:
        if name == "frac":
            return guards.div(self.argument(), self.argument())
        if name == "binom":
            return guards.binomial(self.argument(), self.argument())
        if name == "sqrt":
            index = None
            if self.at("op", "["):
                self.take()
                index = self.additive()
                self.expect("op", "]")
            radicand = self.argument()
            return guards.root(radicand, sympy.Integer(2) if index is None else index)
        if name == "lfloor":
            return self.delimited(sympy.floor, "rfloor")
        if name == "lceil":
            return self.delimited(sympy.ceiling, "rceil")
        if name == "begin":
            return self.matrix()
        if name == "lim":
            return self.limit()
        if name == "int":
            return self.integral()
        if name == "sum":
            return self.summation()
        raise ParseError(f"\\{name} cannot start a value")

    # -- closed forms -----------------------------------------------------------------------
    def limit(self) -> Answer:
        """``\\lim_{x \\to a} f``; ``a^+``/``a^-`` is one-sided."""
        self.expect("op", "_")
        self.expect("op", "{")
        var = self.bound_variable()
        self.expect("op", "to")
        close = self.closing_brace()
        direction = "+-"
        if close - self.pos >= 3 and [t.text for t in self.toks[close - 2 : close]] in (
            ["^", "+"], ["^", "-"],
        ):  # fmt: skip
            direction = self.toks[close - 1].text
            target = self.sub_parse(close - 2)
            self.pos = close
        else:
            target = self.sub_parse(close)
        self.expect("op", "}")
        body = self.operand()  # ``(1 + 1/n)^n``: the power belongs to the limit's body
        return guards.apply(lambda f, a: sympy.limit(f, var, a, direction), body, target)

    def integral(self) -> Answer:
        """``\\int_a^b f \\, dx``, definite only."""
        if not self.at("op", "_"):
            raise ParseError("an indefinite integral has no single value")
        self.take()
        lo = self.argument()
        self.expect("op", "^")
        hi = self.argument()
        end = self.differential()
        body = self.sub_parse(end)
        self.pos = end + 1
        var = self.bound_variable()
        return guards.apply(lambda f, a, b: sympy.integrate(f, (var, a, b)), body, lo, hi)

    def summation(self) -> Answer:
        """``\\sum_{k=a}^{b} f``."""
        self.expect("op", "_")
        self.expect("op", "{")
        var = self.bound_variable()
        self.expect("op", "=")
        lo = self.additive()
        self.expect("op", "}")
        self.expect("op", "^")
        hi = self.argument()
        body = self.operand()
        return guards.apply(lambda f, a, b: sympy.summation(f, (var, a, b)), body, lo, hi)

    def bound_variable(self) -> sympy.Symbol:
        t = self.take()
        if t.kind != "var":
            raise ParseError(f"expected a variable, found {t.text!r}")
        return sympy.Symbol(t.text)

    def closing_brace(self) -> int:
        """Index of the ``}`` that closes the group the parser is in."""
        depth = 0
        for i in range(self.pos, len(self.toks)):
            text = self.toks[i].text if self.toks[i].kind == "op" else ""
            depth += text == "{"
            if text == "}":
                if depth == 0:
                    return i
                depth -= 1
        raise ParseError("unclosed '{'")

    def differential(self) -> int:
        """Index of the ``d`` of the ``dx`` that ends an integrand, outside any bracket."""
        depth = 0
        for i in range(self.pos, len(self.toks) - 1):
            t = self.toks[i]
            if t.kind == "op" and t.text in ("(", "[", "{"):
                depth += 1
            elif t.kind == "op" and t.text in (")", "]", "}"):
                depth -= 1
            elif depth == 0 and t == Token("var", "d") and self.toks[i + 1].kind == "var":
                return i
        raise ParseError("an integral without its 'dx'")

    def sub_parse(self, end: int) -> Answer:
        """Parse the tokens from here to ``end`` (exclusive) as one value; move to ``end``."""
        inner = Parser(self.toks[self.pos : end])
        inner.depth = self.depth
        value = inner.additive()
        if inner.peek() is not None:
            raise ParseError(f"unexpected {inner.peek().text!r}")
        self.inexact |= inner.inexact
        self.pos = end
        return value

    def delimited(self, fn: Callable[..., Any], closer: str, inside_abs: bool = False) -> Answer:
        self.abs_depth += inside_abs
        inner = self.additive()
        self.abs_depth -= inside_abs
        t = self.take()
        if t.text != closer:
            raise ParseError(f"expected {closer!r}, found {t.text!r}")
        return guards.apply(fn, inner)

    def bracketed(self, opener: str) -> Answer:
        items = self.comma_list()
        closer = self.take().text
        if closer not in (")", "]"):
            raise ParseError(f"{opener!r} closed by {closer!r}")
        plain = (opener, closer) in (("(", ")"), ("[", "]"))
        if len(items) == 1:
            if not plain:
                raise ParseError(f"one value between {opener!r} and {closer!r}")
            return items[0]
        if len(items) == 2 and (not plain or opener == "["):
            lo, hi = items
            return _interval(lo, hi, opener == "[", closer == "]")
        return Point(tuple(items), may_be_interval=len(items) == 2 and opener == "(")

    def group(self, allow_list: bool = False) -> Answer:
        self.expect("op", "{")
        items = self.comma_list() if allow_list else [self.relation()]
        self.expect("op", "}")
        return items[0] if len(items) == 1 else Bag(tuple(items), braced=True)

    def argument(self) -> Answer:
        """One TeX argument: ``{...}``, one digit of a number (``\\frac12``), or one atom."""
        if self.at("op", "{"):
            return self.group()
        t = self.peek()
        if t is not None and t.kind == "num" and len(t.text) > 1:
            self.toks[self.pos] = Token("num", t.text[1:])  # ``\frac12``: 1 then 2
            return guards.literal(t.text[0])
        return self.primary()

    def raw_argument(self) -> str:
        """The text of a subscript argument: ``x_{12}`` -> ``12``."""
        if not self.at("op", "{"):
            return self.take().text
        self.take()
        parts = []
        while not self.at("op", "}"):
            parts.append(self.take().text)
        self.take()
        return "".join(parts)

    def raw_digits(self) -> str:
        digits = self.raw_argument()
        if not digits.isdigit():
            raise ParseError(f"repeating part {digits!r} is not digits")
        return digits

    def matrix(self) -> Answer:
        env = self.take().text
        if env not in _MATRIX_ENVS:
            raise ParseError(f"unsupported environment {env!r}")
        rows, row = [], [self.additive()]
        while not self.at("cmd", "end"):
            sep = self.take().text
            if sep == "\\\\" and self.at("cmd", "end"):
                break  # a trailing row break
            if sep not in ("&", "\\\\"):
                raise ParseError(f"unexpected {sep!r} in a matrix")
            if sep == "\\\\":
                rows.append(tuple(row))
                row = []
            row.append(self.additive())
        rows.append(tuple(row))
        self.take()
        if self.take().text != env:
            raise ParseError(f"\\begin{{{env}}} closed by another environment")
        if len({len(r) for r in rows}) != 1 or not all(
            isinstance(c, sympy.Expr) for r in rows for c in r
        ):
            raise ParseError("ragged matrix or a matrix of structures")
        if env in ("vmatrix", "Vmatrix"):
            return guards.determinant(rows)
        return Matrix(tuple(rows))


def _repeating(text: str, repeat: str) -> sympy.Rational:
    """``0.1\\overline{6}`` -> 1/6: (with one repeat - without) / (10^fixed * (10^repeat - 1))."""
    whole, _, fixed = text.partition(".")
    if len(text) + len(repeat) > guards.MAX_DIGITS:
        raise ParseError("repeating decimal too long")
    with_repeat = int((whole or "0") + fixed + repeat)
    without = int((whole or "0") + fixed)
    return sympy.Rational(with_repeat - without, 10 ** len(fixed) * (10 ** len(repeat) - 1))


def _interval(lo: Answer, hi: Answer, left_closed: bool, right_closed: bool) -> Interval:
    if not isinstance(lo, sympy.Expr) or not isinstance(hi, sympy.Expr):
        raise ParseError("interval ends must be values")
    # An infinite end is open whatever bracket was written.
    return Interval(lo, hi, left_closed and lo.is_finite is not False, right_closed and
                    hi.is_finite is not False)  # fmt: skip


def _as_set_part(part: Answer) -> Answer:
    if isinstance(part, Point) and part.may_be_interval:
        return _interval(part.items[0], part.items[1], False, False)
    if isinstance(part, (Interval, Bag, IntervalUnion, SetDifference)):
        return part
    raise ParseError("\\cup and \\setminus join intervals and sets only")


def _assigns_structure(lhs: Answer, rhs: Answer) -> bool:
    """A named value: ``(x, y) = (0, 1)`` (distinct variables, as many values), ``S = \\{1\\}``."""
    if isinstance(lhs, sympy.Symbol):
        return not isinstance(rhs, sympy.Expr)  # a set, tuple or interval given a name
    if not (isinstance(lhs, Point) and isinstance(rhs, Point)):
        return False
    names = lhs.items
    return (
        len(names) == len(rhs.items)
        and all(isinstance(n, sympy.Symbol) for n in names)
        and len(set(names)) == len(names)
    )


def _special_set(name: str) -> Answer:
    if name == "emptyset":
        return Bag((), braced=True)
    if name == "reals":
        return Interval(-sympy.oo, sympy.oo, False, False)
    raise ParseError(f"unknown constant {name!r}")
