r"""Tokenizer for normalised answers: LaTeX commands and plain-text names mapped to one vocabulary.

``\sqrt`` and ``sqrt``, ``\infty`` and ``inf``, ``\cdot`` and ``*``, ``\le`` and ``<=`` become the
same token, so LaTeX answers and plain-text golds parse alike. Kinds: ``num`` (a numeric
literal), ``var`` (a letter or Greek name), ``fn`` (a function), ``const``, ``cmd`` (a command
with arguments, or a closing delimiter), ``env`` (the name in ``\begin{...}``), ``op``, and
``word``: an unknown run of three or more letters, which makes the answer a text answer.

What this file leaves out: what token sequences mean (``parse``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tandem.rewards.answer import ParseError


class Token(NamedTuple):
    kind: str
    text: str


_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<env>\\(?:begin|end)\s*\{\s*(?P<envname>[A-Za-z]+\*?)\s*\}(?:\s*\{[lcr|\s]*\})?)
  | (?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+(?![\d.]))?)
  | (?P<cmd>\\(?:[A-Za-z]+|.))
  | (?P<word>[A-Za-z]+)
  | (?P<op>\*\*|<=|>=|=<|=>|!=|==|[-+*/^_()\[\]{}|!,;=<>&'])
    """,
    re.VERBOSE,
)
_FUNCTIONS = (
    "sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
    "exp", "ln", "log", "floor", "ceil", "abs", "gcd", "lcm", "max", "min",
)  # fmt: skip
_GREEK = (
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta", "vartheta",
    "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "upsilon", "phi", "varphi",
    "chi", "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Sigma", "Phi", "Psi",
    "Omega",
)  # fmt: skip
_NAMED = {
    **{f: Token("fn", f) for f in _FUNCTIONS},
    **{g: Token("var", g) for g in _GREEK},
    "asin": Token("fn", "arcsin"), "acos": Token("fn", "arccos"), "atan": Token("fn", "arctan"),
    "ceiling": Token("fn", "ceil"), "pi": Token("const", "pi"), "infty": Token("const", "oo"),
    "infinity": Token("const", "oo"), "inf": Token("const", "oo"), "oo": Token("const", "oo"),
    "emptyset": Token("const", "emptyset"), "reals": Token("const", "reals"),
    "frac": Token("cmd", "frac"), "sqrt": Token("cmd", "sqrt"), "binom": Token("cmd", "binom"),
    "lfloor": Token("cmd", "lfloor"), "rfloor": Token("cmd", "rfloor"),
    "lceil": Token("cmd", "lceil"), "rceil": Token("cmd", "rceil"),
    "overline": Token("cmd", "overline"), "bar": Token("cmd", "overline"),
    "cdot": Token("op", "*"), "times": Token("op", "*"), "div": Token("op", "/"),
    "le": Token("op", "<="), "ge": Token("op", ">="), "ne": Token("op", "!="),
    "cup": Token("op", "cup"), "in": Token("op", "in"), "pm": Token("op", "pm"),
    "mp": Token("op", "mp"), "setminus": Token("op", "setminus"),
    "backslash": Token("op", "setminus"), "to": Token("op", "to"),
    "rightarrow": Token("op", "to"), "lim": Token("cmd", "lim"), "int": Token("cmd", "int"),
    "sum": Token("cmd", "sum"),
}  # fmt: skip
# Plain-text names that may start a longer word (``sqrt2``, ``sinx``), longest first.
_PLAIN_PREFIXES = sorted(
    [n for n in _NAMED if _NAMED[n].kind in ("fn", "const") or n == "sqrt"], key=len, reverse=True
)
_OPS = {"**": "^", "=<": "<=", "=>": ">=", "==": "="}
_ESCAPED = {"{": "\\{", "}": "\\}", "\\": "\\\\", "|": "|"}


def tokenize(text: str) -> list[Token]:
    """Tokens of ``text``; raises ``ParseError`` on a character or command we do not know."""
    tokens: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ParseError(f"unexpected character {text[pos]!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind == "env":
            verb = "begin" if m.group(0).startswith("\\begin") else "end"
            tokens += [Token("cmd", verb), Token("env", m.group("envname"))]
        elif kind == "cmd":
            tokens.append(_command(m.group(0)[1:]))
        elif kind == "word":
            tokens += _word(m.group(0))
        elif kind == "op":
            tokens.append(Token("op", _OPS.get(m.group(0), m.group(0))))
        elif kind == "num":
            tokens.append(Token("num", m.group(0)))
    return tokens


def _command(name: str) -> Token:
    if name in _ESCAPED:
        return Token("op", _ESCAPED[name])
    if name in _NAMED:
        return _NAMED[name]
    raise ParseError(f"unsupported command \\{name}")


def _word(word: str) -> list[Token]:
    """A run of letters: a known name, a name then more (``sqrtx``), letters, or a text word."""
    if word in _NAMED and (_NAMED[word].kind in ("fn", "const") or word == "sqrt"):
        return [_NAMED[word]]
    if len(word) <= 2:
        return [Token("var", c) for c in word]
    for name in _PLAIN_PREFIXES:
        if word.startswith(name):
            return [_NAMED[name], *_word(word[len(name) :])]
    return [Token("word", word)]
