"""A tandem turn inside a vLLM engine: the logits processor that steps the handoff sampler over
the author's tokens as they come, and the row and turn it reads.

A turn is one request to its author's engine (``tandem.engine.vllm_backend``). The processor
finds the request's ``Turn`` in ``TURNS`` by the key in its ``extra_args``, copies it (the
backend replays the turn from its start once the request ends), restricts the turn's first token
where it opened on a retraction (``sampler.allowed``), and forces the stop token once the
sampler hands the pen over. The schedule is the sampler's own ``step``, on one row, with the
row's coins by response position, so a request vLLM preempts and re-schedules replays the same
coins.

``run_turns`` drives a batch through the two engines, turn after turn.

What this file leaves out: the requests, the engines and the rollouts (``tandem.engine
.vllm_backend``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tandem.engine.base import StopReason
from tandem.engine.draw import coin_generator
from tandem.samplers.base import JUNIOR, SENIOR, Sampler, State

# The turns in flight, by request key: the logits processor lives in this process and reads them.
TURNS: dict[str, Turn] = {}
KEY = "tandem_turn"


def turn_processor() -> type:
    """The vLLM logits processor class (built on first use: vLLM is imported lazily)."""
    from vllm.v1.sample.logits_processor import LogitsProcessor

    class TurnProcessor(LogitsProcessor):
        """Steps each turn request's sampler over its tokens; restricts its first token where
        the turn opened on a retraction, and forces the stop token once the turn is over."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.rows: dict[int, Replay] = {}

        def is_argmax_invariant(self) -> bool:
            return False  # it restricts and stops, so it must run for greedy requests too

        def update_state(self, batch_update: Any) -> None:
            if batch_update is not None:
                follow_batch(self.rows, batch_update, self._take)

        @staticmethod
        def _take(params: Any, output: list[int]) -> Replay | None:
            key = (params.extra_args or {}).get(KEY)
            if key is None:
                return None
            # a copy: the backend replays the turn from its start once the request ends
            return Replay(dataclasses.replace(TURNS[key]), output)

        def apply(self, logits: Tensor) -> Tensor:
            for i, row in self.rows.items():
                mask = row.advance(logits.shape[-1])
                if mask is not None:
                    logits[i].masked_fill_(~mask.to(logits.device), float("-inf"))
            return logits

    return TurnProcessor


def follow_batch(rows: dict[int, Any], update: Any, take: Callable[[Any, list[int]], Any]) -> None:
    """Apply one vLLM ``BatchUpdate`` to a processor's ``rows`` (batch row -> what it keeps
    for that request), in the order vLLM defines: removed, added (``take(params, output)``:
    what to keep, or None for a request the processor leaves alone), moved."""
    from vllm.v1.sample.logits_processor import MoveDirectionality

    for i in update.removed:
        rows.pop(i, None)
    for i, params, _, output in update.added:
        rows.pop(i, None)
        kept = take(params, output)
        if kept is not None:
            rows[i] = kept
    for a, b, how in update.moved:
        ra, rb = rows.pop(a, None), rows.pop(b, None)
        if ra is not None:
            rows[b] = ra
        if how == MoveDirectionality.SWAP and rb is not None:
            rows[a] = rb


@dataclass
class Turn:
    """One row's schedule from the start of a turn, advanced one token at a time.

    Attributes:
        sampler: the handoff sampler (its tables bound to the engine's vocabulary).
        state: the sampler's state for this row, every value ``[1]``.
        coins: ``[T, 2]`` the row's coins by response position (one per ``step`` call).
        position: the response position of the next token.
        retracted: the next token redraws a retracted position, from ``sampler.allowed``.
        stop: the id the processor forces once the turn is over.
        done: the sampler has ended the row (a cap on turns).
    """

    sampler: Sampler
    state: State
    coins: Tensor
    position: int
    retracted: bool = False
    stop: int = 0
    done: bool = False

    def feed(self, token: int) -> tuple[bool, bool]:
        """Step the sampler over the author's ``token``: whether it is kept, and whether the
        author writes the next token too."""
        author = int(self.state["author"])
        coin = self.coins[self.position, int(self.retracted)].view(1)
        handoff = self.sampler.step(self.state, torch.tensor([token]), coin)
        self.state = handoff.state
        self.retracted = handoff.retract is not None and bool(handoff.retract[0])
        if self.retracted:
            return False, False
        self.position += 1
        self.done = handoff.done is not None and bool(handoff.done[0])
        return True, not self.done and int(self.state["author"]) == author

    def allowed(self) -> Tensor | None:
        """``[V]`` the tokens the turn's first token may be, or None for all."""
        return self.sampler.allowed(self.state)[0] if self.retracted else None


