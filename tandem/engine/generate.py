"""Co-generation: a senior and a junior write N rollouts together, one token per step.

Each step, every row's author (chosen by the handoff sampler) draws a token, which is appended to
the shared context and read by *both* models, each through its own KV cache. Both models
therefore produce logits for every position anyway, so each token's raw log-prob under the
senior and under the junior is recorded on the way, for GRPO and for the drift and legibility
metrics, with no extra forward pass. Solo generation is the same loop with the ``solo`` sampler;
``junior=None`` then skips the junior altogether.

Devices: the junior may sit on a device of its own. Between the two models' forward passes of a
step nothing waits for a device: tokens and log-probs cross devices with ``reader.move``, and the
host reads device values (``bool``, ``.item()``) only once both forwards are queued, so that a
junior on its own GPU computes while the senior does.

With ``params.logprob_temperature`` set, each model's log-prob of the token with its logits divided
by that temperature is recorded too (``old_logprobs``, ``ref_logprobs``): the policy loss's view.

Randomness: two CPU generators seeded from ``params.seed``, drawn for all N rows at every step:
one gives the token draws two uniforms per row (the proposal, and a redraw where the sampler
retracts a proposal), the other the handoff sampler its coins (one at the start, two per step,
one for each ``step`` call). A row's tokens therefore depend on its logits, the seed and the step
only; the same seed gives the same rollouts, and a tandem whose coin always picks the senior
(``p=1``) reproduces solo generation token for token. The engine keeps the sampler's state (a
schedule is a value: ``tandem.samplers.base``). Rows that finish are fed the pad token with
mask 0, and the batch is compacted (rows dropped from both caches and from the sampler's state)
once an eighth of it has finished.

Memory: a call whose KV caches would exceed ``params.kv_cache_gib`` (``tandem.engine.budget``)
runs in passes over consecutive whole prompt groups, joined into one ``Rollouts``. A pass draws
the whole call's random numbers at every step and keeps its own rows' (a few uniforms per row:
nothing next to a forward), and its models read each prompt as one pass over every prompt would
(the same width, in the same prefill group or a part of it). Rows never interact, so the passes
give the rollouts of one pass: the same tokens, authors, lengths and stops, and the same
log-probs wherever the matrix kernels round a row alike whatever the batch's size (on this CPU
they do from four rows up; under four, and on GPUs, in general, only within the last bits, as
the batch's compaction already makes them within one pass).

Lockstep: a senior sharded layer by layer (FSDP2 gathering each decoder layer for its forward)
makes collectives at every forward, so every process must make as many. With ``lockstep``, each
process says at every step whether it still writes; one whose rows have all finished keeps
stepping the senior with one dropped token (``Reader.idle``) until every process has finished,
and the prefill makes as many forwards everywhere (``Reader.prefill``); the processes also agree
on the number of passes, one with no prompts left for a pass stepping along idle. Without it (one
process, or a senior gathered whole for the rollout), a call stops as soon as its own rows have.

What this file leaves out: how tokens are drawn (``draw``), how a cache is read (``reader``),
who authors (``tandem.samplers``), a junior with a tokenizer of its own (``tandem.engine.cross``,
to which ``generate`` hands such a pair), and scaled-out serving (a vLLM backend, elsewhere).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tandem.engine.base import JUNIOR, PAD, SENIOR, Lockstep, Rollouts, SamplingParams, StopReason
from tandem.engine.budget import prompt_spans, warn_unsplit
from tandem.engine.cross import generate_cross, same_vocabulary
from tandem.engine.draw import (
    Scores,
    coin_generator,
    draw,
    fast,
    logprobs,
    new_buffer,
    score,
    tempered_logprobs,
)
from tandem.engine.reader import Reader, move
from tandem.samplers.base import Handoff, Sampler
from tandem.samplers.solo import SoloSampler
from tandem.samplers.word import WordSampler

# Compact the batch once this fraction of its rows has finished.
_COMPACT_FRACTION = 1 / 8


def generate(
    senior: Any,
    junior: Any | None,
    prompts: Sequence[Sequence[int]] | Sequence[Tensor],
    sampler: Sampler | None = None,
    params: SamplingParams | None = None,
    *,
    tokenizer: Any = None,
    junior_tokenizer: Any = None,
    junior_prompts: Sequence[Sequence[int]] | None = None,
    lockstep: Lockstep | None = None,
) -> Rollouts:
    """Generate ``len(prompts) * params.samples_per_prompt`` rollouts written by two models.

    Args:
        senior: the trainable Hugging Face causal LM.
        junior: the frozen partner (same tokenizer; may sit on another device), or ``None``
            for solo generation (``Rollouts.junior_logprobs`` is then ``None``).
        prompts: prompt token ids, one sequence per prompt, of any lengths.
        sampler: who authors each token; ``None`` is the solo sampler.
        params: sampling parameters; ``None`` is ``SamplingParams()``.
        tokenizer: decodes ``Rollouts.texts`` and supplies the pad id; optional.
        junior_tokenizer: the junior's, when it may differ from ``tokenizer``: a junior of
            another vocabulary writes with the word sampler through ``tandem.engine.cross``.
        junior_prompts: for such a junior, the prompts in its own ids and chat format
            (``PromptBatch.prompt_ids_for``); None re-tokenizes the senior's prompt text.
        lockstep: for a senior whose forward is a collective: every process then makes as
            many senior forwards (``tandem.engine.base.Lockstep``); ``None`` for one process.

    Returns:
        Rollouts on the senior's device, rows prompt-major.
    """
    params = params if params is not None else SamplingParams()
    sampler = sampler if sampler is not None else SoloSampler()
    if junior is None and not sampler.solo:
        raise ValueError(
            f"{sampler!r} hands tokens to the junior, but junior is None. Pass the junior "
            "model, or use the solo sampler for solo generation."
        )
    if junior is not None and not same_vocabulary(tokenizer, junior_tokenizer):
        if lockstep is not None:
            raise ValueError(
                "a junior of another vocabulary cannot write with a senior gathered layer by "
                "layer (trainer.strategy.rollout_gather=per_layer): the cross engine does not "
                "step processes in lockstep. Set trainer.strategy.rollout_gather=whole."
            )
        return _cross(
            senior, junior, prompts, sampler, params, tokenizer, junior_tokenizer, junior_prompts
        )
    eos = _eos_ids(senior, params)
    pad = _pad_id(senior, tokenizer, eos)
    ids, mask = _left_pad(prompts, pad)
    models = [senior] if junior is None else [senior, junior]
    spans = prompt_spans(models, ids.shape[0], ids.shape[1], params, lockstep)
    with _eval_mode(models), torch.inference_mode():
        # only the senior is sharded: the junior's forwards are this process's own
        readers = [Reader(senior, lockstep), *(Reader(m) for m in models[1:])]
        # a pass reads each of its prompts as one pass over all of them would
        groups = [r.prefill_groups(mask.sum(1)) for r in readers]
        parts = []
        for first, stop in spans:
            if first == stop:
                _idle_pass(readers[0], lockstep)
                continue
            loop = _Loop(readers, sampler, params, eos, pad, lockstep, (first, stop, len(ids)))
            within = [_within(g, first, stop) for g in groups]
            parts.append(loop.run(ids[first:stop], mask[first:stop], within))
        out = parts[0] if len(parts) == 1 else _join(parts, pad)
    # Clones made outside inference mode: training may save them for backward.
    out = {k: v.clone() if isinstance(v, Tensor) else v for k, v in out.items()}
    texts = None
    if tokenizer is not None:
        rows = [row[:n].tolist() for row, n in zip(out["tokens"], out["lengths"], strict=True)]
        texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
    return Rollouts(**out, pad_token_id=pad, texts=texts)


def _within(groups: list[tuple[Tensor, int]], first: int, stop: int) -> list:
    """The prefill groups of prompts ``first ... stop - 1``, indexed from ``first``."""
    out = []
    for index, width in groups:
        mine = index[(index >= first) & (index < stop)]
        if mine.numel():
            out.append((mine - first, width))
    return out


def _idle_pass(reader: Reader, lockstep: Lockstep | None) -> None:
    """A pass in which this process has no prompts left while another has: its senior makes as
    many prefill forwards as the most any process makes, then one a step while any writes."""
    assert lockstep is not None, "only processes in lockstep make empty passes"
    for _ in range(lockstep(0)):
        reader.idle()
    while lockstep(0):
        reader.idle()


def _join(parts: list[dict[str, Any]], pad: int) -> dict[str, Any]:
    """The fields of consecutive passes over a call's rows as one pass's, each ``[n, t]`` one
    padded to the widest pass's ``t`` (as ``Rollouts`` pads a row past its length)."""
    width = max(p["tokens"].shape[1] for p in parts)
    fill = {"tokens": pad, "authors": PAD}
    out: dict[str, Any] = {}
    for name, value in parts[0].items():
        if value is None:
            out[name] = None
        elif value.dim() == 2 and name != "prompt_tokens":  # [n, t]
            right = fill.get(name, 0.0)
            out[name] = torch.cat([_pad_to(p[name], width, right) for p in parts])
        else:  # [n] and the prompts, all passes at the call's prompt width
            out[name] = torch.cat([p[name] for p in parts])
    return out


