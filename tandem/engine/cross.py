"""Co-generation across vocabularies: a senior and a junior with tokenizers of their own.

The shared response is text. Each model keeps its own token sequence of it and reads it through
its own KV cache; the pen passes only where both tokenizations agree on a split, so neither
model ever sees a word cut in two. The rule (the word schedule's, on text):

1. the author proposes a token from its sampling distribution;
2. if the token starts with a space (a word onset under both pre-tokenizers: the pair check,
   ``split_problem``, refuses a tokenizer whose pre-tokenizer does not split before a space),
   the words before it are complete, and a coin picks the next word's author, the senior with
   probability ``p``; if the author keeps the pen, the token is emitted;
3. otherwise the proposal is withdrawn, and the new author, once it has read the other's words,
   draws a token restricted to its own space-led tokens, so it starts a word rather than
   finishing the other's.

Reading: whenever an author's words are complete (at every proposed onset), they are re-tokenized
into the other model's tokens and appended to its sequence, marked with their author. A model reads
a row's queue when it writes there: its own last token, or, when the pen has just come to it,
everything the other wrote since its last turn, in one packed forward (``tandem.engine.packed``:
only the tokens really read go through the layers, each row's however many), then draws. Each step
gives the models turns junior, senior, junior, so the new author of a row has its turn right after
the change of pen (after the step's last turn, one junior turn passes first), and the junior, whose
tokens are usually shorter, writes up to two tokens a step to the senior's one. Reading late costs
nothing: the tokens go through the layers once either way, and a model makes no forward in a turn
with nothing to write. Models that cannot be read packed (not sdpa, or sliding-window layers) read
right-padded blocks instead (``_BlockReader``), with the same results. Re-tokenizing word by word
equals tokenizing the whole text under such pre-tokenizers (``tests/engine/test_cross.py`` checks
it on the tiny world); the loss never depends on it anyway, since it reads the senior's own
sequence.

What the rollout holds (``CrossRollouts``): ``tokens``/``authors`` are the senior's sequence,
the loss's: its own tokens with the log-probs it sampled them with, and the junior's words in
senior tokens, marked JUNIOR, with the senior's teacher-forced log-probs of them (taken as it
reads them, at no extra cost). ``junior`` holds the junior's own sequence likewise, with
its log-probs (the legibility metrics' per-byte figures). ``junior_logprobs`` and
``ref_logprobs`` are ``None``: no per-token junior figure exists on the senior's tokens.

Randomness: the token draws and the coins come from two CPU generators seeded from
``params.seed`` (``tandem.engine.draw``), one uniform per row per turn each.

Lengths: a row stops on either model's EOS (the other model's sequence gets its own EOS), or when
the senior's sequence could exceed the row's budget (``max_new_tokens`` / ``context_limit``):
text the senior has not read yet is counted at one token per byte of its decoded text, an upper
bound, so a row whose junior writes last may stop a few tokens early; the junior's own sequence
is as long as it needs to be.

What this file leaves out: the same-vocabulary loop (``tandem.engine.generate``), the word
sampler's ``max_gap_tokens``, ``rule`` and ``boundary`` options (a forced change inside a run
with no spaces would cut a word in two, which a cross pair cannot read: here only ``p`` counts),
and the sentence and step schedules (refused by ``generate``).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tandem.engine.base import JUNIOR, PAD, SENIOR, Rollouts, SamplingParams, StopReason
from tandem.engine.cache import reserved
from tandem.engine.draw import coin_generator, draw, score
from tandem.engine.packed import PackedReader, packable
from tandem.engine.reader import Reader
from tandem.metrics.per_byte import byte_table
from tandem.samplers.boundaries import token_surfaces

# Compact the batch once this fraction of its rows has finished (as ``generate`` does).
_COMPACT_FRACTION = 1 / 8
# Every so many steps, each block reader's cache drops the columns its rows did not read
# (``tidy``) when at least ``_HIDDEN_COLUMNS_WORTH_DROPPING`` of them can go.
_DROP_HIDDEN_EVERY = 16
_HIDDEN_COLUMNS_WORTH_DROPPING = 16


@dataclass(frozen=True)
class Sequences:
    """One model's own token sequences of the shared responses, ``[N, T']`` aligned.

    Attributes:
        tokens: its token ids (its pad id past each row's length).
        authors: who wrote the text each token spells: SENIOR, JUNIOR, or PAD past the end.
        logprobs: the model's raw log-prob of each token (drawn, or teacher-forced on the
            other author's words).
        lengths: tokens per row.
        prompt_tokens: its prompts, left-padded.
        prompt_lengths: each row's prompt length.
        texts: each response decoded with its tokenizer (special tokens skipped).
        byte_lengths: ``[N, T']`` bytes each token spells (0 for special tokens and padding).
    """

    tokens: Tensor  # [N, T'] long
    authors: Tensor  # [N, T'] long
    logprobs: Tensor  # [N, T'] float32
    lengths: Tensor  # [N] long
    prompt_tokens: Tensor  # [N, P'] long
    prompt_lengths: Tensor  # [N] long
    texts: list[str]
    byte_lengths: Tensor  # [N, T'] long


@dataclass(frozen=True)
class CrossRollouts(Rollouts):
    """``Rollouts`` of a cross-vocabulary pair: the senior's sequence, plus ``junior``'s own."""

    junior: Sequences | None = None


@dataclass
class _Model:
    """One partner: its model reader, tokenizer, surfaces and code."""

    reader: Any
    tokenizer: Any
    code: int
    eos: Tensor  # [E] its EOS ids
    pad: int
    spaced: Tensor  # [V] bool: tokens whose surface starts with a space (never special)
    nbytes: Tensor  # [V] long: bytes each token spells (0 for special tokens)
    # [V] long: the most bytes a token's text takes once decoded (a partial UTF-8 character
    # alone decodes to U+FFFD, 3 bytes), which bounds the other model's tokens of it
    bound: Tensor


def generate_cross(
    senior: Any,
    junior: Any,
    prompts: Sequence[Sequence[int]] | Sequence[Tensor],
    p: float,
    params: SamplingParams,
    *,
    tokenizer: Any,
    junior_tokenizer: Any,
    junior_prompts: Sequence[Sequence[int]] | None = None,
) -> CrossRollouts:
    """Rollouts written by a senior and a junior of different vocabularies (see the module).

    Args:
        senior, junior: Hugging Face causal LMs.
        prompts: the prompts in the senior's token ids.
        p: the probability that the senior writes a given word.
        params: sampling parameters (their EOS ids, if given, are the senior's; ``()`` turns
            off EOS for both models).
        tokenizer, junior_tokenizer: each model's tokenizer.
        junior_prompts: the same prompts in the junior's ids; ``None`` re-tokenizes the
            senior's prompt text (right when both use the same chat format, as the tiny world's
            pair does; give the junior's own chat template's prompts otherwise).
    """
    # imported here, not at the top: generate imports this module to dispatch to it
    from tandem.engine.generate import _eos_ids, _eval_mode, _left_pad, _pad_id

    if junior_prompts is None:
        texts = tokenizer.batch_decode([list(map(int, x)) for x in prompts])
        junior_prompts = junior_tokenizer(texts, add_special_tokens=False)["input_ids"]
    eos_s = _eos_ids(senior, params)
    # the junior's own EOS ids, unless the caller turned EOS off for the row (``()``)
    eos_j = () if params.eos_token_ids == () else _eos_ids(junior, SamplingParams())
    pad_s, pad_j = _pad_id(senior, tokenizer, eos_s), _pad_id(junior, junior_tokenizer, eos_j)
    ids_s, mask_s = _left_pad(prompts, pad_s)
    ids_j, mask_j = _left_pad(junior_prompts, pad_j)
    with _eval_mode([senior, junior]), torch.inference_mode():
        loop = _CrossLoop(
            _model(senior, tokenizer, SENIOR, eos_s, pad_s),
            _model(junior, junior_tokenizer, JUNIOR, eos_j, pad_j),
            p,
            params,
        )
        out = loop.run((ids_s, mask_s), (ids_j, mask_j))
    # cloned outside inference mode: training may save them for backward
    return _cloned(out)


# Texts on which a pair's tokenizers must both split before every space (the pair check): prose,
# arithmetic in the tiny world's style, LaTeX, code, runs of spaces and newlines.
PROBE_TEXTS = (
    "We begin with 41 toy cars.\n\nMultiplying by 4 gives 41 * 4 = 164 toy cars.",
    "So the final count is \\boxed{200}. It's (about) 3.5 km, isn't it?",
    "Let $x^2 + y_1 = \\frac{1}{2}$ and  two  spaces,\n then a newline and\ttab.",
    "def f(a, b):\n    return a + b  # ok",
)


def split_problem(tokenizer: Any, texts: Sequence[str] = PROBE_TEXTS) -> str | None:
    """Why ``tokenizer`` cannot take part in a cross-vocabulary pair, or None.

    The pen passes before a space; each model then reads the new text on its own. That is exact
    only if tokenizing the text in pieces cut before a space gives the tokens of the whole (the
    pre-tokenizer splits there: Qwen's, GPT-2's, Llama 3's do; one whose words carry the space
    after them does not), if decoding the tokens gives the text back, and if its words begin
    with a space-led token (the word onsets the pen passes at).
    """
    spaced = _tables(tokenizer)[0]
    for text in texts:
        whole = tokenizer(text, add_special_tokens=False)["input_ids"]
        back = tokenizer.decode(whole, skip_special_tokens=True)
        if back != text:
            return f"decoding its tokens of {text!r} gives {back!r}, not the text"
        cuts = [i for i in range(1, len(text)) if text[i] == " "]
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        joined = [
            t for piece in pieces for t in tokenizer(piece, add_special_tokens=False)["input_ids"]
        ]
        if joined != whole:
            return (
                f"tokenizing {text!r} word by word (cut before each space) gives other tokens "
                "than tokenizing it whole: its pre-tokenizer does not split before a space"
            )
        if not any(bool(spaced[t]) for t in whole):
            return f"none of its tokens of {text!r} starts with a space"
    return None


def same_vocabulary(tokenizer: Any, other: Any) -> bool:
    """Whether two tokenizers map every token to the same id (then the one-loop engine serves)."""
    if tokenizer is other or tokenizer is None or other is None:
        return True  # nothing to tell them apart: the one-loop engine checks the logits' widths
    return len(tokenizer) == len(other) and tokenizer.get_vocab() == other.get_vocab()


def _cloned(x: Any) -> Any:
    """A copy of a dataclass of tensors (nested), every tensor cloned."""
    fields = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
    for k, v in fields.items():
        if isinstance(v, Tensor):
            fields[k] = v.clone()
        elif dataclasses.is_dataclass(v):
            fields[k] = _cloned(v)
    return type(x)(**fields)


# tokenizer -> its (spaced, nbytes, bound) tables, built once per tokenizer: a training run
# generates with the same two tokenizers at every step, and a 151k vocabulary takes a while
_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tables(tokenizer: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``[V]`` tables over ``tokenizer``'s ids: space-led, bytes spelt, bytes once decoded."""
    if tokenizer not in _TABLES:
        surfaces = token_surfaces(tokenizer)
        spaced = [s is not None and s[:1] == b" " for s in surfaces]
        bound = [0 if s is None else len(s.decode("utf-8", "replace").encode()) for s in surfaces]
        _TABLES[tokenizer] = (torch.tensor(spaced), byte_table(tokenizer), torch.tensor(bound))
    return _TABLES[tokenizer]


def _model(model: Any, tokenizer: Any, code: int, eos: tuple[int, ...], pad: int) -> _Model:
    reader = PackedReader(model) if packable(model) else _BlockReader(model)
    # ids past the tokenizer (padding rows of the logits) spell nothing and begin no word
    width = model.get_output_embeddings().weight.shape[0]
    tables = [torch.cat([t, t.new_zeros(max(0, width - t.numel()))]) for t in _tables(tokenizer)]
    spaced, nbytes, bound = (t.to(reader.device) for t in tables)
    eos_ids = torch.tensor(eos, dtype=torch.long, device=reader.device)
    return _Model(reader, tokenizer, code, eos_ids, pad, spaced, nbytes, bound)


class _BlockReader(Reader):
    """A ``Reader`` that also reads a right-padded block of tokens per row in one forward.

    Rows read different numbers of tokens (a catch-up, one token, or none); the block's padded
    columns are hidden from every later position, and padded queries see the block up to
    themselves so that their (discarded) outputs, which feed the cache's later layers, are finite.
    It serves the models ``PackedReader`` cannot read, at the cost of a padded slot in every layer
    for each row that reads less than the most.
    """

    def feed(self, rows: Tensor, tokens: Tensor, counts: Tensor) -> Tensor:
        """``PackedReader.feed``'s contract: ``counts[i]`` tokens for batch row ``rows[i]``,
        packed in ``tokens [M]``; ``[M, V]`` logits, each after its own token."""
        n, m = self.position.shape[0], tokens.shape[0]
        rows, counts = rows.cpu(), counts.cpu()  # the block is built on the host
        offsets = torch.arange(m) - (counts.cumsum(0) - counts).repeat_interleave(counts)
        at = rows.repeat_interleave(counts)  # [M] batch row of each token
        block = torch.zeros(n, int(counts.max()), dtype=torch.long)
        valid = torch.zeros(n, block.shape[1], dtype=torch.bool)
        block[at, offsets], valid[at, offsets] = tokens.cpu(), True
        return self.feed_block(block, valid)[at.to(self.device), offsets.to(self.device)]

    def feed_block(self, tokens: Tensor, valid: Tensor) -> Tensor:
        """Read ``tokens [n, K]`` where ``valid [n, K]`` (right-padded); ``[n, K, V]`` logits."""
        n, k = tokens.shape
        tokens, valid = tokens.to(self.device), valid.to(self.device)
        self._room(k)
        w = self.width
        causal = torch.ones(k, k, dtype=torch.bool, device=self.device).tril()  # [K, K]
        if self._mask_kind is None:
            self.mask[:, w : w + k] = valid
            attention = self.mask[:, : w + k]
        else:
            past = self.mask[:, :, :, :w].expand(n, 1, k, w)  # [n, 1, K, w]
            block = causal[None, None].expand(n, 1, k, k)
            if self._mask_kind == "sdpa":
                attention = torch.cat([past, block], dim=-1)
                self.mask[:, 0, 0, w : w + k] = valid
            else:
                hidden = torch.tensor(self._hidden, dtype=self.mask.dtype, device=self.device)
                attention = torch.cat([past, torch.where(block, 0.0, hidden)], dim=-1)
                self.mask[:, 0, 0, w : w + k] = torch.where(valid, 0.0, hidden)
        positions = self.position[:, None] + (valid.long().cumsum(1) - 1).clamp(min=0)
        out = self.model(
            input_ids=tokens,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: self.cache},
        )
        self.width += k
        self.position = self.position + valid.long().sum(1)
        return out.logits.float()  # [n, K, V]

    def tidy(self) -> None:
        """Move each row's visible cache columns to the front and drop the columns no row sees.

        Every read adds a column for every row, hidden where the row read nothing, so a cache
        grows by one column per step while rows read fewer tokens; attention reads all of them.
        Positions are the rows' own (counted over what they read), so moving keys changes
        nothing they attend to.
        """
        if self._mask_kind is None or not reserved(self.cache):
            return
        w = self.width
        columns = self.mask[:, 0, 0, :w]
        seen = columns if self._mask_kind == "sdpa" else columns == 0  # [n, w]
        counts = seen.sum(1)  # [n]
        keep = int(counts.max())
        if keep > w - _HIDDEN_COLUMNS_WORTH_DROPPING:
            return
        order = torch.argsort((~seen).to(torch.int8), dim=1, stable=True)[:, :keep]  # [n, keep]
        for layer in self.cache.layers:
            k, v = layer.keys, layer.values  # [n, H_kv, w, d]
            layer.keys = k.gather(2, order[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3]))
            layer.values = v.gather(
                2, order[:, None, :, None].expand(-1, v.shape[1], -1, v.shape[3])
            )
            layer._storage = None  # the next write reserves storage around the kept columns
        front = torch.arange(keep, device=self.device)[None] < counts[:, None]  # [n, keep]
        if self._mask_kind == "sdpa":
            self.mask[:, 0, 0, :] = False
            self.mask[:, 0, 0, :keep] = front
        else:
            self.mask[:, 0, 0, :] = self._hidden
            self.mask[:, 0, 0, :keep] = torch.where(front, 0.0, self._hidden)
        self.width = keep

    def _room(self, k: int) -> None:
        """Grow the mask buffer (by doubling) until ``k`` more columns fit."""
        size = self.mask.shape[-1]
        if self.width + k <= size:
            return
        extra = max(size, self.width + k - size)
        fill = self._hidden if self._mask_kind == "eager" else 0
        pad = torch.full((*self.mask.shape[:-1], extra), fill, device=self.device)
        self.mask = torch.cat([self.mask, pad.to(self.mask.dtype)], dim=-1)


