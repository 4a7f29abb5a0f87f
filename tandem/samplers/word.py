"""The word schedule (the paper's): a coin picks the author of every word where the word begins.

A word begins at a *word onset* (see :mod:`tandem.samplers.boundaries`: the first non-space
byte after whitespace, so ``Ġapples`` begins one, ``les`` does not, and of ``Ġ`` ``5`` it is the
``5``). Two rules are offered.

``rule="onset"`` (default; the paper's "at every word boundary a coin picks the author"). Since
an author is needed before a token exists, the current author's proposal decides whether a word
begins here. At each step:

1. the current author ``a`` proposes a token ``x`` from its sampling distribution;
2. if ``x`` begins a word, the word ``a`` was writing is over and a coin draws the next word's
   author ``c`` (senior with probability ``p``). If ``c == a``, ``x`` is emitted. Otherwise
   ``step`` retracts ``x``, and ``c`` draws its own token from its sampling distribution
   *restricted to tokens that begin a word here* (``allowed``; renormalised; temperature, top-k
   and top-p apply after the restriction), so that the new author starts a new word rather than
   finishing ``a``'s;
3. otherwise ``x`` is emitted and ``a`` keeps the pen.

So the author changes only at word onsets, every emitted onset is a coin, and each word is
written by one author, drawn independently with probability ``p``. Restricting ``c``'s draw is
exactly "``c`` writes a word here": ``a``'s own onset proposal is already a draw from ``a``'s
distribution given that a word begins, so both authors write the new word's first token from the
same conditional. (The reference implementation's description, "both models sample at every
step and the active author's token is kept", would let ``c``'s unrestricted token continue
``a``'s word, putting a handoff inside it.)

``rule="after_boundary"`` (the reference implementation): the coin is redrawn *after* a token
that begins a word is emitted, and decides the author from the next token on. The emitted onset
token therefore belongs to the previous author, and the new author takes over one token into
the word: for a one-token word (``Ġapples``) it writes the following onset, so whole words
still change hands, but a multi-token word (``Ġcomput`` ``ing``, the digits ``1`` ``2`` of a
number) can be split between authors. No proposal is ever redrawn.

Where a word begins is a second choice, ``boundary``: ``"onset"`` (ours, the first word byte
after whitespace, looking at the previous token) or ``"leading_space"`` (the authors' code: a
token whose surface starts with a space, ``Ġ``, with no context, so a bare ``Ġ`` is a boundary
and a word after a newline is not; 53,021 ids on Qwen3's vocabulary). ``rule="after_boundary"``
with ``boundary="leading_space"`` is the authors' schedule exactly (``conf/sampler/
word_authors.yaml``, which ``conf/reproduce_paper.yaml`` trains with); ``rule="onset"`` with
``boundary="onset"`` is the paper's text (``conf/sampler/word.yaml``).

Under both rules, after ``max_gap_tokens`` tokens with no coin the coin is drawn anyway, before
the next token's proposal (the new author writes it unrestricted), so long runs without spaces
(LaTeX, code) cannot be monopolised. The first response token is always a coin.

What this file leaves out: how onsets are found (``boundaries``) and token sampling (engine).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tandem.registry import SAMPLERS
from tandem.samplers.base import Handoff, Sampler, State
from tandem.samplers.boundaries import (
    leading_space,
    onset_candidates,
    space_candidates,
    word_onset,
)

RULES = ("onset", "after_boundary")
# where a word begins: (whether a token does after prev, the [N, V] tokens that would)
BOUNDARIES = {
    "onset": (word_onset, onset_candidates),
    "leading_space": (leading_space, space_candidates),
}


@SAMPLERS.register("word")
class WordSampler(Sampler):
    """A coin with probability ``p`` of the senior at every word onset.

    State (each ``[N]``): ``author``; ``prev``, the last token; ``since``, tokens since the last
    coin; ``fresh``, whether a coin already fell for the next token (so that an onset there
    draws none).

    Args:
        tokenizer: the tokenizer both models share (or ``BoundaryTables``).
        p: the probability that the senior writes a given word.
        max_gap_tokens: the most tokens between two coins; reaching it draws the coin anyway.
        rule: ``"onset"`` (the coin at the onset decides who writes it) or
            ``"after_boundary"`` (the coin is redrawn after an onset is emitted).
        boundary: where words begin: ``"onset"`` or ``"leading_space"`` (the authors' code).
        vocab_size: the models' logits width, if wider than the tokenizer.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        p: float = 0.5,
        max_gap_tokens: int = 32,
        rule: str = "onset",
        boundary: str = "onset",
        vocab_size: int | None = None,
    ) -> None:
        if rule not in RULES:
            raise ValueError(f"rule ({rule!r}) must be one of {RULES}: see tandem.samplers.word.")
        if boundary not in BOUNDARIES:
            raise ValueError(
                f"boundary ({boundary!r}) must be one of {tuple(BOUNDARIES)}: see "
                "tandem.samplers.word."
            )
        if max_gap_tokens < 1:
            raise ValueError(
                f"max_gap_tokens ({max_gap_tokens}) must be at least 1: it is the longest run of "
                "tokens between two coins."
            )
        super().__init__(tokenizer, p=p, vocab_size=vocab_size)
        self.max_gap_tokens = max_gap_tokens
        self.rule = rule
        self.boundary = boundary
        self._begins, self._candidates = BOUNDARIES[boundary]

    def start(self, context: Tensor, coins: Tensor) -> Handoff:
        # the first response token's author is always a coin
        state = {"author": self.coin(coins), "prev": context, "since": torch.zeros_like(context)}
        return Handoff({**state, "fresh": torch.ones_like(context, dtype=torch.bool)})

    def step(self, state: State, token: Tensor, coins: Tensor) -> Handoff:
        author, prev, fresh = state["author"], state["prev"], state["fresh"]
        begins = self._begins(self.bound, token, prev)  # [N]
        coin = self.coin(coins)  # [N] at most one coin falls per call, so one suffices
        onset = begins & ~fresh if self.rule == "onset" else torch.zeros_like(begins)
        retract = onset & (coin != author)  # a word the other author won
        since = torch.where(fresh | onset, 1, state["since"] + 1)
        due = since >= self.max_gap_tokens  # [N] the coin falls before the next token
        if self.rule == "after_boundary":
            due |= begins
        kept = {
            "author": torch.where(due, coin, author),
            "prev": token,
            "since": since,
            "fresh": due,
        }
        if self.rule == "after_boundary":
            return Handoff(kept)
        # a retracted row stays where it was, its coin fallen: the new author writes the onset
        lost = {"author": coin, "prev": prev, "since": state["since"], "fresh": retract}
        new = {k: torch.where(retract, lost[k], v) for k, v in kept.items()}
        return Handoff(new, retract=retract)

    def may_retract(self, state: State, coins: Tensor) -> Tensor:
        # step withdraws an onset only where no coin fell yet and this coin names the other
        if self.rule != "onset":
            return torch.zeros_like(state["fresh"])
        return ~state["fresh"] & (self.coin(coins) != state["author"])

    def allowed(self, state: State) -> Tensor:
        return self._candidates(self.bound, state["prev"])  # [N, V] the word onsets here

    def __repr__(self) -> str:
        return (
            f"WordSampler(p={self.p}, max_gap_tokens={self.max_gap_tokens}, rule={self.rule!r}, "
            f"boundary={self.boundary!r})"
        )