def _pad_to(x: Tensor, width: int, fill: float) -> Tensor:
    """``x [n, t]`` padded on the right with ``fill`` to ``[n, width]``."""
    return F.pad(x, (0, width - x.shape[1]), value=fill)


def _cross(
    senior, junior, prompts, sampler, params, tokenizer, junior_tokenizer, junior_prompts
) -> Rollouts:
    """A junior of another vocabulary: the word schedule on text (``tandem.engine.cross``).

    It generates every row in one pass, whatever ``params.kv_cache_gib`` says: its readers'
    caches grow with what each model reads, and a pass split in two would have to split its
    random streams and its two token sequences too. Over the budget, it warns."""
    if not isinstance(sampler, WordSampler) or tokenizer is None:
        raise ValueError(
            f"the junior's tokenizer differs from the senior's, so the pair writes through "
            f"tandem.engine.cross, which serves the word sampler only, with both tokenizers; "
            f"got {sampler!r}{' and no tokenizer' if tokenizer is None else ''}. Use "
            "sampler=word with tokenizer=<the senior's> (or solo without the junior), or a "
            "junior with the senior's tokenizer."
        )
    width = max(torch.as_tensor(p).numel() for p in prompts)
    warn_unsplit([senior, junior], len(prompts), width, params)
    return generate_cross(
        senior,
        junior,
        prompts,
        sampler.p,
        params,
        tokenizer=tokenizer,
        junior_tokenizer=junior_tokenizer,
        junior_prompts=junior_prompts,
    )


