"""Who holds the pen, token by token, inside one vLLM engine: the rows of a tandem batch.

``Pens`` holds one ``generate`` call's rows as the torch engine holds them: the sampler's state
as ``[N]`` tensors, the coins drawn ahead from the rollout's seed (one at the start, two per
response position), each row's response position, and what it has written with both models'
raw log-probs. A request carries its row (``extra_args``); the pen processor of the engine's
model runner (``tandem.engine.vllm_processors``) maps the engine's batch rows to it and calls,
at every sampling step:

- ``feed``: the token each row wrote at its last step. Its log-prob under both models comes
  from the logits of the step that sampled it (``unread``), and the sampler steps over those
  rows at once (the sampler's own ``step``, the one definition);
- ``choose``: each row's author's logits go into the batch's logits, then ``decide`` restricts
  what the schedule restricts.

The word sampler's ``onset`` rule decides at a proposed onset, before the token is kept: where
a row's coin could withdraw the proposal (``Sampler.may_retract``), ``decide`` draws the
proposal itself from the author's sampling distribution (``tandem.engine.draw``, with a uniform
drawn ahead for that position), steps the sampler over it, and either forces that token or, on
a retraction, hands vLLM the other model's logits restricted to ``sampler.allowed``, so that
vLLM's sampler draws the new author's onset (temperature, top-k and top-p after the
restriction, as in the torch engine). Everywhere else vLLM samples as it would solo.

A row's schedule lives with the row, not with the engine's batch slot: a request vLLM preempts
and re-schedules comes back to the same state, the tokens it already wrote are never stepped
again, and its author cannot change on the way (``Pens.resumed`` counts such returns).

What this file leaves out: the model (``tandem.engine.vllm_pair``), the processors
(``tandem.engine.vllm_processors``), the requests and rollouts (``tandem.engine.vllm_backend``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tandem.engine.base import SamplingParams
from tandem.engine.draw import coin_generator, draw, score
from tandem.engine.vllm_pair import Step
from tandem.samplers.base import JUNIOR, SENIOR, Sampler

# The batches in flight, by key: the processor lives in this process and reads them.
PENS: dict[str, Pens] = {}
KEY = "tandem_pen"
# pending codes of a row whose token decide() settled: none, the proposal is forced, a redraw
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
        prompts: each row's prompt length (what its request's positions count from).
        steps: the most response tokens a row may write.
        stop: the id forced once a row's schedule has ended.
    """

    sampler: Sampler | None
    params: SamplingParams
    context: Tensor
    prompts: list[int]
    steps: int
    stop: int
    state: dict[str, Tensor] = field(init=False)
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
        self.seen = [False] * n
        self.fed = [0] * n  # tokens read (and stepped) so far, per row
        # where each row's last sampled, not yet read, token's logits are: (step, its row)
        self.unread: list[tuple[Step, int] | None] = [None] * n
        self.written = [[] for _ in range(n)]  # (token, author, senior lp, junior lp)
        self.cut: list[int | None] = [None] * n  # tokens kept where the schedule ended

    # -- reading what was written ------------------------------------------------------------
    def grew(self, row: int, count: int) -> bool:
        """Whether ``row``, now at ``count`` response tokens, wrote one since it was last read
        (False: none; anything else breaks the pair engine's one token a step)."""
        if count == self.fed[row]:
            return False
        if count != self.fed[row] + 1:
            raise RuntimeError(
                f"row {row} wrote {count - self.fed[row]} tokens in one step; the pair engine "
                "needs one token per step (no speculative decoding, no async scheduling)"
            )
        return True

    def feed(self, rows: list[int], tokens: list[int]) -> None:
        """Take the token each of ``rows`` wrote at its last step, with its log-probs under
        both models from the step that sampled it, and step the sampler over them."""
        if not rows:
            return
        senior, junior = torch.empty(len(rows)), torch.empty(len(rows))
        token = torch.tensor(tokens)
        for step, at, where in _by_step([self.unread[i] for i in rows]):
            where = torch.tensor(where)
            s, j = step.logprobs(torch.tensor(at), token[where])
            senior[where], junior[where] = s, j
        for i in rows:
            self.unread[i] = None
            self.fed[i] += 1
        authors = self._step(torch.tensor(rows), token)
        for k, i in enumerate(rows):
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
        # rows whose proposal decide() already stepped (forced) or withdrew (redraw): take the
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
    def choose(self, logits: Tensor, step: Step, at: list[int], rows: list[int]) -> None:
        """Put each of ``rows``' author's logits in its batch row ``at`` of ``logits`` (which
        hold the senior's), restrict them where its schedule says so, and remember the step
        whose logits the coming token's log-probs will be read from."""
        ids = torch.tensor(rows, dtype=torch.long)
        where = torch.tensor(at, dtype=torch.long, device=logits.device)
        juniors = (self.state["author"][ids] == JUNIOR).to(logits.device)
        if bool(juniors.any()):
            logits[where[juniors]] = step.junior[where[juniors]].to(logits.dtype)
        self.decide(logits, step, where, ids)
        for k, i in enumerate(rows):
            self.unread[i] = (step, at[k])

    def decide(self, logits: Tensor, step: Step, at: Tensor, ids: Tensor) -> None:
        """Restrict ``logits`` (the batch's, in place) where a row's schedule says so: the stop
        id once it has ended; the proposal or the other author's onsets under the onset rule."""
        ended = self.ended[ids]
        if bool(ended.any()):
            only(logits, at[ended.to(at.device)], torch.tensor(self.stop).expand(int(ended.sum())))
        if self.sampler is None:
            return
        coin = self.coins[ids, self.position[ids], self.retracted[ids].long()]
        state = {k: v[ids] for k, v in self.state.items()}
        may = self.sampler.may_retract(state, coin) & ~ended
        if not bool(may.any()):
            return
        self._propose(logits, step, ids[may], at[may.to(at.device)], coin[may])

    def _propose(self, logits: Tensor, step: Step, ids: Tensor, at: Tensor, coin: Tensor):
        """Draw the author's proposal for rows ``ids`` (batch rows ``at``) and step over it."""
        assert self.sampler is not None
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
            only(logits, kept, proposal[~retract])
        if bool(retract.any()):  # withdrawn: the new author's onsets, from its own logits
            lost = at[on]
            junior = (handoff.state["author"][retract] == JUNIOR).to(logits.device)[:, None]
            other = torch.where(junior, step.junior[lost], step.senior[lost]).to(logits.dtype)
            allowed = self.sampler.allowed({k: v[retract] for k, v in handoff.state.items()})
            logits[lost] = other.masked_fill(~allowed.to(other.device), float("-inf"))

    # -- the engine's requests ---------------------------------------------------------------
    def attach(self, row: int) -> None:
        """The engine took ``row``'s request into its batch (again, after a preemption)."""
        if self.seen[row]:
            self.resumed += 1
        self.seen[row] = True

    def finish(self, outputs: list[list[int]]) -> None:
        """Read each row's last token from vLLM's outputs, and check that the pen followed
        every token vLLM returned."""
        last = [i for i, out in enumerate(outputs) if self.grew(i, len(out))]
        self.feed(last, [outputs[i][-1] for i in last])
        for i, out in enumerate(outputs):
            if [w[0] for w in self.written[i]] != list(out):
                raise RuntimeError(
                    f"row {i}: the pen read {len(self.written[i])} tokens where vLLM returned "
                    f"{len(out)}; the pair engine lost track of a request"
                )


