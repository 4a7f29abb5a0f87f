r"""Strict extraction of the final answer: the content of the last ``\boxed`` in a response.

Accepted forms are ``\boxed{...}`` and ``\fbox{...}`` with nested braces (escaped ``\{``/``\}``
do not count), and ``\boxed x`` (the text up to the end of the line or of the math span). Only the
last box counts: a response that ends in an unclosed ``\boxed{`` was cut off while writing its
final answer, so it scores 0 even if an earlier box was complete. Nothing else in the response is
ever read: there is no fallback to "the answer is ..." or to the last number.

What this file leaves out: reading what is inside the box (``normalize`` and ``parse``).
"""

from __future__ import annotations

import re

# A box command not followed by a letter (``\boxedfoo`` is another macro).
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
# ``\boxed 42`` runs to the end of the line or of the inline/display math it sits in.
_BARE_END = re.compile(r"\$|\\\]|\\\)|\n")


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
