"""The handoff sampler interface: who authors the next token of each rollout.

A sampler is a small state machine over N rollouts that the engine steps once per token:

1. ``propose()``: who proposes the next token (draws the coins that fall due before a token);
2. the engine draws that author's proposal for each row;
3. ``decide(proposal)``: who writes the token after all, given the proposals. Only the word
   sampler's onset rule changes the author here, and then the new author draws its token afresh
   from the tokens ``Handoff.allowed`` lists;
4. ``observe(token, author)``: the emitted token and its author, fed back to the state.

Samplers know boundaries (through :mod:`tandem.samplers.boundaries`); the engine does not. Each
sampler owns a seeded CPU ``torch.Generator`` and draws N uniforms at every step whether it needs
them or not, so its random stream, and hence every rollout, depends only on the seed and on the
number of steps taken; ``state_dict()`` / ``load_state_dict()`` carry the stream across a resume.

What this file leaves out: the schedules themselves (one file each) and token sampling (the
engine's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from tandem.samplers.boundaries import BoundaryTables, boundary_tables

# Author codes, as stored in ``Rollouts.authors``.
SENIOR, JUNIOR, PAD = 1, 0, -1


@dataclass(frozen=True)
class Handoff:
    """A sampler's decision for one step, after it has seen the proposals.

    Attributes:
        authors: who writes this step's token (SENIOR or JUNIOR).
        resample: rows whose author changed after the proposal; the new author draws its token
            afresh, restricted to ``allowed``.
        allowed: for the ``resample`` rows in row order, the tokens they may write; ``None``
            when no row resamples.
    """

    authors: Tensor  # [N] long
    resample: Tensor  # [N] bool
    allowed: Tensor | None = None  # [R, V] bool, R = resample.sum()


class Sampler:
    """Base class: per-rollout state, the coin, and the generator.

    Args:
        tokenizer: the tokenizer both models share, or ready-made
            :class:`~tandem.samplers.boundaries.BoundaryTables`; may be ``None`` for samplers
            that need no boundaries.
        p: the probability that a coin picks the senior.
        seed: seeds the sampler's own generator (the coins).
        vocab_size: the models' logits width, when wider than the tokenizer. ``start`` also
            widens the tables to the logits it is given, so this is only needed to build them
            once ahead of time.
    """

    #: True when the sampler never picks the junior, so that generation may run without one.
    solo: ClassVar[bool] = False
    #: True when ``start`` needs boundary tables.
    needs_tables: ClassVar[bool] = True

    def __init__(
        self,
        tokenizer: Any = None,
        *,
        p: float = 0.5,
        seed: int = 0,
        vocab_size: int | None = None,
    ) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p ({p}) is the probability of picking the senior: use 0 <= p <= 1.")
        self.p = float(p)
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        if isinstance(tokenizer, BoundaryTables):
            self.tables: BoundaryTables | None = tokenizer.padded(vocab_size or tokenizer.size)
        elif tokenizer is not None and self.needs_tables:
            self.tables = boundary_tables(tokenizer, vocab_size)
        else:
            self.tables = None
        if self.needs_tables and self.tables is None:
            raise ValueError(
                f"{type(self).__name__} needs the tokenizer to find boundaries: pass "
                "tokenizer=<the models' tokenizer> (or BoundaryTables)."
            )

    # -- the step protocol ------------------------------------------------------------------

    def start(self, context: Tensor, vocab_size: int) -> None:
        """Begin ``N`` rollouts.

        Args:
            context: ``[N]`` the last prompt token of each row, on the engine's device (a word
                may begin at the first response token only if the prompt ends in whitespace).
            vocab_size: the models' logits width; the tables are widened to it.
        """
        device = context.device
        if self.tables is not None:
            self._tables = self.tables.padded(vocab_size).to(device)
        n = context.shape[0]
        self.prev = context.clone()  # [N] last token so far
        self.author = torch.full((n,), SENIOR, dtype=torch.long, device=device)  # [N]
        self.steps = 0
        self._coin: Tensor | None = None
        self._drawn = torch.zeros(n, dtype=torch.bool, device=device)  # [N] coin used this step
        #: ``[N]`` bool, rows whose schedule has ended (e.g. a cap on turns); None: never
        self.done: Tensor | None = None

    def propose(self) -> Tensor:
        """``[N]`` who proposes the next token. Draws this step's coins."""
        n = self.prev.shape[0]
        heads = torch.rand(n, generator=self.generator) < self.p
        self._coin = torch.where(heads, SENIOR, JUNIOR).long().to(self.prev.device)  # [N]
        self._drawn = self._draw_now()
        self.author = torch.where(self._drawn, self._coin, self.author)
        return self.author

    def decide(self, proposal: Tensor) -> Handoff:
        """Who writes the token, given each row's proposal (``[N]`` ids). Default: the proposer."""
        return Handoff(self.author, torch.zeros_like(self._drawn))

    def observe(self, token: Tensor, author: Tensor) -> None:
        """Record the emitted ``token`` ``[N]`` and its ``author`` ``[N]``."""
        self.author = author
        self._after(token)
        self.prev = token
        self.steps += 1

    # -- hooks for subclasses ---------------------------------------------------------------

    def _draw_now(self) -> Tensor:
        """``[N]`` rows whose author is drawn from the coin before this step's proposal."""
        return torch.zeros_like(self._drawn)

    def _after(self, token: Tensor) -> None:
        """Update the schedule once ``token`` is emitted.

        ``self.prev`` still holds the token before it, and ``self.author`` holds the token's
        author; a schedule that hands over after this token changes ``self.author``.
        """

    # -- resume -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The generator's state: what a resumed run needs to draw the same coins."""
        return {"generator": self.generator.get_state(), "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.generator.set_state(state["generator"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(p={self.p}, seed={self.seed})"
