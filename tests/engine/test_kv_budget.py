"""Rollouts within a KV budget (``SamplingParams.kv_cache_gib``, ``tandem.engine.budget``): a
call split into passes of whole prompt groups gives the rollouts of one pass, its caches never
hold more than the budget (measured on the tensors the caches allocate), and a budget too small
for one prompt group is refused with the fix."""

from __future__ import annotations

import dataclasses
import logging
import weakref
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

from tandem.assets import TINY_BPE_SMALL
from tandem.engine import SamplingParams, budget, cache, generate
from tandem.engine.cache import (
    cache_dtypes,
    kv_bytes_per_token,
    kv_chunk_bytes,
    kv_chunk_rows,
    new_cache,
)
from tandem.engine.reader import Reader
from tandem.samplers import WordSampler

GiB = 2**30
EXACT = ("tokens", "authors", "lengths", "stop_reasons", "prompt_index", "prompt_tokens")
LOGPROBS = ("senior_logprobs", "junior_logprobs", "old_logprobs", "ref_logprobs")


@pytest.fixture(autouse=True)
def fresh_messages(monkeypatch):
    """Every test sees the budget's once-only messages afresh."""
    monkeypatch.setattr(budget, "_said", set())


def per_token(*models) -> int:
    return sum(kv_bytes_per_token(m.config, *cache_dtypes(m)) for m in models)


def need(prompts_per_pass: int, models, prompts, params) -> int:
    """The bytes ``prompts_per_pass`` prompt groups of ``prompts`` hold at most."""
    width = max(len(p) for p in prompts)
    g, m = params.samples_per_prompt, params.max_new_tokens
    return kv_chunk_bytes(per_token(*models), prompts_per_pass, g, width, m)


def budget_for(prompts_per_pass: int, models, prompts, params) -> float:
    """GiB that hold ``prompts_per_pass`` prompt groups of ``prompts`` and half one more."""
    one = need(1, models, prompts, params)
    return (need(prompts_per_pass, models, prompts, params) + one / 2) / GiB


def some_eos(senior, prompts) -> tuple[int, ...]:
    """EOS ids that stop some rows early and let others run: tokens only a few rows write."""
    params = SamplingParams(max_new_tokens=24, samples_per_prompt=2, seed=5, eos_token_ids=())
    r = generate(senior, None, prompts, None, params)
    rows_with: dict[int, set[int]] = {}
    for i, row in enumerate(r.tokens.tolist()):
        for token in row:
            rows_with.setdefault(token, set()).add(i)
    return tuple(sorted(t for t, rows in rows_with.items() if len(rows) <= 2)[:6])


def assert_same(a, b) -> None:
    for name in EXACT:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.texts == b.texts
    for name in LOGPROBS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is None:
            continue
        # float32 rounding, within the tolerance the engine's log-probs keep against teacher
        # forcing (tests/engine/test_generate.py)
        assert torch.allclose(x, y, rtol=0, atol=1e-4), name


@pytest.mark.parametrize("tandem", [False, True], ids=["solo", "word"])
def test_passes_give_the_rollouts_of_one_pass(
    tandem, senior, junior, prompts, tokenizer, caplog
) -> None:
    eos = some_eos(senior, prompts)
    params = SamplingParams(
        max_new_tokens=24, seed=5, samples_per_prompt=2, eos_token_ids=eos, logprob_temperature=0.7
    )
    partner = junior if tandem else None
    sampler = WordSampler(tokenizer, p=0.5) if tandem else None
    whole = generate(senior, partner, prompts, sampler, params, tokenizer=tokenizer)
    assert (whole.lengths < 24).any() and (whole.lengths == 24).any(), "EOS must stop some rows"
    models = [senior, junior] if tandem else [senior]
    small = dataclasses.replace(params, kv_cache_gib=budget_for(2, models, prompts, params))
    with caplog.at_level(logging.INFO, logger=budget.__name__):
        split = generate(senior, partner, prompts, sampler, small, tokenizer=tokenizer)
    assert "12 rows generated in 3 passes of at most 4 rows" in caplog.text
    # Passes of 4 rows run the matrix kernels on other batch sizes than one pass of 12 (and
    # its compactions), so the last bits of a log-prob may differ.
    assert_same(whole, split)
    assert split.junior_mask.any() == tandem


