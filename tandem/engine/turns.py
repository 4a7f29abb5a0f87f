"""Tandem generation as turns: runs of tokens by one author, for engines that serve requests.

The torch engine steps every row one token at a time and asks the handoff sampler who writes
each. An engine that serves whole requests (vLLM) cannot be asked that at every token, but it
need not be: a sampler's coins do not depend on the text, only *where* they are drawn does (at
word onsets, step ends, after ``max_gap_tokens``). So the author who holds the pen keeps it for
a number of coins that can be drawn ahead of time, geometric with the probability ``q`` that a
coin picks that author again (``p`` for the senior, ``1 - p`` for the junior; 0 under strict
alternation). A turn is one request to the author's engine that runs until the coin it loses
falls, then stops; the other author's request continues from the shared context.

``Turn`` is that process for one row, token by token, exactly as ``tandem.samplers`` defines it:

- ``before()``: before a token, a coin falls if one is due (``after_boundary`` rules: after a
  boundary token; word sampler: after ``max_gap_tokens`` tokens without a coin). Losing it ends
  the turn here, and the next author writes this token unrestricted;
- ``feed(token)``: the author's token. Under the word sampler's ``onset`` rule, a token that
  begins a word is a coin (unless one already fell for this token); losing it ends the turn and
  the token is dropped: the next author writes this position restricted to word onsets
  (``restrict``), as the torch engine's redraw does.

The engine's logits processor and the backend run the same ``Turn`` from the same starting state
over the same tokens, so the processor's stop and the backend's cut agree by construction.

What this file leaves out: the engines (``tandem.engine.vllm_backend``); drawing the coins.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tandem.samplers.base import JUNIOR, SENIOR, Sampler
from tandem.samplers.boundaries import BoundaryTables, onset_candidates, sentence_end, step_end
from tandem.samplers.step import StepSampler
from tandem.samplers.token import TokenSampler
from tandem.samplers.word import WordSampler

# A turn that never loses its coin (p = 1 for the senior): more coins than any rollout holds.
NEVER = 1 << 40


class TurnTables:
    """Boundary tables as Python lists, for per-token checks in a request's hot loop.

    Args:
        tables: the sampler's tables, padded to the model's logits width.
    """

    def __init__(self, tables: BoundaryTables) -> None:
        self.tables = tables
        names = ("onset", "leads", "trails", "sentence_end", "step_end", "newline", "leading_space")
        for name in names:
            setattr(self, name, getattr(tables, name).tolist())
        self.newline_start = tables.newline_start.tolist()
        self.newline_end = tables.newline_end.tolist()

    # Scalar forms of tandem.samplers.boundaries' rules (tests check them against the tensor forms).
    def word(self, token: int, prev: int) -> bool:
        return self.onset[token] or (self.trails[prev] and self.leads[token])

    def space(self, token: int, prev: int) -> bool:
        return self.leading_space[token]

    def step(self, token: int, prev: int) -> bool:
        joined = self.newline_end[prev] and not self.sentence_end[prev]
        return self.step_end[token] or (joined and self.newline_start[token])

    def sentence(self, token: int, prev: int) -> bool:
        joined = self.newline_end[prev] and not self.sentence_end[prev]
        return self.sentence_end[token] or (joined and self.newline[token])

    def token(self, token: int, prev: int) -> bool:
        return True

    def allowed_after(self, prev: int, boundary: str = "word") -> Tensor:
        """``[V]`` bool: the tokens that begin a word after ``prev``."""
        if boundary == "space":
            return self.tables.leading_space
        return onset_candidates(self.tables, torch.tensor([prev]))[0]


@dataclass
class Turn:
    """One author's turn in one row: the sampler's state, and the coins the author will win.

    Attributes:
        boundary: where coins fall: ``word`` (onsets), ``space`` (leading-space tokens),
            ``step``, ``sentence`` or ``token``.
        rule: ``onset`` (a proposed word onset is a coin) or ``after`` (a coin falls after an
            emitted boundary token).
        keep: coins this author still wins; the next one ends the turn.
        prev: the last token of the shared context.
        max_gap: the most tokens between coins (0: no limit).
        restrict: the first token must begin a word (the turn opened on a lost onset).
        fresh: the coin of the next token already fell (it opened this turn).
        since: tokens since the last coin.
        due: a coin falls before the next token (``after`` rule).
        drawn: a coin fell for the current token.
    """

    boundary: str
    rule: str
    keep: int
    prev: int
    max_gap: int = 0
    restrict: bool = False
    fresh: bool = True
    since: int = 0
    due: bool = False
    drawn: bool = False

    def before(self) -> bool:
        """Before the next token: True if a coin falls now and this author loses it."""
        if self.fresh:
            self.drawn = True
            return False
        self.drawn = self.due or (self.max_gap > 0 and self.since >= self.max_gap)
        return self.drawn and self._lose()

    def feed(self, token: int, tables: TurnTables) -> bool:
        """The author's token; False if it began a word and lost that coin (token dropped)."""
        begins = getattr(tables, self.boundary)
        if self.rule == "onset" and not self.drawn and begins(token, self.prev):
            self.drawn = True
            if self._lose():
                return False
        self.since = 1 if self.drawn else self.since + 1
        self.due = self.rule == "after" and begins(token, self.prev)
        self.prev, self.fresh, self.restrict = token, False, False
        return True

    def _lose(self) -> bool:
        if self.keep == 0:
            return True
        self.keep -= 1
        return False

    def state(self) -> dict[str, Any]:
        """The fields, to send with a request and to rebuild the turn from."""
        return dataclasses.asdict(self)