class _CrossLoop:
    """The state of one ``generate_cross`` call.

    Every token a model's sequence gains (its own, or the other author's completed words in its
    tokens) is queued for it to read: its cache has read ``read[m]`` of its ``length[m]`` tokens.
    In its turn a model reads all its queued tokens of the rows it writes (and of rows that have
    ended), then draws for the live ones. Batch rows (``[n]`` tensors) shrink as rows finish;
    sequences live in ``[N, cap]`` buffers indexed by rollout row (``self.rows`` maps a batch row
    to its rollout row). A finished row stays until the other model has read its last words, so
    that both sequences carry log-probs.
    """

    def __init__(self, senior: _Model, junior: _Model, p: float, params: SamplingParams) -> None:
        self.models = (junior, senior)  # indexed by code: JUNIOR = 0, SENIOR = 1
        self.p, self.params = p, params
        self.home = senior.reader.device
        self.generator = torch.Generator().manual_seed(params.seed)
        self.coins = coin_generator(params.seed)
        # writer code -> {its token chunk: the other model's tokens of its text}
        self._translations: dict[int, dict[tuple[int, ...], list[int]]] = {SENIOR: {}, JUNIOR: {}}

    def run(
        self, senior_prompt: tuple[Tensor, Tensor], junior_prompt: tuple[Tensor, Tensor]
    ) -> CrossRollouts:
        params, g, home = self.params, self.params.samples_per_prompt, self.home
        prompts = {SENIOR: senior_prompt, JUNIOR: junior_prompt}
        self.last = {}  # code -> [n, V] logits after the last token each row's model read
        for m in self.models:
            ids, mask = prompts[m.code]
            logits = m.reader.prefill(ids, mask, g, params.max_new_tokens)
            self.last[m.code] = logits.to(home)
        n = self.last[SENIOR].shape[0]
        self.total = n
        lengths = senior_prompt[1].sum(1).repeat_interleave(g)
        self.budget = torch.tensor([params.budget(int(k)) for k in lengths], device=home)  # [N]
        self._buffers(n)
        self.rows = torch.arange(n, device=home)  # [n] rollout row of each batch row
        coin = torch.rand(n, generator=self.coins).to(home)
        self.author = torch.where(coin < self.p, SENIOR, JUNIOR)  # [n]
        self.onset = torch.zeros(n, dtype=torch.bool, device=home)  # [n] must start a word
        self.live = torch.ones(n, dtype=torch.bool, device=home)  # [n]
        self._loop()
        return self._finish(senior_prompt, junior_prompt, g)

    def _loop(self) -> None:
        """Step until every row has finished and both models have read all of it."""
        steps = 0
        while self.rows.numel():
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

    def _turn(self, m: _Model) -> None:
        """``m`` reads the rows it writes, proposes a token in each, coins settle onsets, and
        completed words pass to the other model."""
        n, home = self.rows.shape[0], self.home
        # drawn for every rollout row, dropped or not, so that a row's stream is its own
        uniforms = torch.rand(self.total, generator=self.generator).to(home)[self.rows]
        coins = torch.rand(self.total, generator=self.coins).to(home)[self.rows]
        self._read(m)
        ready = self.live & (self.author == m.code)
        ready &= self.read[m.code][self.rows] == self.length[m.code][self.rows]
        rows = ready.nonzero().squeeze(1)  # [r]
        if rows.numel() == 0:
            return
        token = torch.full((n,), -1, dtype=torch.long, device=home)
        token[rows] = self._draw(m, rows, uniforms[rows])
        spaced = ready & m.spaced[token.clamp(min=0)]
        winner = torch.where(coins < self.p, SENIOR, JUNIOR)  # [n]
        switch = spaced & ~self.onset & (winner != m.code)
        # the author's words so far are complete at a proposed onset, kept or withdrawn
        self._pass_words(spaced.nonzero().squeeze(1))
        self.author = torch.where(switch, winner, self.author)
        self.onset = torch.where(ready, switch, self.onset)
        changed = switch.nonzero().squeeze(1)
        if changed.numel():
            # the new author's turn begins after the words it has just been given
            full = self.rows[changed]
            mine = torch.where(
                winner[changed] == SENIOR, self.length[SENIOR][full], self.length[JUNIOR][full]
            )
            self.sync[full] = mine
        self._emit(token, ready & ~switch)

    def _draw(self, m: _Model, rows: Tensor, uniforms: Tensor) -> Tensor:
        """``[r]`` tokens from ``m`` for batch ``rows``; rows that must begin a word draw only
        ``m``'s space-led tokens."""
        dev = m.reader.device
        s = score(self.last[m.code][rows].to(dev), self.params)
        restricted = self.onset[rows]  # [r]
        token = torch.empty(rows.shape[0], dtype=torch.long, device=dev)
        free = (~restricted).nonzero().squeeze(1).to(dev)
        if free.numel():
            token[free] = draw(s, free, uniforms[free].to(dev), self.params)
        onset = restricted.nonzero().squeeze(1).to(dev)
        if onset.numel():
            allowed = m.spaced[None].expand(onset.numel(), -1)
            token[onset] = draw(s, onset, uniforms[onset].to(dev), self.params, allowed)
        return token.to(self.home)

    def _read(self, m: _Model) -> None:
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

    def _pass_words(self, batch_rows: Tensor, eos: list[bool] | None = None) -> None:
        """Give the other model each row's current author's words since ``sync`` (complete
        words, or the row's end) in its own tokens, appended to its sequence for it to read.

        ``eos``: per row, whether its text ends with the writer's EOS, which becomes the
        reader's own.
        """
        if batch_rows.numel() == 0:
            return
        full = self.rows[batch_rows].tolist()
        authors = self.author[batch_rows].tolist()
        ends = eos or [False] * len(full)
        for writer in self.models:
            picked = [i for i, a in enumerate(authors) if a == writer.code]
            if not picked:
                continue
            reader = self.models[1 - writer.code]
            rows = [full[i] for i in picked]
            spans = zip(
                self.sync[rows].tolist(), self.length[writer.code][rows].tolist(), strict=True
            )
            ids = self.out[writer.code]["tokens"][rows].tolist()
            chunks = [tuple(row_ids[a:b]) for row_ids, (a, b) in zip(ids, spans, strict=True)]
            encoded = self._translate(writer, reader, chunks)
            if any(ends[i] for i in picked) and reader.eos.numel():
                eos_id = int(reader.eos[0])
                encoded = [
                    [*x, eos_id] if ends[i] else x for i, x in zip(picked, encoded, strict=True)
                ]
            at = torch.tensor(rows, device=self.home)
            self._append(reader.code, at, encoded, writer.code)
            self.sync[at] = self.length[writer.code][at]
            if reader.code == SENIOR:
                self.unread[at] = 0

    def _translate(self, writer: _Model, reader: _Model, chunks: list[tuple[int, ...]]) -> list:
        """``reader``'s tokens of each of ``writer``'s token ``chunks`` (decoded, special tokens
        skipped, and encoded again). A batch's words repeat, so each chunk is translated once
        per call."""
        known = self._translations[writer.code]
        new = list({c for c in chunks if c not in known})
        if new:
            texts = writer.tokenizer.batch_decode([list(c) for c in new], skip_special_tokens=True)
            encoded = reader.tokenizer(texts, add_special_tokens=False)["input_ids"]
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

    def _emit(self, token: Tensor, emit: Tensor) -> None:
        """Append each emitting row's token to its author's sequence; stop rows that end."""
        for m in self.models:
            rows = (emit & (self.author == m.code)).nonzero().squeeze(1)  # [r] batch rows
            if rows.numel() == 0:
                continue
            tok = token[rows]  # [r]
            full = self.rows[rows]  # [r] rollout rows
            at = self.length[m.code][full]  # [r]
            self._ensure(m.code, int(at.max()) + 1)
            seq = self.out[m.code]
            seq["tokens"][full, at] = tok
            seq["authors"][full, at] = m.code
            self.length[m.code][full] = at + 1
            if m.code == JUNIOR:
                self.unread[full] += m.bound[tok].to(self.home)
            ended = torch.isin(tok, m.eos)  # [r]
            stop = ended | (self.length[SENIOR][full] + self.unread[full] >= self.budget[full])
            if bool(stop.any()):
                self._stop(m, rows[stop], at[stop], tok[stop], ended[stop])

    def _stop(self, m: _Model, rows: Tensor, at: Tensor, tok: Tensor, ended: Tensor) -> None:
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
        self._pass_words(rows, eos=ended.tolist())
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
        self.rows, self.live = self.rows[keep], self.live[keep]
        self.author, self.onset = self.author[keep], self.onset[keep]

    def _finish(
        self, senior_prompt: tuple[Tensor, Tensor], junior_prompt: tuple[Tensor, Tensor], g: int
    ) -> CrossRollouts:
        senior, junior = self.models[SENIOR], self.models[JUNIOR]
        home = self.home
        t_s = max(1, int(self.length[SENIOR].max()))
        seq = self.out[SENIOR]
        lengths = self.length[SENIOR]
        rows = [r[:k].tolist() for r, k in zip(seq["tokens"], lengths, strict=True)]
        ids, mask = senior_prompt
        tempered = self.params.logprob_temperature is not None
        return CrossRollouts(
            tokens=seq["tokens"][:, :t_s].clone(),
            authors=seq["authors"][:, :t_s].clone(),
            senior_logprobs=seq["logprobs"][:, :t_s].clone(),
            junior_logprobs=None,
            lengths=lengths.clone(),
            stop_reasons=self.stop_reasons.clone(),
            prompt_tokens=ids.repeat_interleave(g, dim=0).to(home),
            prompt_lengths=mask.sum(1).repeat_interleave(g).to(home),
            prompt_index=torch.arange(ids.shape[0], device=home).repeat_interleave(g),
            pad_token_id=senior.pad,
            texts=senior.tokenizer.batch_decode(rows, skip_special_tokens=True),
            old_logprobs=seq["old"][:, :t_s].clone() if tempered else None,
            ref_logprobs=None,
            junior=self._sequences(junior, junior_prompt, g),
        )

    def _sequences(self, m: _Model, prompt: tuple[Tensor, Tensor], g: int) -> Sequences:
        seq, lengths = self.out[m.code], self.length[m.code]
        t = max(1, int(lengths.max()))
        tokens = seq["tokens"][:, :t].clone()
        rows = [r[:k].tolist() for r, k in zip(tokens, lengths, strict=True)]
        real = seq["authors"][:, :t] != PAD
        ids, mask = prompt
        return Sequences(
            tokens=tokens,
            authors=seq["authors"][:, :t].clone(),
            logprobs=seq["logprobs"][:, :t].clone(),
            lengths=lengths.clone(),
            prompt_tokens=ids.repeat_interleave(g, dim=0).to(self.home),
            prompt_lengths=mask.sum(1).repeat_interleave(g).to(self.home),
            texts=m.tokenizer.batch_decode(rows, skip_special_tokens=True),
            byte_lengths=m.nbytes.to(self.home)[tokens] * real,
        )