def test_passes_read_each_prompt_as_one_pass_would(
    senior, junior, prompts, tokenizer, monkeypatch
) -> None:
    # 24 prompts, each 4 times in a row: one pass reads them in two prefill groups (16 prompts
    # of width 63, 8 of width 72). Passes of 8 must read each prompt at its group's width too
    # (padding changes the last bits of attention's sums); a pass reading its prompts at its
    # own widest prompt's width would not. Recorded at every prefill forward of either model:
    # which prompt, at which width.
    reads: list[tuple[str, tuple[int, ...], int]] = []
    forward = Reader._forward

    def recorded(self, ids, mask, positions, cache):
        for row, keep in zip(ids.tolist(), mask.bool().tolist(), strict=True):
            real = tuple(t for t, k in zip(row, keep, strict=True) if k)
            reads.append(("senior" if self.model is senior else "junior", real, ids.shape[1]))
        return forward(self, ids, mask, positions, cache)

    monkeypatch.setattr(Reader, "_forward", recorded)
    many = [p for p in prompts for _ in range(4)]
    params = SamplingParams(max_new_tokens=16, seed=3, eos_token_ids=(), logprob_temperature=0.7)
    sampler = WordSampler(tokenizer, p=0.5)
    whole = generate(senior, junior, many, sampler, params, tokenizer=tokenizer)
    whole_reads, reads[:] = sorted(reads, key=repr), []
    assert len({w for *_, w in whole_reads}) == 2, "the prompts must span two prefill groups"
    small = dataclasses.replace(params, kv_cache_gib=budget_for(8, [senior, junior], many, params))
    split = generate(senior, junior, many, sampler, small, tokenizer=tokenizer)
    assert sorted(reads, key=repr) == whole_reads
    # the kernels see other batch sizes in passes of 8: the last bits of a log-prob may differ
    assert_same(whole, split)


class CacheBytes:
    """The most bytes the KV caches' tensors held at once: measured at every allocation a cache
    makes, over every live ``ReservedLayer``'s storage plus what the allocating call has made
    so far (each storage counted once, however many views share it)."""

    def __init__(self, monkeypatch) -> None:
        self.layers: weakref.WeakSet = weakref.WeakSet()
        self.pending: list[torch.Tensor] = []
        self.depth, self.peak = 0, 0
        layer = cache.ReservedLayer
        init, new_empty = layer.__init__, torch.Tensor.new_empty

        def tracked_init(this, *args, **kwargs):
            init(this, *args, **kwargs)
            self.layers.add(this)

        def tracked_new_empty(t, *args, **kwargs):
            out = new_empty(t, *args, **kwargs)
            if self.depth:  # inside a cache method: a cache's storage
                self.pending.append(out)
                self.peak = max(self.peak, self.held())
            return out

        monkeypatch.setattr(layer, "__init__", tracked_init)
        monkeypatch.setattr(torch.Tensor, "new_empty", tracked_new_empty)
        for name in ("_reserve", "stack", "batch_repeat_interleave"):
            monkeypatch.setattr(layer, name, self._inside(getattr(layer, name)))

    def _inside(self, method):
        def wrapped(*args, **kwargs):
            self.depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                self.depth -= 1
                if not self.depth:
                    self.pending.clear()

        return wrapped

    def held(self) -> int:
        storages = {}
        tensors = list(self.pending)
        for layer in list(self.layers):
            tensors += [
                t for t in (*(layer._storage or ()), layer.keys, layer.values) if t is not None
            ]
        for t in tensors:
            s = t.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
        return sum(storages.values())


def test_the_caches_of_a_pass_stay_under_the_budget(
    senior, junior, prompts, tokenizer, monkeypatch
) -> None:
    params = SamplingParams(max_new_tokens=30, seed=1, samples_per_prompt=2)
    sampler = WordSampler(tokenizer, p=0.5)
    gib = budget_for(2, [senior, junior], prompts, params)
    measured = CacheBytes(monkeypatch)
    generate(senior, junior, prompts, sampler, dataclasses.replace(params, kv_cache_gib=gib))
    two = need(2, [senior, junior], prompts, params)
    # a pass of two prompts: under the budget, and near what the formula counts for it (which
    # counts every layer's copy of the prompts while they are repeated; one is held at a time)
    assert 0.7 * two <= measured.peak <= gib * GiB
    # one pass over every prompt holds three times as much: the budget is what split it
    measured.peak = 0
    generate(senior, junior, prompts, sampler, params)
    assert measured.peak > 2.1 * two


def test_a_row_reserves_what_the_formula_counts_under_autocast(senior, prompts) -> None:
    # bfloat16 autocast over float32 weights: float32 keys (promoted by the rotary tables and
    # k_norm), bfloat16 values
    params = SamplingParams(max_new_tokens=5, samples_per_prompt=3, eos_token_ids=())
    cache_seen = []
    real = new_cache

    def spy(model, capacity):
        made = real(model, capacity)
        cache_seen.append(made)
        return made

    with pytest.MonkeyPatch.context() as mp, torch.autocast("cpu", dtype=torch.bfloat16):
        mp.setattr("tandem.engine.reader.new_cache", spy)
        assert cache_dtypes(senior) == (torch.float32, torch.bfloat16)
        generate(senior, None, prompts[:2], None, params)
    layers = cache_seen[-1].layers
    rows, positions = 2 * 3, max(len(p) for p in prompts[:2]) + 5
    held = sum(t.untyped_storage().nbytes() for layer in layers for t in layer._storage)
    expected = kv_bytes_per_token(senior.config, torch.float32, torch.bfloat16)
    assert held == rows * positions * expected
    assert expected == kv_bytes_per_token(senior.config, torch.float32) * 3 // 4


