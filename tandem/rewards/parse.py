r"""Parse one answer, LaTeX or plain text, into a ``Parsed`` answer.

The steps: normalise the text (``normalize``); recognise whole-answer forms that are not grammar
(a number in another base such as ``1011_2``, a multiple-choice letter ``(C)`` or ``C``, a number
in words such as ``three`` or ``Twenty-one``, ``yes``/``no``, a text answer such as
``\text{Tuesday}``, a function name ``f(x) = ...`` on the left); tokenize; expand ``\pm`` into its
two answers; run the grammar (``grammar``).

Words and letter case: a text answer is compared lower-cased (``\text{No}`` answers ``no``), a
number word is that integer (``three`` answers ``3``; only whole words from zero to ninety-nine,
and hundred, thousand and million alone), and a choice letter is read only in capitals or in
parentheses (a bare ``c`` is a variable, which matches the choice ``C`` but no other letter).

What this file leaves out: comparison (``equivalence``) and time limits (``pool``).
"""

from __future__ import annotations

import re

import sympy

from tandem.rewards.answer import Bag, BaseNumber, Choice, Parsed, ParseError, Text
from tandem.rewards.grammar import Parser
from tandem.rewards.normalize import normalize
from tandem.rewards.tokens import Token, tokenize

_BASED = re.compile(r"^\(?([0-9A-Za-z]+)\)?_\{?\(?(\d{1,2})\)?\}?$")
# ``C``, ``(C)``, ``(c)``, and ``(C) 12`` / ``(C)\ 12`` with the choice's value after it.
_CHOICE = re.compile(r"^(?:([A-E])|\(([A-Ea-e])\)(?:\s*(?P<value>\S.*))?)$")
_UNITS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
]  # fmt: skip
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_NUMBER_WORDS = {
    **{w: n for n, w in enumerate(_UNITS)},
    **{w: 10 * (n + 2) for n, w in enumerate(_TENS)},
    **{f"{t}-{u}": 10 * (n + 2) + k for n, t in enumerate(_TENS) for k, u in enumerate(_UNITS)
       if 0 < k < 10},
    "hundred": 100, "thousand": 1000, "million": 10**6,
}  # fmt: skip
# Two-letter words that tokenize as a product of two variables unless caught first.
_SHORT_WORDS = frozenset(("no",))


def parse_answer(text: str) -> Parsed:
    """Parse ``text`` (a box's content or a gold answer).

    Raises:
        ParseError: if it is not an answer we can read; ``Refused`` (a subclass) if evaluating
            it would be too costly.
    """
    norm = normalize(text)
    source = norm.text
    if not source:
        raise ParseError("empty answer")
    based = _BASED.match(re.sub(r"\s", "", source))
    if based and _valid_base(based.group(1), int(based.group(2))):
        return Parsed(BaseNumber(based.group(1).upper(), int(based.group(2))), source)
    choice = _CHOICE.match(source)
    if choice:
        return Parsed(_choice(choice), source, norm.percent)
    word = re.sub(r"\s+", " ", source).strip().lower()
    if word in _NUMBER_WORDS:
        return Parsed(sympy.Integer(_NUMBER_WORDS[word]), source)
    if word in _SHORT_WORDS:
        return Parsed(Text(word), source)
    tokens = _function_name_lhs(tokenize(source))
    if any(t.kind == "word" for t in tokens):
        return Parsed(Text(re.sub(r"[\s{}\\]", "", source).lower()), source, norm.percent)
    signs = [t for t in tokens if t.kind == "op" and t.text in ("pm", "mp")]
    if not signs:
        parser = Parser(tokens)
        return Parsed(parser.parse(), source, norm.percent, parser.inexact)
    branches, inexact = [], False
    for plus in (True, False):  # ``a \pm b`` is the two answers ``a + b`` and ``a - b``
        swapped = [_resolve_sign(t, plus) for t in tokens]
        parser = Parser(swapped)
        branches.append(parser.parse())
        inexact |= parser.inexact
    return Parsed(Bag(tuple(branches)), source, norm.percent, inexact)


def _choice(match: re.Match[str]) -> Choice:
    """The letter, and the value after it where it parses (else the letter alone)."""
    letter = (match.group(1) or match.group(2)).upper()
    value = None
    if match.group("value"):
        try:
            value = parse_answer(match.group("value")).value
        except ParseError:
            value = None
    return Choice(letter, value)


def _valid_base(digits: str, base: int) -> bool:
    if not 2 <= base <= 36 or not any(c.isdigit() for c in digits):
        return False
    try:
        int(digits, base)
    except ValueError:
        return False
    return True


def _resolve_sign(token: Token, plus: bool) -> Token:
    if token.kind == "op" and token.text in ("pm", "mp"):
        return Token("op", "+" if (token.text == "pm") == plus else "-")
    return token


def _function_name_lhs(toks: list[Token]) -> list[Token]:
    """``f(x) = ...`` names a function: read ``f(x)`` as one symbol, not ``f`` times ``x``."""
    texts = [t.text for t in toks]
    if "=" not in texts or len(toks) < 5 or toks[0].kind != "var" or texts[1] != "(":
        return toks
    close = texts.index(")") if ")" in texts else -1
    args = toks[2:close]
    if close < 3 or texts[close + 1 : close + 2] != ["="]:
        return toks
    if not all(t.kind == "var" if k % 2 == 0 else t.text == "," for k, t in enumerate(args)):
        return toks
    name = f"{toks[0].text}({','.join(t.text for t in args if t.kind == 'var')})"
    return [Token("var", name), *toks[close + 1 :]]
