"""The same-vocabulary loop: a senior and a junior write N rollouts together, one token a step.

Each step, every row's author (chosen by the handoff sampler) draws a token, which is appended to
the shared context and read by *both* models, each through its own KV cache. Both models
therefore produce logits for every position anyway, so each token's raw log-prob under the
senior and under the junior is recorded on the way, for GRPO and for the drift and legibility
metrics, with no extra forward pass. Solo generation is the same loop with the ``solo`` sampler;
``junior=None`` then skips the junior altogether. With ``params.logprob_temperature`` set, each
model's log-prob of the token with its logits divided by that temperature is recorded too
(``old_logprobs``, ``ref_logprobs``): the policy loss's view.

Devices: the junior may sit on a device of its own. Between the two models' forward passes of a
step nothing waits for a device: tokens and log-probs cross devices with ``reader.move``, and the
host reads device values (``bool``, ``.item()``) only once both forwards are queued, so that a
junior on its own GPU computes while the senior does.

Randomness: two CPU generators seeded from ``params.seed``, drawn for all N rows at every step:
one gives the token draws two uniforms per row (the proposal, and a redraw where the sampler
retracts a proposal), the other the handoff sampler its coins (one at the start, two per step,
one for each ``step`` call). A row's tokens therefore depend on its logits, the seed and the step
only; the same seed gives the same rollouts, and a tandem whose coin always picks the senior
(``p=1``) reproduces solo generation token for token. The loop keeps the sampler's state (a
schedule is a value: ``tandem.samplers.base``). Rows that finish are fed the pad token with
mask 0, and the batch is compacted (rows dropped from both caches and from the sampler's state)
once an eighth of it has finished.

What this file leaves out: the passes of a call and its lockstep (``tandem.engine.generate``),
how tokens are drawn (``draw``), how a cache is read (``reader``), who authors
(``tandem.samplers``) and the rollout's layout (``layout``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tandem.engine.base import JUNIOR, PAD, SENIOR, Lockstep, SamplingParams, StopReason
from tandem.engine.draw import (
    Scores,
    coin_generator,
    draw,
    draw_mixed,
    fast,
    logprobs,
    new_buffer,
    score,
    tempered_logprobs,
)
from tandem.engine.layout import Prompts
from tandem.engine.reader import Reader, move
from tandem.runs.stop import stop_point
from tandem.samplers.base import Handoff, Sampler

# Compact the batch once this fraction of its rows has finished.
COMPACT_FRACTION = 1 / 8


class Loop:
    """One pass of a ``generate`` call over some of its prompts; ``run`` returns the fields of
    ``Rollouts`` for their rows."""

    def __init__(
        self,
        readers: list[Reader],
        sampler: Sampler,
        params: SamplingParams,
        eos: tuple[int, ...],
        pad: int,
        lockstep: Lockstep | None,
        span: tuple[int, int, int],
    ) -> None:
        self.readers = readers
        self.lockstep = lockstep
        self.codes = [SENIOR, JUNIOR][: len(readers)]
        # per model: the raw log-probs, then those at the loss's temperature when asked for
        tempered = params.logprob_temperature is not None
        names = [("senior_logprobs", "old_logprobs"), ("junior_logprobs", "ref_logprobs")]
        self.logprob_names = [n if tempered else n[:1] for n in names[: len(readers)]]
        self.home = self.readers[0].device
        self.sampler, self.params, self.pad = sampler, params, pad
        self.eos = torch.tensor(eos, dtype=torch.long, device=self.home)
        self.generator = torch.Generator().manual_seed(params.seed)
        self.coins = coin_generator(params.seed)
        # this pass's prompts (first ... stop - 1) of the call's; its rows, of the call's rows
        first, stop, prompts = span
        g = params.samples_per_prompt
        self.first, self.rows, self.all_rows = first, slice(first * g, stop * g), prompts * g

    def _rand(self, generator: torch.Generator, *shape: int) -> Tensor:
        """``[rows, *shape]`` uniforms for this pass's rows: their share of a draw over all the
        call's rows, so that a row's numbers do not depend on which pass it is in."""
        return torch.rand(self.all_rows, *shape, generator=generator)[self.rows]

    def run(self, prompts: Prompts, groups: list[list] | None = None) -> dict[str, Any]:
        """Generate for this pass's ``prompts``, each model reading them in its ``groups``
        (``Reader.prefill``)."""
        p, g = self.params, self.params.samples_per_prompt
        ids, mask = prompts.ids, prompts.mask
        groups = groups if groups is not None else [None] * len(self.readers)
        logits = [
            r.prefill(ids, mask, g, p.max_new_tokens, groups=x)
            for r, x in zip(self.readers, groups, strict=True)
        ]
        widths = [x.shape[1] for x in logits]
        assert len(set(widths)) == 1, (
            f"senior and junior logits have widths {widths}: tandem needs one vocabulary. "
            "Use a junior with the senior's tokenizer and embedding size."
        )
        n, vocab, home = logits[0].shape[0], widths[0], self.home
        self.buffers = [new_buffer(n, vocab, r.device) if fast(p) else None for r in self.readers]
        # two models' draws in one search where their weights share a device (``draw_mixed``)
        self.mixed = fast(p) and len({r.device for r in self.readers}) == 1 < len(self.readers)
        self.sampler.bind(vocab, home)
        context = ids[:, -1].repeat_interleave(g).to(home)  # [n]
        self.handoff = self.sampler.start(context, self._rand(self.coins).to(home))
        out = self._buffers(n, p.max_new_tokens)
        batch = _Batch(torch.arange(n, device=home), torch.ones(n, dtype=torch.bool, device=home))
        token = torch.full((n,), self.pad, device=home)  # [n] the last emitted token
        # rows whose context_limit leaves them fewer tokens than max_new_tokens
        budgets = [p.budget(int(k)) for k in mask.sum(1).repeat_interleave(g)]
        budget = torch.tensor(budgets, device=home) if min(budgets) < p.max_new_tokens else None
        for t in range(p.max_new_tokens):
            stop_point()  # a signal stops the run here, between decode steps
            if t > 0:
                if self.lockstep is not None:
                    self.lockstep(1)  # this process still writes: the others step with it
                logits = [r.step(token, batch.live) for r in self.readers]
            token, author, lps = self._step(logits, batch)
            for name, value in [("tokens", token), ("authors", author), *lps]:
                batch.write(out[name], t, value)
            done = self.handoff.done  # the schedule's own end (a cap on turns)
            if not self.eos.numel() and budget is None and done is None:
                continue  # nothing stops a row before max_new_tokens
            eos = torch.isin(token, self.eos)
            stopped = eos.clone()
            if budget is not None:
                stopped |= batch.take(budget) <= t + 1
            if done is not None:
                stopped |= done
            if batch.dead:
                stopped &= batch.live
            if bool(stopped.any()):
                out["stop_reasons"][batch.rows[stopped & eos]] = StopReason.EOS
                batch.finish(stopped)
                if batch.dead == batch.size:
                    break
                if batch.dead >= max(1, COMPACT_FRACTION * batch.size):
                    keep = batch.live.nonzero().squeeze(1)
                    for r in self.readers:
                        r.select(keep)
                    token = batch.keep(keep, token)
                    state = self.handoff.state
                    self.handoff = Handoff({k: v[keep] for k, v in state.items()})
        if self.lockstep is not None:
            # this process has finished: it joins the senior forwards of those still writing
            while self.lockstep(0):
                self.readers[0].idle()
        for r in self.readers:
            r.release()  # before the next pass reserves its own
        return self._finish(out, prompts)

    def _step(self, logits: list[Tensor], batch: _Batch) -> tuple[Tensor, Tensor, list]:
        """One token per batch row: its ``token [n]``, ``author [n]`` and log-probs."""
        scores = [score(x, self.params, b) for x, b in zip(logits, self.buffers, strict=True)]
        # drawn for every rollout row, dropped or not, so that a row's stream is its own
        uniforms = batch.take(self._rand(self.generator, 2).to(self.home))
        coins = batch.take(self._rand(self.coins, 2).to(self.home))
        # Finished rows still in the batch draw from the senior; their tokens are discarded.
        author = batch.where_live(self.handoff.author, SENIOR)  # [n]
        token = self._draw(scores, author, None, uniforms[:, 0])
        handoff = self.sampler.step(self.handoff.state, token, coins[:, 0])
        retract = handoff.retract
        if retract is not None and bool(retract.any()):
            # the proposal began a word another author won: that author writes this position
            again = retract.nonzero().squeeze(1)  # [R] batch rows
            allowed = self.sampler.allowed({k: v[again] for k, v in handoff.state.items()})
            author = torch.where(retract, handoff.author, author)
            token = token.clone()
            token[again] = self._draw(scores, author[again], again, uniforms[again, 1], allowed)
            redrawn = self.sampler.step(handoff.state, token, coins[:, 1])
            handoff = _merge(retract, redrawn, handoff)
        self.handoff = handoff
        token, author = batch.where_live(token, self.pad), batch.where_live(author, PAD)
        lps = []
        for names, s, r in zip(self.logprob_names, scores, self.readers, strict=True):
            tok = move(token, r.device)
            raw = logprobs(s, tok)
            values = [raw]
            if len(names) > 1:  # the policy loss's log-probs, at its temperature
                t = self.params.logprob_temperature
                values.append(raw if t == 1.0 else tempered_logprobs(s, tok, t))
            lps += [
                (name, batch.where_live(move(v, self.home), 0.0))
                for name, v in zip(names, values, strict=True)
            ]
        return token, author, lps

    def _draw(
        self,
        scores: list[Scores],
        author: Tensor,
        rows: Tensor | None,
        uniforms: Tensor,
        allowed: Tensor | None = None,
    ) -> Tensor:
        """``[r]`` tokens for batch ``rows`` (``None``: all), each from its ``author``'s model."""
        if rows is None and allowed is None and self.mixed:  # every model's rows in one search
            return draw_mixed(scores, (author == JUNIOR).long(), uniforms)
        token = torch.full_like(author, -1)
        for code, s, reader in zip(self.codes, scores, self.readers, strict=True):
            mine = author == code  # [r]
            dev = reader.device
            if bool(mine.all()):  # one author for every row: nothing to gather
                picked = None if allowed is None else allowed.to(dev)
                sub = None if rows is None else rows.to(dev)
                return draw(s, sub, uniforms.to(dev), self.params, picked).to(self.home)
            mine = mine.nonzero().squeeze(1)  # [m] positions among the rows drawn for
            if mine.numel() == 0:
                continue
            sub = mine if rows is None else rows[mine]
            picked = None if allowed is None else allowed[mine].to(dev)
            chosen = draw(s, sub.to(dev), uniforms[mine].to(dev), self.params, picked)
            token[mine] = chosen.to(self.home)
        assert bool((token >= 0).all()), "a row's author has no model: junior is None"
        return token

    def _buffers(self, n: int, t: int) -> dict[str, Any]:
        home = self.home
        return {
            "tokens": torch.full((n, t), self.pad, dtype=torch.long, device=home),
            "authors": torch.full((n, t), PAD, dtype=torch.long, device=home),
            **{name: torch.zeros(n, t, device=home) for ns in self.logprob_names for name in ns},
            "stop_reasons": torch.full((n,), int(StopReason.LENGTH), device=home),
        }

    def _finish(self, out: dict[str, Any], prompts: Prompts) -> dict[str, Any]:
        """Trim to the longest row and attach the prompts."""
        lengths = (out["authors"] != PAD).sum(1)  # [N]
        t = int(lengths.max())
        recorded = {name: out[name][:, :t] for ns in self.logprob_names for name in ns}
        return {
            "tokens": out["tokens"][:, :t],
            "authors": out["authors"][:, :t],
            "junior_logprobs": None,
            **recorded,
            "lengths": lengths,
            "stop_reasons": out["stop_reasons"],
            **prompts.rows(self.params.samples_per_prompt, self.home, self.first),
        }