@dataclass
class Replay:
    """A turn request inside the engine: feeds the author's tokens to its ``Turn`` as they come."""

    turn: Turn
    output: list[int]
    fed: int = 0
    ended: bool = False

    def advance(self, vocab: int) -> Tensor | None:
        """``[vocab]`` the tokens allowed next (``None``: all), after reading the tokens written
        so far."""
        first = self.turn.allowed() if not self.output else None
        while not self.ended and self.fed < len(self.output):
            self.ended = not self.turn.feed(self.output[self.fed])[1]
            self.fed += 1
        if self.ended:
            only = torch.zeros(vocab, dtype=torch.bool)
            only[self.turn.stop] = True
            return only
        return first


@dataclass
class Row:
    """One rollout in the making."""

    context: list[int]  # prompt + response so far
    prompt_length: int
    turn: Turn | None = None
    tokens: list[int] = field(default_factory=list)
    authors: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # the author's
    requests: int = 0
    stop: int | None = None

    @property
    def author(self) -> int:
        return SENIOR if self.turn is None else int(self.turn.state["author"])


def run_turns(backend: Any, rows: list[Row], sampler: Sampler, params: Any, eos, stop: int) -> None:
    """Tandem through ``backend``'s two engines in turns (``tandem.engine.vllm_backend``):
    fills ``rows``; ``stop`` is the id forced where a turn ends."""
    # the coins, drawn ahead: one at the start, then two per response position
    gen = coin_generator(params.seed)
    n, most = len(rows), max(params.budget(r.prompt_length) for r in rows)
    context = torch.tensor([r.context[-1] for r in rows])  # [N]
    first = sampler.start(context, torch.rand(n, generator=gen))
    coins = torch.rand(n, most, 2, generator=gen)  # [N, T, 2]
    for i, row in enumerate(rows):
        state = {k: v[i : i + 1] for k, v in first.state.items()}
        row.turn = Turn(sampler, state, coins[i], 0, stop=stop)
    keys = [f"{id(rows)}:{i}" for i in range(n)]
    try:
        live = list(enumerate(rows))
        while live:
            for code, engine in ((SENIOR, backend.senior), (JUNIOR, backend.junior)):
                mine = [(i, r) for i, r in live if r.author == code and r.stop is None]
                if not mine:
                    continue
                for i, r in mine:
                    TURNS[keys[i]] = r.turn
                sampling = [backend._request(r, i, params, eos, keys[i], stop) for i, r in mine]
                outs = backend._run(engine, [r for _, r in mine], sampling)
                for (_, row), out in zip(mine, outs, strict=True):
                    keep_turn(backend, row, out, params, eos)
            live = [(i, r) for i, r in live if r.stop is None]
    finally:
        for key in keys:
            TURNS.pop(key, None)


def keep_turn(backend: Any, row: Row, out: Any, params: Any, eos) -> None:
    """Replay the turn over the author's output: keep its tokens up to the handover."""
    for token, lp in zip(out.token_ids, sampled(out), strict=True):
        author = row.author
        kept, goes_on = row.turn.feed(token)
        if kept and backend._emit(row, token, lp, author, params, eos):
            return
        if row.turn.done:
            row.stop = StopReason.LENGTH  # the schedule's own end: a cap on turns
        if not goes_on:
            return
    # the request stopped with the turn still on (a natural stop id): the author goes on


def sampled(out: Any) -> list[float]:
    """The raw log-prob of each sampled token of a completion."""
    return [d[t].logprob for t, d in zip(out.token_ids, out.logprobs, strict=True)]
