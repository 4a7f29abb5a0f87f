"""Who holds the pen, token by token, inside one vLLM engine: the rows of a tandem batch and the
logits processor that steps their schedule.

``Pens`` holds one ``generate`` call's rows as the torch engine holds them: the sampler's state
as ``[N]`` tensors, the coins drawn ahead from the rollout's seed (one at the start, two per
response position), each row's response position, and what it has written with both models'
raw log-probs. A request carries its row (``extra_args``); the ``PenProcessor`` of the pair
engine (``tandem.engine.vllm_pair``) maps the engine's batch rows to it. Before each forward
(vLLM calls ``update_state`` before the model runs) it reads the token each row wrote at the
last step, gathers that token's log-prob under both models from the board, steps the sampler
over those rows at once (the sampler's own ``step``, the one definition) and arms the board
with each row's next author, whose logits ``compute_logits`` then returns for that row.

The word sampler's ``onset`` rule decides at a proposed onset, before the token is kept: where
a row's coin could withdraw the proposal (``Sampler.may_retract``), ``apply`` draws the
proposal itself from the author's sampling distribution (``tandem.engine.draw``, with a uniform
drawn ahead for that position), steps the sampler over it, and either forces that token or, on
a retraction, hands vLLM the other model's logits restricted to ``sampler.allowed``, so that
vLLM's sampler draws the new author's onset (temperature, top-k and top-p after the
restriction, as in the torch engine). Everywhere else vLLM samples as it would solo.

A row's schedule lives with the row, not with the engine's batch slot: a request vLLM preempts
and re-schedules comes back to the same state, the tokens it already wrote are never stepped
again, and its author cannot change on the way (``Pens.resumed`` counts such returns).

What this file leaves out: the model (``tandem.engine.vllm_pair``) and the requests and
rollouts (``tandem.engine.vllm_backend``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tandem.engine.base import SamplingParams
from tandem.engine.draw import coin_generator, draw, score
from tandem.engine.vllm_pair import BOARDS, Board
from tandem.engine.vllm_turns import follow_batch
from tandem.samplers.base import JUNIOR, SENIOR, Sampler

# The batches in flight, by key: the processor lives in this process and reads them.
PENS: dict[str, Pens] = {}
KEY = "tandem_pen"
# pending codes of a row whose token apply() decided: none, the proposal is forced, a redraw
NONE, FORCED, REDRAW = 0, 1, 2


def coins(rows: int, steps: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """A batch's randomness besides vLLM's own token draws, from the rollout's seed:
    ``[N]`` the start's coins, ``[N, T + 1, 2]`` two coins per response position (the second
    for a position redrawn after a retraction), ``[N, T + 1]`` the uniform of each position's
    proposal."""
    gen = coin_generator(seed)
    first = torch.rand(rows, generator=gen)
    return (
        first,
        torch.rand(rows, steps + 1, 2, generator=gen),
        torch.rand(rows, steps + 1, generator=gen),
    )


@dataclass
class Pens:
    """One ``generate`` call's rows (see the module).

    Args:
        sampler: the handoff sampler, bound to the engine's vocabulary; ``None``: the senior
            writes every token.
        params: the rollout's sampling parameters (the proposals' temperature, top-k, top-p).
        context: ``[N]`` each row's last prompt token.
        steps: the most response tokens a row may write.
        stop: the id forced once a row's schedule has ended.
    """

    sampler: Sampler | None
    params: SamplingParams
    context: Tensor
    steps: int
    stop: int
    state: dict[str, Tensor] = field(init=False)
    outputs: list[list[int] | None] = field(init=False)
    written: list[list[tuple[int, int, float, float]]] = field(init=False)
    resumed: int = 0

    def __post_init__(self) -> None:
        n = self.context.shape[0]
        first, self.coins, self.uniforms = coins(n, self.steps, self.params.seed)
        if self.sampler is None:
            self.state = {"author": torch.full((n,), SENIOR)}
        else:
            self.state = dict(self.sampler.start(self.context, first).state)
        self.position = torch.zeros(n, dtype=torch.long)
        self.retracted = torch.zeros(n, dtype=torch.bool)
        self.ended = torch.zeros(n, dtype=torch.bool)
        self.pending = torch.zeros(n, dtype=torch.long)  # NONE, FORCED, REDRAW
        self.proposal = torch.zeros(n, dtype=torch.long)
        self.tentative: dict[str, Tensor] = {k: v.clone() for k, v in self.state.items()}
        self.tentative_done = torch.zeros(n, dtype=torch.bool)
        self.pending_author = torch.zeros(n, dtype=torch.long)
        self.outputs = [None] * n
        self.fed = [0] * n
        self.slot: list[int | None] = [None] * n  # each row's batch row at the last step
        self.written = [[] for _ in range(n)]  # (token, author, senior lp, junior lp)
        self.cut: list[int | None] = [None] * n  # tokens kept where the schedule ended

    # -- reading what was written ------------------------------------------------------------
    def read(self, board: Board, rows: list[int]) -> None:
        """Take the token each of ``rows`` wrote at the last step (if any), with its log-probs,
        and step the sampler over them."""
        got, tokens, slots = [], [], []
        for i in rows:
            out, slot = self.outputs[i], self.slot[i]
            self.slot[i] = None
            if out is None or slot is None or len(out) == self.fed[i]:
                self.pending[i] = NONE  # no token came of the step (nothing was kept)
                continue
            if len(out) != self.fed[i] + 1:
                raise RuntimeError(
                    f"row {i} wrote {len(out) - self.fed[i]} tokens in one step; the pair engine "
                    "needs one token per step (no speculative decoding, no async scheduling)"
                )
            got.append(i)
            tokens.append(out[-1])
            slots.append(slot)
            self.fed[i] += 1
        if not got:
            return
        ids, token = torch.tensor(got), torch.tensor(tokens)
        senior, junior = board.logprobs(torch.tensor(slots), token)
        authors = self._step(ids, token)
        for k, i in enumerate(got):
            self.written[i].append((tokens[k], int(authors[k]), float(senior[k]), float(junior[k])))
            if self.cut[i] is None and bool(self.ended[i]):
                self.cut[i] = len(self.written[i])  # the schedule ended with this token

    def _step(self, ids: Tensor, token: Tensor) -> Tensor:
        """Step the sampler over the rows ``ids`` that wrote ``token``; their authors."""
        pending = self.pending[ids]
        self.pending[ids] = NONE
        forced, redraw = pending == FORCED, pending == REDRAW
        if bool((forced & (token != self.proposal[ids])).any()):
            raise RuntimeError("vLLM emitted another token than the one the pen forced")
        # rows whose proposal apply() already stepped (forced) or withdrew (redraw): take the
        # state it left, then feed the redrawn rows' token like any other
        settled = ids[forced | redraw]
        for k in self.state:
            self.state[k][settled] = self.tentative[k][settled]
        authors = torch.where(forced | redraw, self.pending_author[ids], self.state["author"][ids])
        self.position[ids[forced]] += 1
        self.retracted[ids[forced]] = False
        self.ended[ids[forced]] |= self.tentative_done[ids[forced]]
        self.retracted[ids[redraw]] = True
        free = ~forced & ~self.ended[ids]  # an ended row's forced stop is cut, not stepped
        feed = ids[free]
        if self.sampler is None or feed.numel() == 0:
            self.position[feed] += 1
            return authors
        coin = self.coins[feed, self.position[feed], self.retracted[feed].long()]
        state = {k: v[feed] for k, v in self.state.items()}
        handoff = self.sampler.step(state, token[free], coin)
        if handoff.retract is not None and bool(handoff.retract.any()):
            raise RuntimeError(
                f"{self.sampler!r} withdrew a token vLLM sampled freely: its may_retract said no "
                "withdrawal could happen there"
            )
        for k, v in handoff.state.items():
            self.state[k][feed] = v
        self.position[feed] += 1
        self.retracted[feed] = False
        if handoff.done is not None:
            self.ended[feed] |= handoff.done
        return authors

    # -- deciding the next token -------------------------------------------------------------
    def authors(self, rows: list[int]) -> Tensor:
        return self.state["author"][torch.tensor(rows, dtype=torch.long)]

    def decide(self, logits: Tensor, board: Board, slots: list[int], rows: list[int]) -> None:
        """Restrict ``logits`` (the batch's, in place) where a row's schedule says so: the stop
        id once it has ended; the proposal or the other author's onsets under the onset rule."""
        ids = torch.tensor(rows, dtype=torch.long)
        at = torch.tensor(slots, dtype=torch.long, device=logits.device)
        ended = self.ended[ids]
        if bool(ended.any()):
            done = at[ended.to(at.device)]
            only = torch.full_like(logits[done], float("-inf"))
            only[:, self.stop] = 0.0
            logits[done] = only
        if self.sampler is None:
            return
        coin = self.coins[ids, self.position[ids], self.retracted[ids].long()]
        state = {k: v[ids] for k, v in self.state.items()}
        may = self.sampler.may_retract(state, coin) & ~ended
        if not bool(may.any()):
            return
        self._propose(logits, board, ids[may], at[may.to(at.device)], coin[may])

    def _propose(self, logits: Tensor, board: Board, ids: Tensor, at: Tensor, coin: Tensor):
        """Draw the author's proposal for rows ``ids`` (batch rows ``at``) and step over it."""
        assert self.sampler is not None and board.logits is not None
        uniforms = self.uniforms[ids, self.position[ids]].to(logits.device)
        proposal = draw(score(logits[at].float(), self.params), None, uniforms, self.params).cpu()
        state = {k: v[ids] for k, v in self.state.items()}
        handoff = self.sampler.step(state, proposal, coin)
        retract = handoff.retract
        if retract is None:
            retract = torch.zeros_like(proposal, dtype=torch.bool)
        for k, v in handoff.state.items():
            self.tentative[k][ids] = v
        self.tentative_done[ids] = False if handoff.done is None else handoff.done
        self.pending[ids] = torch.where(retract, REDRAW, FORCED)
        self.proposal[ids] = proposal
        self.pending_author[ids] = torch.where(retract, handoff.state["author"], state["author"])
        on = retract.to(at.device)
        kept = at[~on]
        if kept.numel():  # the proposal stands: vLLM emits exactly it
            only = torch.full_like(logits[kept], float("-inf"))
            only.scatter_(1, proposal[~retract].to(logits.device)[:, None], 0.0)
            logits[kept] = only
        if bool(retract.any()):  # withdrawn: the new author's onsets, from its own logits
            lost = at[on]
            junior = (handoff.state["author"][retract] == JUNIOR).to(logits.device)[:, None]
            other = torch.where(junior, board.logits[1][lost], board.logits[0][lost])
            allowed = self.sampler.allowed({k: v[retract] for k, v in handoff.state.items()})
            logits[lost] = other.masked_fill(~allowed.to(other.device), float("-inf"))

    # -- the end -----------------------------------------------------------------------------
    def attach(self, row: int, output: list[int]) -> None:
        """The engine took ``row``'s request into its batch (again, after a preemption)."""
        if self.outputs[row] is not None:
            self.resumed += 1
        if len(output) < self.fed[row]:
            raise RuntimeError(
                f"row {row} came back with {len(output)} tokens after writing {self.fed[row]}: "
                "vLLM dropped tokens the pen had already stepped"
            )
        self.outputs[row] = output


def run_pens(run, request, board: Board, rows: list, sampler, params, stop: int) -> Pens:
    """One batch through the pair engine: ``run(sampling)`` is one ``generate`` call of the
    requests ``request(i, key)`` builds for each of ``rows``; the ``Pens`` that followed them,
    checked against vLLM's outputs."""
    context = torch.tensor([r.context[-1] for r in rows])  # [N]
    most = max(params.budget(r.prompt_length) for r in rows)
    pens = Pens(sampler, params, context, most, stop)
    key = f"{id(pens)}"
    PENS[key] = pens
    try:
        outs = run([request(i, f"{key}:{i}") for i in range(len(rows))])
        pens.read(board, list(range(len(rows))))  # the last step's tokens
    finally:
        PENS.pop(key, None)
    for i, out in enumerate(outs):
        if [w[0] for w in pens.written[i]] != list(out.token_ids):
            raise RuntimeError(
                f"row {i}: the pen read {len(pens.written[i])} tokens where vLLM returned "
                f"{len(out.token_ids)}; the pair engine lost track of a request"
            )
    return pens


def pen_processor() -> type:
    """The vLLM logits processor class of the pair engine (vLLM is imported lazily)."""
    from vllm.v1.sample.logits_processor import LogitsProcessor

    class PenProcessor(LogitsProcessor):
        """Maps the engine's batch rows to their ``Pens`` rows; see the module."""

        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            key = getattr(vllm_config.model_config.hf_config, "tandem_board", "")
            self.board = BOARDS.setdefault(key, Board())
            self.rows: dict[int, tuple[Pens, int]] = {}  # batch row -> (pens, row)
            self.size = 0
            self.device = device

        def is_argmax_invariant(self) -> bool:
            return False  # it forces and restricts tokens, greedy requests included

        def update_state(self, batch_update: Any) -> None:
            self._read()
            if batch_update is not None:
                self._update(batch_update)
            for slot, (pens, row) in self.rows.items():
                pens.slot[row] = slot
            authors = torch.full((self.size,), SENIOR, dtype=torch.long)
            for pens, slots, rows in self._groups():
                authors[torch.tensor(slots)] = pens.authors(rows)
            self.board.arm(authors.to(self.device))

        def _read(self) -> None:
            for pens, _, rows in self._groups():
                pens.read(self.board, rows)

        def _update(self, update: Any) -> None:
            self.size = update.batch_size
            follow_batch(self.rows, update, self._take)

        @staticmethod
        def _take(params: Any, output: list[int]) -> tuple[Pens, int] | None:
            key = (params.extra_args or {}).get(KEY)
            if key is None:
                return None
            name, row = key.rsplit(":", 1)  # "<batch key>:<row>"
            pens = PENS[name]
            pens.attach(int(row), output)
            return pens, int(row)

        def _groups(self) -> list[tuple[Pens, list[int], list[int]]]:
            groups: dict[int, tuple[Pens, list[int], list[int]]] = {}
            for slot, (pens, row) in self.rows.items():
                group = groups.setdefault(id(pens), (pens, [], []))
                group[1].append(slot)
                group[2].append(row)
            return list(groups.values())

        def apply(self, logits: Tensor) -> Tensor:
            if self.board.logits is None or self.board.logits[0].shape[0] != logits.shape[0]:
                return logits  # a warm-up run
            for pens, slots, rows in self._groups():
                pens.decide(logits, self.board, slots, rows)
            return logits

    return PenProcessor