class _Loop:
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

    def run(self, ids: Tensor, mask: Tensor, groups: list[list] | None = None) -> dict[str, Any]:
        """Generate for prompts ``ids`` (``[b, P]``, left-padded; ``mask`` 1 on real tokens),
        each model reading them in its ``groups`` (``Reader.prefill``)."""
        p, g = self.params, self.params.samples_per_prompt
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
                if batch.dead >= max(1, _COMPACT_FRACTION * batch.size):
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
        return self._finish(out, ids, mask, g)

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

    def _finish(self, out: dict[str, Any], ids: Tensor, mask: Tensor, g: int) -> dict[str, Any]:
        """Trim to the longest row and attach the prompts."""
        lengths = (out["authors"] != PAD).sum(1)  # [N]
        t = int(lengths.max())
        home = self.home
        recorded = {name: out[name][:, :t] for ns in self.logprob_names for name in ns}
        return {
            "tokens": out["tokens"][:, :t],
            "authors": out["authors"][:, :t],
            "junior_logprobs": None,
            **recorded,
            "lengths": lengths,
            "stop_reasons": out["stop_reasons"],
            "prompt_tokens": ids.repeat_interleave(g, dim=0).to(home),
            "prompt_lengths": mask.sum(1).repeat_interleave(g).to(home),
            "prompt_index": torch.arange(
                self.first, self.first + ids.shape[0], device=home
            ).repeat_interleave(g),
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
        self.all = torch.arange(self.size, device=rows.device)  # [n]
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
        self.all = torch.arange(self.size, device=keep.device)
        return token[keep]


def _merge(rows: Tensor, chosen: Handoff, other: Handoff) -> Handoff:
    """``chosen``'s state and flags at ``rows [n]`` (bool), ``other``'s elsewhere."""
    state = {k: torch.where(rows, v, other.state[k]) for k, v in chosen.state.items()}
    done = chosen.done if other.done is None else torch.where(rows, chosen.done, other.done)
    return Handoff(state, done=done)


def _left_pad(
    prompts: Sequence[Sequence[int]] | Sequence[Tensor], pad: int
) -> tuple[Tensor, Tensor]:
    """``ids [B, P]`` left-padded with ``pad`` and ``mask [B, P]`` (1 on real tokens)."""
    seqs = [torch.as_tensor(p, dtype=torch.long).flatten().cpu() for p in prompts]
    if not seqs or any(s.numel() == 0 for s in seqs):
        raise ValueError("prompts must be a non-empty list of non-empty token id sequences.")
    width = max(s.numel() for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - s.numel() :] = s
        mask[i, width - s.numel() :] = 1
    return ids, mask


def _eos_ids(model: Any, params: SamplingParams) -> tuple[int, ...]:
    if params.eos_token_ids is not None:
        return params.eos_token_ids
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            return (eos,) if isinstance(eos, int) else tuple(eos)
    raise ValueError(
        "the senior's generation_config and config name no eos_token_id, so rows would never "
        "stop early. Pass SamplingParams(eos_token_ids=(...)), or () to always run to "
        "max_new_tokens."
    )


def _pad_id(model: Any, tokenizer: Any, eos: tuple[int, ...]) -> int:
    sources = (tokenizer, getattr(model, "generation_config", None), model.config)
    for source in sources:
        pad = getattr(source, "pad_token_id", None)
        if pad is not None:
            return int(pad)
    return eos[0] if eos else 0


@contextlib.contextmanager
def _eval_mode(models: list[Any]) -> Iterator[None]:
    """Generate in eval mode (no dropout), then restore each model's mode."""
    modes = [m.training for m in models]
    try:
        for m in models:
            m.eval()
        yield
    finally:
        for m, mode in zip(models, modes, strict=True):
            m.train(mode)
