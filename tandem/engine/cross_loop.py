"""The cross-vocabulary loop: two models with vocabularies of their own take turns on one text
(``tandem.engine.cross`` builds the partners and the rollouts; this file steps them).

Reading: an author's text passes to the other model, in the other's tokens (``tandem.engine
.vocabulary``: byte for byte, so the two sequences always spell the same text), before each
space-led token the author proposes (the text before it is whole words, which tokenize apart as
they would together: the pair check, ``split_problem``, holds both tokenizers to it), at each
change of pen, and at the row's end. A model reads a row's queue when it writes there: its own
last token, or, when the pen has just come to it, everything the other wrote since its last turn,
in one packed forward (``tandem.engine.packed``: only the tokens really read go through the
layers, each row's however many), then draws. Each step gives the models turns junior, senior,
junior, so the new author of a row has its turn right after the change of pen (after the step's
last turn, one junior turn passes first), and the junior, whose tokens are usually shorter,
writes up to two tokens a step to the senior's one. Reading late costs nothing: the tokens go
through the layers once either way, and a model makes no forward in a turn with nothing to write.
Models that cannot be read packed (not sdpa, or sliding-window layers) read right-padded blocks
instead (``tandem.engine.block``), with the same results. A change of pen inside a word (the
``after_boundary`` rule, ``max_gap_tokens``, the token schedule) gives each model the other's
piece of the word in its own tokens, which need not be how it would tokenize the whole word; the
loss never depends on that, since it reads the senior's own sequence.

Randomness: the token draws and the coins come from two CPU generators seeded from
``params.seed`` (``tandem.engine.draw``), one uniform per row per turn each (the first coin
from the coins' stream too).

Lengths: a row stops on either model's EOS (the other model's sequence gets its own EOS), when
the schedule ends it (``Handoff.done``), or when the senior's sequence could exceed the row's
budget (``max_new_tokens`` / ``context_limit``): text the senior has not read yet is counted at
one token per byte, an upper bound, so a row whose junior writes last may stop a few tokens
early; the junior's own sequence is as long as it needs to be.

What this file leaves out: building the partners and the rollouts (``tandem.engine.cross``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tandem.engine.base import JUNIOR, PAD, SENIOR, SamplingParams, StopReason
from tandem.engine.draw import Scores, coin_generator, draw, fast, new_buffer, score
from tandem.engine.layout import Prompts
from tandem.engine.vocabulary import Vocabulary
from tandem.runs.stop import stop_point
from tandem.samplers.base import Sampler, State

# Compact the batch once this fraction of its rows has finished (as the one-vocabulary loop).
_COMPACT_FRACTION = 1 / 8
# Every so many steps, each block reader's cache drops the columns its rows did not read.
_DROP_HIDDEN_EVERY = 16


@dataclass
class Partner:
    """One partner: its reader, vocabulary, sampler over its ids, and code."""

    reader: Any
    vocab: Vocabulary
    sampler: Sampler  # the schedule over this model's ids, bound to its logits
    code: int
    eos: Tensor  # [E] its EOS ids
    pad: int
    prompts: Prompts
    spaced: Tensor  # [V] bool: space-led tokens, before which its text may be cut
    nbytes: Tensor  # [V] long: bytes each token spells (0 for special tokens)
    context: Tensor  # [N] each rollout row's last prompt token

    @property
    def tokenizer(self) -> Any:
        return self.vocab.tokenizer


class CrossLoop:
    """The state of one ``generate_cross`` call.

    Every token a model's sequence gains (its own, or the other author's words in its tokens) is
    queued for it to read: its cache has read ``read[m]`` of its ``length[m]`` tokens. In its turn
    a model reads all its queued tokens of the rows it writes (and of rows that have ended), then
    draws for the live ones and steps their schedule. Batch rows (``[n]`` tensors, the schedule's
    state among them) shrink as rows finish; sequences live in ``[N, cap]`` buffers indexed by
    rollout row (``self.rows`` maps a batch row to its rollout row). A finished row stays until
    the other model has read its last words, so that both sequences carry log-probs.
    """

    def __init__(self, senior: Partner, junior: Partner, params: SamplingParams) -> None:
        self.models = (junior, senior)  # indexed by code: JUNIOR = 0, SENIOR = 1
        self.params = params
        self.home = senior.reader.device
        self.generator = torch.Generator().manual_seed(params.seed)
        self.coins = coin_generator(params.seed)
        # writer code -> {its token chunk: the other model's tokens of its text}
        self._translations: dict[int, dict[tuple[int, ...], list[int]]] = {SENIOR: {}, JUNIOR: {}}
        self._buffers_of_weights: dict[int, Tensor] = {}  # code -> [N, B * S], see ``_draw``

    @property
    def author(self) -> Tensor:
        """``[n]`` who writes each batch row's next token."""
        return self.state["author"]

    def run(self) -> None:
        params, g, home = self.params, self.params.samples_per_prompt, self.home
        self.last = {}  # code -> [n, V] logits after the last token each row's model read
        for m in self.models:
            logits = m.reader.prefill(m.prompts.ids, m.prompts.mask, g, params.max_new_tokens)
            self.last[m.code] = logits.to(home)
        n = self.last[SENIOR].shape[0]
        self.total = n
        lengths = self.models[SENIOR].prompts.lengths.repeat_interleave(g)
        self.budget = torch.tensor([params.budget(int(k)) for k in lengths], device=home)  # [N]
        self._buffers(n)
        self.rows = torch.arange(n, device=home)  # [n] rollout row of each batch row
        senior = self.models[SENIOR]
        coins = torch.rand(n, generator=self.coins).to(home)
        # the loop writes into the state row by row: its own copy
        state = senior.sampler.start(senior.context, coins).state
        self.state = {k: v.clone() for k, v in state.items()}
        # the first author's memory of the last token, in its own ids
        self._reexpress(self.author == JUNIOR, self.models[JUNIOR])
        self.redraw = torch.zeros(n, dtype=torch.bool, device=home)  # [n] from sampler.allowed
        self.live = torch.ones(n, dtype=torch.bool, device=home)  # [n]
        self._loop()

    def _loop(self) -> None:
        """Step until every row has finished and both models have read all of it."""
        steps = 0
        while self.rows.numel():
            stop_point()  # a signal stops the run here, between decode steps
            self._step()
            steps += 1
            if steps % _DROP_HIDDEN_EVERY == 0:
                for m in self.models:
                    m.reader.tidy()
            busy = self.live.clone()  # [n] rows still writing, or still being read
            for m in self.models:
                busy |= self.read[m.code][self.rows] < self.length[m.code][self.rows]
            idle = int((~busy).sum())
            if idle == busy.shape[0] or idle >= max(1, _COMPACT_FRACTION * busy.shape[0]):
                self._compact(busy.nonzero().squeeze(1))

    # -- one step ------------------------------------------------------------------------------
    def _step(self) -> None:
        """Turns junior, senior, junior (see the module): a change of pen in one turn is taken
        up by the other model in the next."""
        for code in (JUNIOR, SENIOR, JUNIOR):
            self._turn(self.models[code])

    def _turn(self, m: Partner) -> None:
        """``m`` reads the rows it writes, draws a token in each, and its schedule says whether
        the token is kept and who writes next; text passes to the other model where it must."""
        home = self.home
        # drawn for every rollout row, dropped or not, so that a row's stream is its own
        uniforms = torch.rand(self.total, generator=self.generator).to(home)[self.rows]
        coins = torch.rand(self.total, generator=self.coins).to(home)[self.rows]
        self._read(m)
        ready = self.live & (self.author == m.code)
        ready &= self.read[m.code][self.rows] == self.length[m.code][self.rows]
        rows = ready.nonzero().squeeze(1)  # [r]
        if rows.numel() == 0:
            return
        state = {k: v[rows] for k, v in self.state.items()}
        token = self._draw(m, rows, uniforms[rows], state)  # [r]
        handoff = m.sampler.step(state, token, coins[rows])
        retract = handoff.retract
        retract = torch.zeros_like(token, dtype=torch.bool) if retract is None else retract
        # the text before a space-led proposal is whole words; a retraction hands the pen over
        self._pass_words(rows[m.spaced[token] | retract], m)
        done = handoff.done
        kept = ~retract
        self._emit(m, rows[kept], token[kept], None if done is None else done[kept])
        for k, v in handoff.state.items():
            self.state[k][rows] = v
        self.redraw[rows] = retract
        # the rows whose pen passes: after the kept token, or instead of the retracted one
        passes = rows[self.live[rows] & (handoff.author != m.code)]
        if passes.numel():
            self._pass_words(passes, m)
            other = self.models[1 - m.code]
            self._reexpress(passes, other)
            # the new author's turn begins after the words it has just been given
            full = self.rows[passes]
            self.sync[full] = self.length[other.code][full]

    def _reexpress(self, rows: Tensor, m: Partner) -> None:
        """The schedule's token ids of batch ``rows`` (``[r]`` indices or ``[n]`` bool) in
        ``m``'s vocabulary: its own last token of each row's text."""
        full = self.rows[rows]
        length = self.length[m.code][full]
        last = self.out[m.code]["tokens"][full, (length - 1).clamp(min=0)]
        last = torch.where(length > 0, last, m.context[full])
        for key in m.sampler.token_state:
            if key in self.state:
                self.state[key][rows] = last

    def _draw(self, m: Partner, rows: Tensor, uniforms: Tensor, state: State) -> Tensor:
        """``[r]`` tokens from ``m`` for batch ``rows``; rows redrawing a retracted position
        draw from what ``m``'s schedule allows there."""
        dev = m.reader.device
        logits = self.last[m.code][rows].to(dev)  # [r, V]
        # at temperature 1 the rows' weights go to a buffer kept for the call: a free row's draw
        # is then the one it would be from its own weights, and nothing is allocated a turn
        s = score(logits, self.params, self._weights(m.code, logits))
        restricted = self.redraw[rows]  # [r]
        token = torch.empty(rows.shape[0], dtype=torch.long, device=dev)
        free = (~restricted).nonzero().squeeze(1)
        if free.numel():
            token[free.to(dev)] = draw(s, free.to(dev), uniforms[free].to(dev), self.params)
        again = restricted.nonzero().squeeze(1)
        if again.numel():
            # from the logits masked to what is allowed, as without the buffer
            plain = Scores(s.logits, s.lse, None, None)
            allowed = m.sampler.allowed({k: v[again] for k, v in state.items()})  # [q, V]
            picked = draw(
                plain, again.to(dev), uniforms[again].to(dev), self.params, allowed.to(dev)
            )
            token[again.to(dev)] = picked
        return token.to(self.home)

    def _weights(self, code: int, logits: Tensor) -> Tensor | None:
        """Model ``code``'s ``[N, B * S]`` buffer for ``score`` (``None`` off the fast path)."""
        if not fast(self.params):
            return None
        if code not in self._buffers_of_weights:
            self._buffers_of_weights[code] = new_buffer(self.total, logits.shape[1], logits.device)
        return self._buffers_of_weights[code]

    def _read(self, m: Partner) -> None:
        """Model ``m`` reads its queued tokens of the rows it writes and of rows that have ended,
        and records its log-prob of each (a drawn token gets the figure it was drawn with again;
        the other's words get their teacher-forced one)."""
        code, rows, home = m.code, self.rows, self.home
        start = self.read[code][rows]  # [n]
        count = self.length[code][rows] - start  # [n]
        # rows it is writing (or that have ended); the others' words wait until its turn comes
        count = torch.where((self.author == code) | ~self.live, count, 0)
        sel = (count > 0).nonzero().squeeze(1)  # [r] batch rows with something to read
        if sel.numel() == 0:
            return
        counts = count[sel]  # [r]
        total = int(counts.sum())
        offsets = torch.arange(total, device=home) - (counts.cumsum(0) - counts).repeat_interleave(
            counts, output_size=total
        )  # [M] each token's place in its row's queue
        at = sel.repeat_interleave(counts, output_size=total)  # [M] batch row of each token
        full, cols = rows[at], start[at] + offsets  # [M] each
        seq = self.out[code]
        picked = seq["tokens"][full, cols]  # [M]
        logits = m.reader.feed(sel, picked, counts).to(home)  # [M, V]
        # the logits before each read token: the row's last ones, or its previous token's
        before = torch.cat([self.last[code][sel], logits])  # [r + M, V]
        index = torch.arange(total, device=home) + sel.shape[0] - 1  # the previous token's
        first = (offsets == 0).nonzero().squeeze(1)
        index[first] = torch.arange(sel.shape[0], device=home)  # the row's last logits
        self._record(seq, full, cols, before, index, picked)
        self.last[code][sel] = logits[counts.cumsum(0) - 1]
        self.read[code][rows[sel]] = start[sel] + counts

    def _record(
        self, seq: dict, full: Tensor, cols: Tensor, logits: Tensor, index: Tensor, picked: Tensor
    ) -> None:
        """Record ``seq``'s log-probs of tokens ``picked [M]`` (rows ``full``, columns ``cols``)
        under ``logits[index]``: raw, and at the loss temperature if it is set."""
        lp = logits.log_softmax(-1)[index]  # [M, V]
        seq["logprobs"][full, cols] = lp.gather(1, picked[:, None]).squeeze(1)
        t = self.params.logprob_temperature
        if t is not None:
            tempered = (logits / t).log_softmax(-1)[index]
            seq["old"][full, cols] = tempered.gather(1, picked[:, None]).squeeze(1)

    def _pass_words(self, batch_rows: Tensor, writer: Partner, eos: Tensor | None = None) -> None:
        """Give the other model ``writer``'s text of batch ``batch_rows`` since ``sync``, in its
        own tokens, appended to its sequence for it to read.

        ``eos``: ``[r]`` bool, the rows whose text ends with the writer's EOS, which becomes the
        reader's own.
        """
        if batch_rows.numel() == 0:
            return
        reader = self.models[1 - writer.code]
        rows = self.rows[batch_rows]  # [r] rollout rows
        ends, starts = self.length[writer.code][rows], self.sync[rows]  # [r] each
        # Rows with no words since ``sync`` and no end to give have nothing to pass (a row whose
        # proposal was withdrawn passed its words just before): they are left as they are.
        give = ends > starts if eos is None else (ends > starts) | eos
        if not bool(give.all()):
            keep = give.nonzero().squeeze(1)
            if keep.numel() == 0:
                return
            rows, ends, starts = rows[keep], ends[keep], starts[keep]
            eos = None if eos is None else eos[keep]
        spans = list(zip(starts.tolist(), ends.tolist(), strict=True))
        first = min(a for a, _ in spans)  # only the columns the words are in become lists
        ids = self.out[writer.code]["tokens"][rows, first : max(b for _, b in spans)].tolist()
        chunks = [tuple(row[a - first : b - first]) for row, (a, b) in zip(ids, spans, strict=True)]
        encoded = self._translate(writer, reader, chunks)
        if eos is not None and reader.eos.numel() and bool(eos.any()):
            eos_id = int(reader.eos[0])
            encoded = [[*x, eos_id] if e else x for x, e in zip(encoded, eos.tolist(), strict=True)]
        self._append(reader.code, rows, encoded, writer.code)
        self.sync[rows] = ends
        if reader.code == SENIOR:
            self.unread[rows] = 0

    def _translate(self, writer: Partner, reader: Partner, chunks: list[tuple[int, ...]]) -> list:
        """``reader``'s tokens of the bytes each of ``writer``'s token ``chunks`` spells. A
        batch's words repeat, so each chunk is translated once per call."""
        known = self._translations[writer.code]
        new = list({c for c in chunks if c not in known})
        if new:
            encoded = reader.vocab.encode([writer.vocab.spelt(c) for c in new])
            known.update(zip(new, encoded, strict=True))
        return [known[c] for c in chunks]

    def _append(self, code: int, rows: Tensor, ids: list[list[int]], author: int) -> None:
        """Append ``ids[i]`` (written by ``author``) to model ``code``'s sequence of rollout
        row ``rows[i]`` (distinct rows)."""
        home = self.home
        sizes = torch.tensor([len(x) for x in ids], device=home)  # [r]
        total = int(sizes.sum())
        if total == 0:
            return
        start = self.length[code][rows]  # [r]
        self._ensure(code, int((start + sizes).max()))
        offsets = torch.arange(total, device=home) - (sizes.cumsum(0) - sizes).repeat_interleave(
            sizes, output_size=total
        )
        r = rows.repeat_interleave(sizes, output_size=total)
        c = start.repeat_interleave(sizes, output_size=total) + offsets
        seq = self.out[code]
        seq["tokens"][r, c] = torch.tensor([t for x in ids for t in x], device=home)
        seq["authors"][r, c] = author
        self.length[code][rows] = start + sizes

    def _emit(self, m: Partner, rows: Tensor, tok: Tensor, done: Tensor | None) -> None:
        """Append ``tok [r]`` to ``m``'s sequence of batch ``rows``; stop the rows that end
        (``done``: where the schedule ends them)."""
        if rows.numel() == 0:
            return
        full = self.rows[rows]  # [r] rollout rows
        at = self.length[m.code][full]  # [r]
        self._ensure(m.code, int(at.max()) + 1)
        seq = self.out[m.code]
        seq["tokens"][full, at] = tok
        seq["authors"][full, at] = m.code
        self.length[m.code][full] = at + 1
        if m.code == JUNIOR:
            self.unread[full] += m.nbytes[tok]
        ended = torch.isin(tok, m.eos)  # [r]
        stop = ended | (self.length[SENIOR][full] + self.unread[full] >= self.budget[full])
        if done is not None:
            stop |= done
        if bool(stop.any()):
            self._stop(m, rows[stop], at[stop], tok[stop], ended[stop])

    def _stop(self, m: Partner, rows: Tensor, at: Tensor, tok: Tensor, ended: Tensor) -> None:
        """Batch ``rows`` end with ``tok`` (at ``at``), by ``m``: the other model gets their
        last words; ``ended`` rows ended on ``m``'s EOS."""
        full = self.rows[rows]
        self.stop_reasons[full[ended]] = int(StopReason.EOS)
        # a finished row's last token is read by no one: its log-prob is taken here
        logits, picked = self.last[m.code][rows], tok[:, None]  # [s, V], [s, 1]
        seq = self.out[m.code]
        seq["logprobs"][full, at] = logits.log_softmax(-1).gather(1, picked).squeeze(1)
        t = self.params.logprob_temperature
        if t is not None:
            seq["old"][full, at] = (logits / t).log_softmax(-1).gather(1, picked).squeeze(1)
        self.read[m.code][full] = at + 1
        self._pass_words(rows, m, eos=ended)
        self.live[rows] = False

    # -- bookkeeping ---------------------------------------------------------------------------
    def _buffers(self, n: int) -> None:
        cap, home = self.params.max_new_tokens, self.home
        self.out: dict[int, dict[str, Tensor]] = {}
        self.length: dict[int, Tensor] = {}
        self.read: dict[int, Tensor] = {}
        for m in self.models:
            self.out[m.code] = {
                "tokens": torch.full((n, cap), m.pad, dtype=torch.long, device=home),
                "authors": torch.full((n, cap), PAD, dtype=torch.long, device=home),
                "logprobs": torch.zeros(n, cap, device=home),
                "old": torch.zeros(n, cap, device=home),
            }
            self.length[m.code] = torch.zeros(n, dtype=torch.long, device=home)  # [N]
            self.read[m.code] = torch.zeros(n, dtype=torch.long, device=home)  # [N]
        # [N] where the author's words not yet given to the other model begin (its sequence)
        self.sync = torch.zeros(n, dtype=torch.long, device=home)
        self.unread = torch.zeros(n, dtype=torch.long, device=home)  # [N] bytes the senior lacks
        self.stop_reasons = torch.full((n,), int(StopReason.LENGTH), device=home)  # [N]

    def _ensure(self, code: int, width: int) -> None:
        """Widen model ``code``'s buffers (by doubling) to hold ``width`` tokens per row."""
        seq = self.out[code]
        have = seq["tokens"].shape[1]
        if width <= have:
            return
        extra = max(have, width - have)
        fills = {"tokens": self.models[code].pad, "authors": PAD, "logprobs": 0.0, "old": 0.0}
        for k, v in seq.items():
            seq[k] = torch.cat([v, torch.full((v.shape[0], extra), fills[k]).to(v)], dim=1)

    def _compact(self, keep: Tensor) -> None:
        """Keep only batch rows ``keep`` in both caches and in the row state."""
        for m in self.models:
            m.reader.select(keep)
            self.last[m.code] = self.last[m.code][keep]
        self.rows, self.live, self.redraw = self.rows[keep], self.live[keep], self.redraw[keep]
        self.state = {k: v[keep] for k, v in self.state.items()}
