r"""String clean-up of an answer before it is parsed: the forms people write, made canonical.

Handles math delimiters (``$``, ``\(``, ``\[``), spacing and sizing commands (``\,``, ``\left``),
``\dfrac``/``\tfrac``, degrees (``^\circ``, ``°``), percent, dollars, ``\text{...}`` with trailing
units, ``or``/``and`` between answers, thousands separators (``1,000``, ``1\,000``, ``1{,}000``),
a trailing period, ``\varnothing``/``\emptyset``, and a few Unicode symbols. The output is still
LaTeX-ish text; what it means is decided by ``parse``.

What this file leaves out: structure (fractions, intervals, equations) and evaluation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tandem.rewards.answer import Refused
from tandem.rewards.extract import _braced, extract_boxed

# Longer than any real final answer; a box this long is model garbage, and parsing it is work.
MAX_ANSWER_CHARS = 2000

_UNICODE = {
    "−": "-", "–": "-", "×": r"\times ", "·": r"\cdot ", "⋅": r"\cdot ", "÷": r"\div ",
    "√": r"\sqrt", "π": r"\pi ", "∞": r"\infty ", "≤": r"\le ", "≥": r"\ge ", "≠": r"\ne ",
    "∪": r"\cup ", "∅": r"\emptyset ", "ℝ": r"\reals ", "²": "^2", "³": "^3", "°": "",
}  # fmt: skip
# Command -> replacement text (an empty string removes the command).
_COMMAND_ALIASES = {
    "dfrac": r"\frac", "tfrac": r"\frac", "cfrac": r"\frac", "dbinom": r"\binom",
    "tbinom": r"\binom", "leq": r"\le", "leqslant": r"\le", "geq": r"\ge", "geqslant": r"\ge",
    "neq": r"\ne", "lt": "<", "gt": ">", "varnothing": r"\emptyset", "lbrace": r"\{",
    "rbrace": r"\}", "lbrack": "[", "rbrack": "]", "langle": "(", "rangle": ")", "lvert": "|",
    "rvert": "|", "vert": "|", "ast": r"\times", "dots": r"\ldots", "cdots": r"\ldots",
    "degree": "", "displaystyle": "", "limits": "", "nolimits": "", "quad": "", "qquad": "",
}  # fmt: skip
# ``\\\\`` (a row break) is matched first so that ``\\\\quad`` is not read as ``\\quad``.
_COMMAND = re.compile(r"\\\\|\\([A-Za-z]+)")
_SIZING = re.compile(r"\\(?:left|right|[bB]igg?[lr]?)(?![A-Za-z])\s*\.?")
# Spacing: ``\,`` and ``\!`` vanish (they sit inside numbers: ``1\,000``), the others are spaces.
_SPACING = re.compile(r"\\\\|\\[,!;: ]|~")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ(?![A-Za-z])")
_CONJUNCTION = re.compile(r"\\text\s*\{\s*(?:or|and)\s*\}|\s+(?:or|and)\s+|\\text\s*\{\s*,\s*\}")
_TEXT_COMMANDS = (
    "text", "textbf", "textit", "textrm", "textsf", "textnormal", "mbox", "mathrm", "mathbf",
    "mathit", "mathsf", "boldsymbol", "bm", "hbox",
)  # fmt: skip
_TRAILING_TEXT = re.compile(
    r"\\(?P<cmd>text|textrm|textnormal|mbox|mathrm)\s*\{(?P<body>[^{}]*)\}"
    r"\s*(?:\^\s*\{?\s*\d\s*\}?)?\s*$"
)
_UNIT_WORDS = re.compile(
    r"^(?P<head>.*?[\w}\)\]])\s+(?P<tail>[A-Za-z]{2,}\.?(?:\s*\^\s*\{?\d\}?)?"
    r"(?:\s+[A-Za-z]{2,}\.?(?:\s*\^\s*\{?\d\}?)?)*)\s*$"
)
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?!\d|,\d)")
_REALS = re.compile(r"\\mathbb\s*\{?\s*R\s*\}?")
# A gold written as code (``np.arcsin(10/13)``, ``math.sqrt(2)``): the module prefix of a
# function or constant the grammar reads without it. Other names keep it (``np.log10`` is not
# ``log`` of 10), and so does an answer: only golds are read this way.
_CODE_NAME = re.compile(
    r"(?<![\w.\\])(?:np|numpy|math)\.(?=(?:sqrt|exp|sin|cos|tan|arcsin|arccos|arctan|asin|"
    r"acos|atan|sinh|cosh|tanh|floor|ceil|pi|e)(?![\w.]))"
)
_EMPTY_SET = re.compile(r"\\\{\s*\\\}")
_SHORT_UNITS = frozenset(("cm", "mm", "km", "ft", "yd", "mi", "kg", "mg", "ml", "mL", "lb", "oz"))
# Words that are mathematics, not units, when they end an answer (``3 pi``, ``x ln``).
MATH_WORDS = frozenset((
    "sqrt", "pi", "sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "asin",
    "acos", "atan", "sinh", "cosh", "tanh", "ln", "log", "exp", "oo", "inf", "infty", "infinity",
    "gcd", "lcm", "max", "min", "floor", "ceil", "abs", "frac",
))  # fmt: skip


def code_names(gold: str) -> str:
    """``gold`` with the ``np.`` / ``numpy.`` / ``math.`` prefixes of the names the grammar
    knows removed: ``np.arcsin(10/13)`` -> ``arcsin(10/13)``."""
    return _CODE_NAME.sub("", gold)


@dataclass(frozen=True)
class Normalized:
    """Normalised answer text and whether a percent sign was removed from its end."""

    text: str
    percent: bool = False


def normalize(answer: str) -> Normalized:
    """Canonical text for ``answer`` (a box's content, or a gold answer in LaTeX or plain text).

    Raises:
        Refused: if the answer is longer than ``MAX_ANSWER_CHARS``.
    """
    s = answer.strip()
    if len(s) > MAX_ANSWER_CHARS:
        raise Refused(f"answer of {len(s)} characters exceeds {MAX_ANSWER_CHARS}")
    if "\\boxed" in s or "\\fbox" in s:  # a gold written as a full solution line
        s = extract_boxed(s) or s
    s = _strip_delimiters(s)
    for char, repl in _UNICODE.items():
        s = s.replace(char, repl)
    s = s.replace("{,}", ",")
    s = _SPACING.sub(_spacing, s)
    s = _SIZING.sub("", s)
    s = _COMMAND.sub(_alias, s)
    s = _DEGREES.sub("", s)
    s = _REALS.sub(r"\\reals ", s)
    s = s.replace("\\$", "").replace("$", "")
    s, percent = _strip_percent(s)
    s = _CONJUNCTION.sub(",", s)
    s = _drop_trailing_text(s)
    s = _unwrap_text(s)
    s = _drop_unit_words(s)
    s = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), s)
    s = _EMPTY_SET.sub(r"\\emptyset", s)
    s = re.sub(r"\s+", " ", s).strip()
    s = _strip_trailing_punctuation(s)
    return Normalized(s, percent)


def _spacing(match: re.Match[str]) -> str:
    text = match.group(0)
    return text if text == "\\\\" else "" if text in ("\\,", "\\!") else " "


def _alias(match: re.Match[str]) -> str:
    replacement = _COMMAND_ALIASES.get(match.group(1) or "")
    if replacement is None:
        return match.group(0)
    return f"{replacement} "  # the space keeps ``\\lt3`` from gluing onto what follows


def _strip_delimiters(s: str) -> str:
    while True:
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)].strip()
                break
        else:
            return s


def _strip_percent(s: str) -> tuple[str, bool]:
    s = re.sub(r"\\text\s*\{\s*(?:\\%|percent)\s*\}|\s*percent\b", "%", s).replace("\\%", "%")
    stripped = s.rstrip(" .")
    if stripped.endswith("%"):
        return stripped[:-1], True
    return s, False


def _drop_trailing_text(s: str) -> str:
    """Remove units written as text after a value: ``5\\text{ cm}^2`` -> ``5``."""
    while True:
        m = _TRAILING_TEXT.search(s)
        if not m:
            return s
        head = s[: m.start()].rstrip()
        body = m.group("body").strip()
        is_unit = m.group("cmd") != "mathrm" or len(body) >= 2
        # Only after a value: ``x = \text{Tuesday}`` keeps its text, a bare ``\text{5}`` too.
        if not head or head[-1] in "=,(<>" or not is_unit or body.lower() in MATH_WORDS:
            return s
        s = head


def _unwrap_text(s: str) -> str:
    """``\\text{A}`` -> ``A`` for every text-style command; ``\\operatorname{lcm}`` -> ``\\lcm``."""
    pattern = re.compile(r"\\(" + "|".join(_TEXT_COMMANDS) + r"|operatorname)\s*(?=\{)")
    while True:
        m = pattern.search(s)
        if not m:
            return s
        body = _braced(s, m.end())
        if body is None:
            return s
        if m.group(1) == "operatorname" and body.strip().isalpha():
            body = "\\" + body.strip() + " "
        s = s[: m.start()] + " " + body + " " + s[m.end() + len(body) + 2 :]


def _drop_unit_words(s: str) -> str:
    """Remove plain unit words after a number: ``12 square feet`` -> ``12``."""
    m = _UNIT_WORDS.match(s)
    if not m or not re.search(r"\d", m.group("head")):
        return s
    words = re.findall(r"[A-Za-z]+", m.group("tail"))
    # Two letters after a number are a product (``2 ab``) unless they are a known unit.
    if any(w.lower() in MATH_WORDS or (len(w) == 2 and w not in _SHORT_UNITS) for w in words):
        return s
    return m.group("head")


def _strip_trailing_punctuation(s: str) -> str:
    while s and (s[-1] in ".,;" or s.endswith("\\.")):
        s = s[:-2] if s.endswith("\\.") else s[:-1]
        s = s.rstrip()
    return s
