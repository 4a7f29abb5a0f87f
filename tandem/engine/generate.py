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

Lockstep: a senior sharded layer by layer (FSDP2 gathering each decoder layer for its forward)
makes collectives at every forward, so every process must make as many. With ``lockstep``, each
process says at every step whether it still writes; one whose rows have all finished keeps
stepping the senior with one dropped token (``Reader.idle``) until every process has finished,
and the prefill makes as many forwards everywhere (``Reader.prefill``). Without it (one process,
or a senior gathered whole for the rollout), a call stops as soon as its own rows have.

What this file leaves out: how tokens are drawn (``draw``), how a cache is read (``reader``),
who authors (``tandem.samplers``), a junior with a tokenizer of its own (``tandem.engine.cross``,
to which ``generate`` hands such a pair), and scaled-out serving (a vLLM backend, elsewhere).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from tandem.engine.base import JUNIOR, PAD, SENIOR, Lockstep, Rollouts, SamplingParams, StopReason
from tandem.engine.cache import kv_bytes_per_token
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

log = logging.getLogger(__name__)

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
    per_chunk = prompts_per_chunk(models, params, ids.shape[0], ids.shape[1], lockstep)
    with _eval_mode(models), torch.inference_mode():
        parts = []
        for lo in range(0, ids.shape[0], per_chunk):
            # every chunk draws the whole call's random numbers and keeps its own rows', so
            # the rollouts are those of one pass over all rows
            span = (lo * params.samples_per_prompt, ids.shape[0] * params.samples_per_prompt)
            loop = _Loop(models, sampler, params, eos, pad, lockstep, span)
            parts.append(loop.run(ids[lo : lo + per_chunk], mask[lo : lo + per_chunk]))
        out = parts[0] if len(parts) == 1 else _join(parts, pad)
    # Clones made outside inference mode: training may save them for backward.
    out = {k: v.clone() if isinstance(v, Tensor) else v for k, v in out.items()}
    texts = None
    if tokenizer is not None:
        rows = [row[:n].tolist() for row, n in zip(out["tokens"], out["lengths"], strict=True)]
        texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
    return Rollouts(**out, pad_token_id=pad, texts=texts)