class _Batch:
    """The rows the models are stepping: which rollout rows they are, and which still write.

    Finished rows stay in the batch (fed the pad token, masked) until enough have finished to
    be worth dropping from the caches. While no row has been dropped or finished, the
    bookkeeping below is skipped, so the common step costs no gathers or masks.
    """

    def __init__(self, rows: Tensor, live: Tensor) -> None:
        self.rows = rows  # [n] rollout row of each batch row
        self.live = live  # [n] bool: still writing
        self.size = rows.shape[0]
        self.whole = True  # rows == arange(N): no row dropped yet
        self.dead = 0  # finished rows still in the batch

    def take(self, full: Tensor) -> Tensor:
        """The batch rows of a tensor over all N rollout rows."""
        return full if self.whole else full[self.rows]

    def where_live(self, values: Tensor, fill: float) -> Tensor:
        """``values`` with ``fill`` at finished rows."""
        return torch.where(self.live, values, fill) if self.dead else values

    def write(self, buffer: Tensor, t: int, values: Tensor) -> None:
        """Record column ``t`` of an output ``buffer [N, T]``."""
        if self.whole:
            buffer[:, t] = values
        else:
            buffer[self.rows, t] = values

    def finish(self, stopped: Tensor) -> None:
        self.live = self.live & ~stopped
        self.dead = int((~self.live).sum())

    def keep(self, keep: Tensor, token: Tensor) -> Tensor:
        """Drop finished rows; returns the kept rows' ``token``."""
        self.rows, self.live = self.rows[keep], self.live[keep]
        self.size, self.dead, self.whole = keep.shape[0], 0, False
        return token[keep]


def _merge(rows: Tensor, chosen: Handoff, other: Handoff) -> Handoff:
    """``chosen``'s state and flags at ``rows [n]`` (bool), ``other``'s elsewhere."""
    state = {k: torch.where(rows, v, other.state[k]) for k, v in chosen.state.items()}
    done = chosen.done if other.done is None else torch.where(rows, chosen.done, other.done)
    return Handoff(state, done=done)