def only(logits: Tensor, rows: Tensor, tokens: Tensor) -> None:
    """Make ``tokens [n]`` the only tokens ``rows [n]`` of ``logits`` may emit, in place."""
    logits.index_fill_(0, rows, float("-inf"))
    logits[rows, tokens.to(logits.device)] = 0.0


def _by_step(unread: list[tuple[Step, int] | None]) -> list[tuple[Step, list[int], list[int]]]:
    """The entries of each step: ``(step, its rows, their places in unread)``."""
    groups: dict[int, tuple[Step, list[int], list[int]]] = {}
    for k, entry in enumerate(unread):
        if entry is None:
            raise RuntimeError(f"a token came with no logits kept for it (entry {k})")
        step, at = entry
        group = groups.setdefault(id(step), (step, [], []))
        group[1].append(at)
        group[2].append(k)
    return list(groups.values())


def run_pens(
    run: Callable[[list[Any]], list[Any]],
    request: Callable[[int, str], Any],
    rows: list,
    sampler: Sampler | None,
    params: SamplingParams,
    stop: int,
) -> Pens:
    """One batch through the pair engine: ``run(sampling)`` is one ``generate`` call of the
    requests ``request(i, key)`` builds for each of ``rows``; the ``Pens`` that followed them,
    checked against vLLM's outputs."""
    context = torch.tensor([r.context[-1] for r in rows])  # [N]
    most = max(params.budget(r.prompt_length) for r in rows)
    pens = Pens(sampler, params, context, [len(r.context) for r in rows], most, stop)
    key = f"{id(pens)}"
    PENS[key] = pens
    try:
        outs = run([request(i, f"{key}:{i}") for i in range(len(rows))])
        pens.finish([list(out.token_ids) for out in outs])
    finally:
        PENS.pop(key, None)
    return pens


def pens_of(params: Any) -> tuple[Pens, int] | None:
    """The batch and row a request's ``SamplingParams`` carry (None: not a pen request)."""
    key = (getattr(params, "extra_args", None) or {}).get(KEY)
    if key is None:
        return None
    name, row = key.rsplit(":", 1)  # "<batch key>:<row>"
    pens = PENS.get(name)
    if pens is None:
        raise RuntimeError(f"a request of batch {name} reached the engine after its batch ended")
    pens.attach(int(row))
    return pens, int(row)