def prompts_per_chunk(
    models: list[Any], params: SamplingParams, prompts: int, width: int, lockstep: Any = None
) -> int:
    """How many prompts (of ``samples_per_prompt`` rows each, ``width`` prompt positions plus
    ``max_new_tokens`` reserved per row) one pass may generate under ``params.kv_cache_gib``
    (None: 90% of the senior's device's free memory). Processes in lockstep agree on the
    number of chunks, so that each makes as many passes."""
    per_row = (width + params.max_new_tokens) * sum(
        kv_bytes_per_token(m.config, next(m.parameters()).dtype) for m in models
    )
    group = per_row * params.samples_per_prompt
    budget = (
        int(params.kv_cache_gib * 2**30)
        if params.kv_cache_gib is not None
        else int(0.9 * free_memory(next(models[0].parameters()).device))
    )
    if group > budget:
        raise ValueError(
            f"generation.kv_cache_gib ({params.kv_cache_gib}) holds {budget / 2**30:.2f} GiB of "
            f"KV cache, but one prompt's {params.samples_per_prompt} rows of {width} + "
            f"{params.max_new_tokens} positions need {group / 2**30:.2f} GiB. Raise "
            "generation.kv_cache_gib, or lower generation.max_new_tokens or group_size."
        )
    fits = min(prompts, budget // group)
    chunks = -(-prompts // fits)
    if lockstep is not None:
        chunks = lockstep(chunks)
    if chunks > 1:
        log.info(
            "KV cache: %d rows in %d chunks of at most %d, under %.2f GiB",
            prompts * params.samples_per_prompt,
            chunks,
            -(-prompts // chunks) * params.samples_per_prompt,
            budget / 2**30,
        )
    return -(-prompts // chunks)


def free_memory(device: torch.device) -> int:
    """Bytes free on ``device`` now (the host's available memory for the CPU)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def _join(parts: list[dict[str, Any]], pad: int) -> dict[str, Any]:
    """The outputs of consecutive chunks of rows as one call's, padded to the widest."""
    width = max(p["tokens"].shape[1] for p in parts)
    fill = {"tokens": pad, "authors": PAD}
    out: dict[str, Any] = {}
    first = 0
    for name, value in parts[0].items():
        if value is None:
            out[name] = None
        elif name == "prompt_index":
            pieces = []
            for p in parts:
                pieces.append(p[name] + first)
                first += int(p[name].max()) + 1
            out[name] = torch.cat(pieces)
        elif name in ("lengths", "stop_reasons", "prompt_lengths", "prompt_tokens"):
            out[name] = torch.cat([p[name] for p in parts])
        else:  # [n, t] per chunk
            out[name] = torch.cat(
                [
                    torch.nn.functional.pad(
                        p[name], (0, width - p[name].shape[1]), value=fill.get(name, 0.0)
                    )
                    for p in parts
                ]
            )
    return out


def _cross(
    senior, junior, prompts, sampler, params, tokenizer, junior_tokenizer, junior_prompts
) -> Rollouts:
    """A junior of another vocabulary: the word schedule on text (``tandem.engine.cross``)."""
    if not isinstance(sampler, WordSampler) or tokenizer is None:
        raise ValueError(
            f"the junior's tokenizer differs from the senior's, so the pair writes through "
            f"tandem.engine.cross, which serves the word sampler only, with both tokenizers; "
            f"got {sampler!r}{' and no tokenizer' if tokenizer is None else ''}. Use "
            "sampler=word with tokenizer=<the senior's> (or solo without the junior), or a "
            "junior with the senior's tokenizer."
        )
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
    """The state of one ``generate`` call; ``run`` returns the fields of ``Rollouts``."""

    def __init__(
        self,
        models: list[Any],
        sampler: Sampler,
        params: SamplingParams,
        eos: tuple[int, ...],
        pad: int,
        lockstep: Lockstep | None = None,
        span: tuple[int, int] | None = None,
    ) -> None:
        # only the senior is sharded: the junior's forwards are this process's own
        self.readers = [Reader(models[0], lockstep), *(Reader(m) for m in models[1:])]
        self.lockstep = lockstep
        self.codes = [SENIOR, JUNIOR][: len(models)]
        # per model: the raw log-probs, then those at the loss's temperature when asked for
        tempered = params.logprob_temperature is not None
        names = [("senior_logprobs", "old_logprobs"), ("junior_logprobs", "ref_logprobs")]
        self.logprob_names = [n if tempered else n[:1] for n in names[: len(models)]]
        self.home = self.readers[0].device
        self.sampler, self.params, self.pad = sampler, params, pad
        self.eos = torch.tensor(eos, dtype=torch.long, device=self.home)
        self.generator = torch.Generator().manual_seed(params.seed)
        self.coins = coin_generator(params.seed)
        # (first row, rows in all) of the call this pass is a chunk of (None: all of it)
        self.span = span

    def _rand(self, rows: int, k: int | None, generator: torch.Generator) -> Tensor:
        """``[rows, k]`` (``[rows]`` for ``k=None``) uniforms: this pass's rows' share of a
        draw over every row of the call."""
        first, total = self.span or (0, rows)
        shape = (total,) if k is None else (total, k)
        return torch.rand(shape, generator=generator)[first : first + rows]

    def run(self, ids: Tensor, mask: Tensor) -> dict[str, Any]:
        p, g = self.params, self.params.samples_per_prompt
        logits = [r.prefill(ids, mask, g, p.max_new_tokens) for r in self.readers]
        widths = [x.shape[1] for x in logits]
        assert len(set(widths)) == 1, (
            f"senior and junior logits have widths {widths}: tandem needs one vocabulary. "
            "Use a junior with the senior's tokenizer and embedding size."
        )
        n, vocab, home = logits[0].shape[0], widths[0], self.home
        self.buffers = [new_buffer(n, vocab, r.device) if fast(p) else None for r in self.readers]
        self.sampler.bind(vocab, home)
        context = ids[:, -1].repeat_interleave(g).to(home)  # [n]
        self.handoff = self.sampler.start(context, self._rand(n, None, self.coins).to(home))
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
        return self._finish(out, ids, mask, g)

    def _step(self, logits: list[Tensor], batch: _Batch) -> tuple[Tensor, Tensor, list]:
        """One token per batch row: its ``token [n]``, ``author [n]`` and log-probs."""
        scores = [score(x, self.params, b) for x, b in zip(logits, self.buffers, strict=True)]
        # drawn for every rollout row, dropped or not, so that a row's stream is its own
        uniforms = batch.take(self._rand(batch.everyone, 2, self.generator).to(self.home))
        coins = batch.take(self._rand(batch.everyone, 2, self.coins).to(self.home))
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
            "prompt_index": torch.arange(ids.shape[0], device=home).repeat_interleave(g),
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
        self.everyone = self.size

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
