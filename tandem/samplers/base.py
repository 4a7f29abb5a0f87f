"""The handoff sampler interface: a schedule is a value, stepped by whoever generates.

A sampler defines its rule once, as two pure, vectorised functions over N rows:

- ``start(context, coins) -> Handoff``: who writes the first token, and the state to carry;
- ``step(state, token, coins) -> Handoff``: given the token just written (the context token
  before the first one), who writes the next token and the new state.

``coins`` are ``[N]`` U(0, 1) numbers, one per row per call, whether the rule needs them or not;
the caller (the torch engine, the vLLM backend) owns them, seeds them from the rollout's seed and
keeps the state, so the same seed gives the same schedule and a resumed run redraws the same
coins. The state is a dict of ``[N]`` tensors, so a caller may drop finished rows from it.

One rule needs more than "who writes next": the word sampler's ``onset`` rule decides at a
proposed word onset, before the token is kept. Its ``step`` then returns ``retract`` for the
rows whose proposal began a word that another author won: the token is withdrawn, and the new
author writes that position again, drawn from the tokens ``allowed(state)`` lists (the word
onsets), after which ``step`` is called again with the redrawn token.

Samplers know boundaries (through :mod:`tandem.samplers.boundaries`); the engines do not. A junior
of another vocabulary (``tandem.engine.cross``) runs the same rule on its own ids: the engine
steps ``with_tables(its tables)``, a copy of the sampler, over the junior's tokens, and at a
change of pen gives the state's token ids (``token_state``) in the new author's vocabulary.

What this file leaves out: the schedules themselves (one file each) and token sampling (the
engine's).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from tandem.samplers.boundaries import BoundaryTables, boundary_tables

# Author codes, as stored in ``Rollouts.authors``.
SENIOR, JUNIOR, PAD = 1, 0, -1

State = dict[str, Tensor]


@dataclass(frozen=True)
class Handoff:
    """One call's answer: who writes next, the new state, and what else the rule says.

    Attributes:
        state: the schedule's memory, every value ``[N]``; ``state["author"]`` writes next.
        retract: rows whose given token is withdrawn; ``author`` writes that position again,
            restricted to ``Sampler.allowed(state)``. ``None``: no row.
        done: rows whose schedule has ended (e.g. a cap on turns). ``None``: no row.
    """

    state: State  # every value [N]
    retract: Tensor | None = None  # [N] bool
    done: Tensor | None = None  # [N] bool

    @property
    def author(self) -> Tensor:
        """``[N]`` long: who writes the next token (SENIOR or JUNIOR)."""
        return self.state["author"]


class Sampler:
    """Base class: the coin's odds and the boundary tables; subclasses define ``start`` and
    ``step``.

    Args:
        tokenizer: the tokenizer both models share, or ready-made
            :class:`~tandem.samplers.boundaries.BoundaryTables`; may be ``None`` for samplers
            that need no boundaries.
        p: the probability that a coin picks the senior.
        vocab_size: the models' logits width, when wider than the tokenizer (``bind`` widens
            the tables to the logits anyway; this only builds them wide ahead of time).
    """

    #: True when the sampler never picks the junior, so that generation may run without one.
    solo: ClassVar[bool] = False
    #: True when the sampler needs boundary tables.
    needs_tables: ClassVar[bool] = True
    #: State keys holding token ids (the last token written): a writer of another vocabulary
    #: gets them as its own ids of the same text. A rule keeping other ids names them here.
    token_state: ClassVar[tuple[str, ...]] = ("prev",)

    def __init__(
        self, tokenizer: Any = None, *, p: float = 0.5, vocab_size: int | None = None
    ) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p ({p}) is the probability of picking the senior: use 0 <= p <= 1.")
        self.p = float(p)
        self.tables: BoundaryTables | None = None
        if isinstance(tokenizer, BoundaryTables):
            self.tables = tokenizer.padded(vocab_size or tokenizer.size)
        elif tokenizer is not None and self.needs_tables:
            self.tables = boundary_tables(tokenizer, vocab_size)
        if self.needs_tables and self.tables is None:
            raise ValueError(
                f"{type(self).__name__} needs the tokenizer to find boundaries: pass "
                "tokenizer=<the models' tokenizer> (or BoundaryTables)."
            )
        self.bound = self.tables

    def bind(self, vocab_size: int, device: torch.device | str) -> None:
        """Widen the tables to the logits (``vocab_size``) and put them on ``device``, once per
        generation: ``step`` reads ``self.bound`` on the tokens' device."""
        if self.tables is not None:
            self.bound = self.tables.padded(vocab_size).to(device)

    def with_tables(self, tables: BoundaryTables) -> Sampler:
        """This rule over another vocabulary: a copy reading ``tables`` (that vocabulary's).
        A sampler that needs no tables is returned as it is; one that keeps other tensors made
        from its tables must override this to remake them."""
        if self.tables is None:
            return self
        twin = copy.copy(self)
        twin.tables = twin.bound = tables
        return twin

    def start(self, context: Tensor, coins: Tensor) -> Handoff:
        """The first token's author.

        Args:
            context: ``[N]`` the last prompt token of each row.
            coins: ``[N]`` U(0, 1), on the context's device.
        """
        raise NotImplementedError

    def step(self, state: State, token: Tensor, coins: Tensor) -> Handoff:
        """Who writes after ``token`` (``[N]``, written by ``state["author"]``); pure."""
        raise NotImplementedError

    def may_retract(self, state: State, coins: Tensor) -> Tensor:
        """``[N]`` bool: rows where ``step(state, token, coins)`` could withdraw some token.

        An engine that lets another library sample (the vLLM pair engine) draws the proposal
        itself only on these rows and lets the library sample freely elsewhere, so it must
        never say False where ``step`` could retract. The default: a rule that never does."""
        return torch.zeros(coins.shape, dtype=torch.bool, device=coins.device)

    def allowed(self, state: State) -> Tensor:
        """``[N, V]`` bool: what a retracted position may be redrawn from (see the module)."""
        raise NotImplementedError(f"{type(self).__name__} never retracts a token")

    def senior_only_logprob(self, context: Tensor, tokens: Tensor, lengths: Tensor) -> float:
        """The log-probability that this rule gives the senior every token of these rows, had
        the senior written them all: ``-inf`` where the rule hands over for sure.

        The check that a tandem batch holds junior tokens (``tandem.modules.checks``) reads it,
        so that a batch with none stops a run only when the rule makes that all but impossible,
        whatever the rule: a sampler defines it by its ``start`` and ``step`` alone.

        The rule is replayed along the rows, each call probed with every coin at 0 and at
        1 - 2^-24: where the probes agree, the author is certain; where one gives the senior and
        the other the junior, a coin decided, and gave the senior with probability ``p`` (the
        contract: a coin picks the senior with probability ``p``, as ``coin`` does); where both
        give the junior, the rule hands over for sure. The replay follows the senior's probe. A
        decision counts where it chooses the author of a token the row holds (a retraction
        chooses the given token's, any other answer the next token's), until the schedule ends
        (``Handoff.done``).

        Args:
            context: ``[N]`` each row's last prompt token.
            tokens: ``[N, T]`` the response tokens.
            lengths: ``[N]`` each row's real tokens.
        """
        device = tokens.device if self.bound is None else self.bound.special.device
        context, tokens, lengths = context.to(device), tokens.to(device), lengths.to(device)
        n, t = tokens.shape
        low = torch.zeros(n, device=device)
        high = torch.full((n,), 1.0 - 2.0**-24, device=device)
        decisions = torch.zeros(n, dtype=torch.long, device=device)
        impossible = torch.zeros(n, dtype=torch.bool, device=device)
        live = lengths > 0  # [N] the row writes the token whose author is being decided
        a, b = self.start(context, low), self.start(context, high)
        b_author = b.author
        for i in range(t):  # a and b say who writes token i
            live &= i < lengths
            if a.done is not None:
                live &= ~a.done
            if not bool(live.any()):
                break
            senior_a, senior_b = a.author == SENIOR, b_author == SENIOR
            decisions += (live & (senior_a != senior_b)).long()
            impossible |= live & ~senior_a & ~senior_b
            # the senior's path: probe a where it gives the senior, else b
            state = {k: torch.where(senior_a, v, b.state[k]) for k, v in a.state.items()}
            a, b = self.step(state, tokens[:, i], low), self.step(state, tokens[:, i], high)
            b_author = b.author
            # a withdrawn token i (the onset rule): the coin decided token i, not token i + 1
            if a.retract is not None:
                impossible |= live & a.retract & (a.author != SENIOR)
            if b.retract is not None:
                took = b.retract & (b.author != SENIOR)
                decisions += (live & took).long()
                b_author = torch.where(took, a.author, b.author)
        if bool(impossible.any()):
            return float("-inf")
        count = int(decisions.sum())
        if count == 0:
            return 0.0
        return count * math.log(self.p) if self.p > 0 else float("-inf")

    def coin(self, coins: Tensor) -> Tensor:
        """``[N]`` authors: the senior where ``coins < p``."""
        return torch.where(coins < self.p, SENIOR, JUNIOR)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p})"