class Schedule:
    """What a handoff sampler means for turns: who writes first and how long each author keeps
    the pen. Coins come from the sampler's own generator.

    Args:
        sampler: a word, token, step or sentence sampler.

    Raises:
        NotImplementedError: for any other sampler, naming the ones served.
    """

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.max_gap = 0
        self.max_rounds = getattr(sampler, "max_rounds", None)
        self.first = "coin"
        self.alternate = False
        if isinstance(sampler, WordSampler):
            self.boundary = "word" if sampler.boundary == "onset" else "space"
            self.rule = "onset" if sampler.rule == "onset" else "after"
            self.max_gap = sampler.max_gap_tokens
        elif isinstance(sampler, TokenSampler):
            self.boundary, self.rule = "token", "after"
        elif isinstance(sampler, StepSampler):
            self.boundary = "sentence" if sampler.boundary is sentence_end else "step"
            assert sampler.boundary in (sentence_end, step_end), "unknown step boundary"
            self.rule, self.first, self.alternate = "after", sampler.first, sampler.alternate
            if self.max_rounds is not None and not self.alternate:
                raise NotImplementedError(
                    f"{sampler!r}: turns count rounds only under alternation. Set "
                    "alternate=true, max_rounds=null, or use the torch backend."
                )
        else:
            raise NotImplementedError(
                f"{sampler!r} has no turn schedule: turns serve the word, token, step and "
                "sentence samplers. Use the torch backend for this sampler."
            )

    def first_author(self) -> int:
        """Who writes the first token (a coin unless the schedule names the author)."""
        if self.first == "senior":
            return SENIOR
        if self.first == "junior":
            return JUNIOR
        return self._coin()

    def turn(self, author: int, prev: int, restrict: bool = False) -> Turn:
        """A fresh turn for ``author`` after context token ``prev``."""
        return Turn(
            self.boundary, self.rule, self._keep(author), prev, self.max_gap, restrict=restrict
        )

    def _keep(self, author: int) -> int:
        """Coins ``author`` wins before losing one: geometric in ``q``, 0 under alternation."""
        if self.alternate:
            return 0
        q = self.sampler.p if author == SENIOR else 1.0 - self.sampler.p
        if q >= 1.0:
            return NEVER
        if q <= 0.0:
            return 0
        u = float(torch.rand(1, generator=self.sampler.generator))
        return min(NEVER, int(math.log1p(-u) / math.log(q)))

    def _coin(self) -> int:
        heads = float(torch.rand(1, generator=self.sampler.generator)) < self.sampler.p
        return SENIOR if heads else JUNIOR