def test_a_budget_too_small_for_one_prompt_group_is_refused(senior, prompts, tokenizer) -> None:
    params = SamplingParams(max_new_tokens=30, samples_per_prompt=4, kv_cache_gib=1e-6)
    group = need(1, [senior], prompts, params) / GiB
    with pytest.raises(ValueError) as error:
        generate(senior, None, prompts, None, params, tokenizer=tokenizer)
    message = str(error.value)
    assert message.startswith("generation.kv_cache_gib (1e-06) holds ")
    assert f"one prompt's 4 rows of {max(len(p) for p in prompts)} prompt + 30 response" in message
    assert f"need {group:.3g} GiB on cpu" in message
    assert f"Raise generation.kv_cache_gib to at least {group:.3g}" in message
    with pytest.raises(ValueError, match=r"kv_cache_gib \(0\) must be a number > 0"):
        SamplingParams(kv_cache_gib=0)


def test_processes_in_lockstep_make_as_many_passes(senior, junior, prompts, tokenizer) -> None:
    params = SamplingParams(max_new_tokens=24, seed=2, samples_per_prompt=2)
    sampler = WordSampler(tokenizer, p=0.5)
    alone = generate(senior, junior, prompts, sampler, params, tokenizer=tokenizer)
    forwards = {"senior": 0, "junior": 0}
    hooks = [
        model.register_forward_pre_hook(
            lambda *_, name=name: forwards.update({name: forwards[name] + 1})
        )
        for name, model in (("senior", senior), ("junior", junior))
    ]
    # the other process splits its prompts into 8 passes: this one's 6 prompts make 6 passes
    # of one prompt, then 2 empty ones; the other writes 30 steps in every pass
    other = _OtherProcess(passes=8, steps=30)
    try:
        r = generate(senior, junior, prompts, sampler, params, tokenizer=tokenizer, lockstep=other)
    finally:
        for hook in hooks:
            hook.remove()
    assert_same(alone, r)
    assert other.passed[0] == 1 and other.prefills == 8
    # the senior: a prefill and 30 steps in each of the 8 passes; the junior: its own only
    own = [int(r.lengths[2 * i : 2 * i + 2].max()) for i in range(6)]
    assert forwards == {"senior": 8 * 31, "junior": sum(own)}


class _OtherProcess:
    """A ``Lockstep`` with a second process simulated: it agrees on ``passes`` passes, reads its
    prompts in one prefill forward a pass, and then writes ``steps`` more tokens."""

    def __init__(self, passes: int, steps: int) -> None:
        self.passes, self.steps = passes, steps
        self.phase, self.left, self.prefills, self.passed = "passes", 0, 0, []

    def __call__(self, value: int) -> int:
        self.passed.append(value)
        if self.phase == "passes":
            self.phase = "prefill"
            return max(value, self.passes)
        if self.phase == "prefill":
            self.phase, self.left = "steps", self.steps
            self.prefills += 1
            return max(value, 1)
        out = max(value, int(self.left > 0))
        self.left -= 1
        if out == 0:  # every process has finished the pass
            self.phase = "prefill"
        return out


def test_the_cross_engine_warns_and_generates_in_one_pass(
    senior, prompts, tokenizer, caplog
) -> None:
    junior = AutoModelForCausalLM.from_pretrained(TINY_BPE_SMALL, dtype=torch.float32).eval()
    junior_tokenizer = AutoTokenizer.from_pretrained(TINY_BPE_SMALL)
    params = SamplingParams(max_new_tokens=12, seed=3, samples_per_prompt=2)
    sampler = WordSampler(tokenizer, p=0.5)
    kw = dict(tokenizer=tokenizer, junior_tokenizer=junior_tokenizer)
    whole = generate(senior, junior, prompts, sampler, params, **kw)
    small = dataclasses.replace(params, kv_cache_gib=budget_for(1, [senior], prompts, params))
    with caplog.at_level(logging.WARNING, logger=budget.__name__):
        r = generate(senior, junior, prompts, sampler, small, **kw)
    assert "the cross-vocabulary engine generates all 12 rows in one pass" in caplog.text
    assert torch.equal(r.tokens, whole.tokens) and torch.equal(r.authors, whole.authors)


def test_kv_bytes_per_token_of_qwen3_4b() -> None:
    config = Qwen3Config(
        hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128,
    )  # fmt: skip
    assert kv_bytes_per_token(config, torch.bfloat16) == 147456
    # without head_dim: hidden_size / num_attention_heads; without KV heads: every head's own
    plain = SimpleNamespace(hidden_size=1024, num_hidden_layers=36, num_attention_heads=8)
    assert kv_bytes_per_token(plain, torch.bfloat16) == 147456
    # the paper's 128 rows of 1,024 + 3,000 positions: 70.7 GiB a model, plus each prompt once
    assert kv_chunk_bytes(147456, 16, 8, 1024, 3000) == 147456 * (128 * 4024 + 16 * 1024)
    assert 128 * 4024 * 147456 / GiB == pytest.approx(70.73, abs=0.01)
    # senior and junior in bf16 on one device under 20 GiB: two prompt groups of 8 rows
    assert kv_chunk_rows(20 * GiB, 2 * 147456, 8, 1024, 3000) == 16
    assert kv_chunk_rows(GiB, 2 * 147456, 8, 1024, 3000) == 0
