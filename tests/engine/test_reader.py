"""The reader's shortcuts change nothing but speed: a prefill read in chunks of similar lengths
and stacked, and the 4D masks it builds itself, against one-piece reads, the model's own masks
and teacher forcing."""

from __future__ import annotations

import pytest
import torch
from test_generate import teacher_forced  # a sibling module: pytest puts tests/engine on the path
from transformers import AutoModelForCausalLM

from tandem.assets import TINY_WORLD
from tandem.engine import SamplingParams, generate
from tandem.engine import reader as reader_module
from tandem.engine.layout import Prompts
from tandem.engine.reader import Reader
from tandem.samplers import WordSampler


def read(model, prompts, repeats: int, steps: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Prefill logits and the logits of ``steps`` steps that feed fixed tokens, one row of the
    batch finishing after the first step."""
    batch = Prompts.of(prompts, 0)
    ids, mask = batch.ids, batch.mask
    r = Reader(model)
    with torch.inference_mode():
        first = r.prefill(ids, mask, repeats, steps)
        n = first.shape[0]
        live = torch.ones(n, dtype=torch.bool)
        tokens = torch.arange(n) * 7 + 3
        later = []
        for t in range(steps):
            later.append(r.step(tokens + t, live).clone())  # a step's logits: the next overwrites
            live[1] = False
    return first, later


def test_chunked_prefill_matches_one_piece(senior, prompts, monkeypatch):
    widths = {len(p) for p in prompts}
    budget = 2 * max(widths)  # two rows a chunk: several chunks of different widths
    monkeypatch.setitem(reader_module._PREFILL_TOKENS, "cpu", 10**9)
    whole = read(senior, prompts, repeats=2, steps=4)
    monkeypatch.setitem(reader_module._PREFILL_TOKENS, "cpu", budget)
    chunks = Reader(senior)._chunks(Prompts.of(prompts, 0).lengths)
    assert len(chunks) >= 3 and len({w for _, w in chunks}) > 1
    assert sorted(torch.cat([i for i, _ in chunks]).tolist()) == list(range(len(prompts)))
    chunked = read(senior, prompts, repeats=2, steps=4)
    assert torch.allclose(chunked[0], whole[0], atol=1e-4)
    for a, b in zip(chunked[1], whole[1], strict=True):
        assert torch.allclose(a, b, atol=1e-4)


def test_chunked_prefill_in_generation(senior, junior, prompts, tokenizer, monkeypatch):
    """Chunks, G samples per prompt, rows stopping early and compaction, all at once."""
    monkeypatch.setitem(reader_module._PREFILL_TOKENS, "cpu", 150)
    params = SamplingParams(max_new_tokens=24, samples_per_prompt=3, seed=5, eos_token_ids=(2,))
    r = generate(senior, junior, prompts, WordSampler(tokenizer), params)
    for model, recorded in ((senior, r.senior_logprobs), (junior, r.junior_logprobs)):
        assert (recorded - teacher_forced(model, r)).abs().max() < 1e-4


@pytest.mark.parametrize("kind", ["eager", "2d"])
def test_mask_kinds_match_teacher_forcing(kind, prompts, tokenizer, monkeypatch):
    """The eager attention's additive mask, and the 2D mask the model expands itself (the path
    of models whose caches the engine does not reserve)."""
    attention = "eager" if kind == "eager" else "sdpa"
    model = AutoModelForCausalLM.from_pretrained(TINY_WORLD, attn_implementation=attention)
    if kind == "2d":
        monkeypatch.setattr(reader_module, "_MASK_KINDS", ())
    assert Reader(model)._mask_kind == (None if kind == "2d" else "eager")
    params = SamplingParams(max_new_tokens=16, samples_per_prompt=2, seed=4, eos_token_ids=(2,))
    r = generate(model, None, prompts, None, params)
    assert (r.senior_logprobs - teacher_forced(model, r)).abs().max() < 1e-4
