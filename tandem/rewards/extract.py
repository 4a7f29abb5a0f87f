r"""Strict extraction of the final answer: the content of the last ``\boxed`` in a response.

Accepted forms are ``\boxed{...}`` and ``\fbox{...}`` with nested braces (escaped ``\{``/``\}``
do not count), and ``\boxed x`` (the text up to the end of the line or of the math span). The
last box is the answer: a response that ends in an unclosed ``\boxed{`` was cut off while writing
its final answer, so it scores 0 even if an earlier box was complete. Nothing outside boxes is
ever read as an answer: there is no fallback to "the answer is ..." or to the last number.

Several boxes (``final_answer``): boxes that follow one another, joined only by punctuation,
spacing, math delimiters, ``and``/``or`` and assignment heads such as ``x =`` (at most
``MAX_JOIN_CHARS`` between two), form one group, and the answer is the list of their contents:
``the roots are \boxed{2} and \boxed{3}`` answers ``2, 3``, and answers ``2`` wrongly, as a list
of two values. Boxes with any other words between them (``\boxed{4}, but checking ... the answer
is \boxed{6}``) are a correction: only the last counts. A group whose joins hedge (``maybe``,
``perhaps``, ``possibly``, ``probably``, ``alternatively``, or ``either`` before it) offers
alternatives rather than an answer and scores 0 whatever they are. A group that repeats one
answer (``\boxed{7} \quad \boxed{7}``) is that answer.

What this file leaves out: reading what is inside the box (``normalize`` and ``parse``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A box command not followed by a letter (``\boxedfoo`` is another macro).
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# ``\boxed 42`` runs to the end of the line or of the inline/display math it sits in.
_BARE_END = re.compile(r"\$|\\\]|\\\)|\n")
# Longest text between two boxes of one group; beyond it the earlier box is an earlier step.
MAX_JOIN_CHARS = 60
# A box longer than this is not part of a group (and a real answer is shorter).
MAX_GROUP_BOX_CHARS = 2000
MAX_GROUP = 20
# What may join two boxes of one group once words are set aside: delimiters, spacing, punctuation.
_JOIN_NOISE = re.compile(
    r"\\[()\[\]]|\\(?:quad|qquad|text|mathrm|textbf|mbox)(?![A-Za-z])|\\[,;:!]|\\\\|[\s$,;:.&{}~]"
)
# ``x =``, ``x_1 =``, ``x_{2} =`` before a box: the box is the value of that variable.
_ASSIGNMENT_HEAD = re.compile(r"(?<![A-Za-z])[A-Za-z](?:_\{?\w+\}?)?\s*=")
_LIST_WORDS = frozenset(("and", "or"))
_HEDGE_WORDS = frozenset(("maybe", "perhaps", "possibly", "probably", "alternatively", "either"))
_HEDGE_BEFORE = re.compile(r"\b(?:either|maybe|perhaps|possibly)\W*$", re.IGNORECASE)


@dataclass(frozen=True)
class FinalAnswer:
    """The answer a response gives: the last box, or a group of boxes joined as a list.

    Attributes:
        content: the box's content, or the distinct contents of a group joined by ``", "``.
        boxes: how many boxes the group holds (1 for a single box).
        hedged: the boxes are offered as alternatives (the answer scores 0).
    """

    content: str
    boxes: int = 1
    hedged: bool = False


def extract_boxed(text: str) -> str | None:
    r"""The content of the last box in ``text``, or ``None`` when there is none or it is unclosed.

    Runs in time linear in ``len(text)``.

    Examples:
        >>> extract_boxed(r"so \boxed{\frac{1}{2}}.")
        '\\frac{1}{2}'
        >>> extract_boxed(r"\boxed{1} then \boxed{2") is None
        True
    """
    last = None
    for last in _BOX.finditer(text):  # noqa: B007 - only the last match is wanted
        pass
    if last is None:
        return None
    i = last.end()
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        return _braced(text, i)
    if i == last.end() or i >= len(text):
        return None  # ``\boxed.`` or a response that stops right after ``\boxed``
    end = _BARE_END.search(text, i)
    content = text[i : end.start() if end else len(text)].strip()
    return content or None


def _braced(text: str, open_at: int) -> str | None:
    """The text between the brace at ``open_at`` and its match, or ``None`` if unmatched."""
    depth = 0
    i = open_at
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # an escaped character, ``\{`` included, never changes the depth
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
        i += 1
    return None


def final_answer(text: str) -> FinalAnswer | None:
    r"""The final answer of a response: its last box, with the boxes grouped with it, or ``None``.

    Examples:
        >>> final_answer(r"roots $\boxed{2}$ and $\boxed{3}$.")
        FinalAnswer(content='2, 3', boxes=2, hedged=False)
        >>> final_answer(r"$\boxed{2}$ or maybe $\boxed{3}$").hedged
        True
    """
    last = extract_boxed(text)
    if last is None:
        return None
    starts = [m.start() for m in _BOX.finditer(text)]
    contents, hedged = [last], False
    cur = len(starts) - 1
    while cur > 0 and len(contents) < MAX_GROUP:
        previous = _previous_box(text, starts[cur - 1], starts[cur])
        if previous is None:
            break
        content, join = previous
        kind = _join_kind(join)
        if kind is None:
            break
        hedged |= kind == "hedge"
        contents.insert(0, content)
        cur -= 1
    if len(contents) > 1 and _HEDGE_BEFORE.search(text[max(0, starts[cur] - 30) : starts[cur]]):
        hedged = True
    distinct = list(dict.fromkeys(c.strip() for c in contents))
    return FinalAnswer(", ".join(distinct), len(contents), hedged)


def _previous_box(text: str, start: int, next_start: int) -> tuple[str, str] | None:
    """The content of the braced box at ``start`` and the text from it to ``next_start``.

    ``None`` when that box is not closed before ``next_start`` (it holds the next box), is too
    long, or is too far away. Only a bounded window is scanned, so grouping stays linear.
    """
    if next_start - start > MAX_GROUP_BOX_CHARS + MAX_JOIN_CHARS:
        return None
    m = _BOX.match(text, start)
    brace = text.find("{", m.end(), next_start) if m else -1
    if brace < 0 or text[m.end() : brace].strip():
        return None
    content = _braced(text[brace:next_start], 0)  # a bounded window, never the whole text
    if content is None:
        return None
    join = text[brace + len(content) + 2 : next_start]
    return (content, join) if len(join) <= MAX_JOIN_CHARS else None


def _join_kind(join: str) -> str | None:
    """``"list"`` or ``"hedge"`` for text joining two boxes of a group; ``None`` if it does not."""
    words = _JOIN_NOISE.sub(" ", _ASSIGNMENT_HEAD.sub(" ", join)).split()
    lowered = [w.lower() for w in words]
    if not all(w in _LIST_WORDS or w in _HEDGE_WORDS for w in lowered):
        return None
    return "hedge" if any(w in _HEDGE_WORDS for w in lowered) else "list"
