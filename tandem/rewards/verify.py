"""Verification of one item, and the loop a worker process runs: the code behind the deadline.

``verify_answer`` parses a box's content and a gold answer and compares them; it returns a
``Verdict`` and raises nothing. ``serve`` is the worker's main loop: it receives ``(index,
content, gold)`` over a pipe and sends back ``(index, verdict)``. Workers raise their recursion
limit (deeply nested answers recurse in the parser and in sympy) and exit when their parent dies.

What this file leaves out: extraction from the response, scheduling, and deadlines (``pool``).
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import NamedTuple

from tandem.rewards.answer import Parsed, ParseError
from tandem.rewards.equivalence import answers_match
from tandem.rewards.normalize import code_names, normalize
from tandem.rewards.parse import parse_answer

# Every verdict carries one of these; they are the keys of the per-reason counts.
REASONS = ("correct", "wrong", "no_box", "unparsable", "timeout")
_PLAIN_INT = re.compile(r"-?\d{1,60}")
WORKER_RECURSION_LIMIT = 20_000
# Address space of a worker (sympy needs ~300 MB of it); beyond it an item is ``unparsable``.
WORKER_MEMORY_BYTES = 2 << 30


class Verdict(NamedTuple):
    """The score of one item (1.0 or 0.0) and why."""

    score: float
    reason: str


CORRECT = Verdict(1.0, "correct")
WRONG = Verdict(0.0, "wrong")
NO_BOX = Verdict(0.0, "no_box")
UNPARSABLE = Verdict(0.0, "unparsable")
TIMEOUT = Verdict(0.0, "timeout")


def quick_verdict(content: str, gold: str) -> Verdict | None:
    """The verdict when it needs no parsing (identical text, or two plain integers); else None.

    This is what lets most items of a training batch skip the worker pool.
    """
    a, b = _bare(content), _bare(gold)
    if a == b and a:
        return CORRECT
    if _PLAIN_INT.fullmatch(a) and _PLAIN_INT.fullmatch(b):
        return CORRECT if int(a) == int(b) else WRONG
    return None


def _bare(text: str) -> str:
    return text.strip().lstrip("$ ").rstrip("$. ")


def verify_answer(content: str, gold: str, rel_tol: float = 1e-9) -> Verdict:
    """Compare a box's content with a gold answer. Never raises."""
    quick = quick_verdict(content, gold)
    if quick is not None:
        return quick
    try:
        response = parse_answer(content)
    except Exception:  # ParseError, or sympy failing on odd input: either way unreadable
        return UNPARSABLE
    gold_parsed = _parse_gold(gold)
    try:
        if gold_parsed is None:  # an odd gold: fall back to its normalised text
            return CORRECT if response.source == _normalized_text(gold) else WRONG
        return CORRECT if answers_match(response, gold_parsed, rel_tol) else WRONG
    except Exception:  # a comparison sympy cannot make is not a match
        return WRONG


@functools.lru_cache(maxsize=4096)  # a gold recurs once per rollout of its prompt
def _parse_gold(gold: str) -> Parsed | None:
    try:
        return parse_answer(code_names(gold))
    except Exception:
        return None


def _normalized_text(text: str) -> str | None:
    try:
        return normalize(text).text
    except ParseError:
        return None


def serve(conn: Connection, rel_tol: float) -> None:
    """A worker's main loop: verify items from ``conn`` until it sends ``None`` or closes."""
    sys.setrecursionlimit(WORKER_RECURSION_LIMIT)
    _limit_memory(WORKER_MEMORY_BYTES)
    _exit_with_parent(os.getppid())
    conn.send("ready")
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, content, gold = message
        try:
            verdict = verify_answer(content, gold, rel_tol)
        except BaseException:  # whatever happens, the item gets a verdict
            verdict = UNPARSABLE
        conn.send((index, verdict))


def _limit_memory(limit: int) -> None:
    """Cap the worker's address space.

    A runaway answer then fails here with ``MemoryError`` instead of waking the kernel's OOM
    killer, whose victim may be the training process.
    """
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        new_soft = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        if soft == resource.RLIM_INFINITY or soft > new_soft:
            resource.setrlimit(resource.RLIMIT_AS, (new_soft, hard))
    except (ImportError, ValueError, OSError):
        pass  # not on this platform; the deadline still holds


def _exit_with_parent(parent: int) -> None:
    """Exit when the parent dies, even in the middle of a computation that never ends."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="tandem-reward-watchdog", daemon=True).start()
