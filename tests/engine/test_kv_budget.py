"""The torch engine keeps its KV caches under ``generation.kv_cache_gib`` by generating whole
prompt groups a chunk of rows at a time, with the rollouts of one pass over all rows."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import Qwen3Config

from tandem.engine import SamplingParams, generate, reader
from tandem.engine.cache import kv_bytes_per_token
from tandem.samplers import WordSampler

EXACT = ("tokens", "authors", "lengths", "stop_reasons", "prompt_index", "prompt_tokens")
# a pass over fewer rows runs the matrix kernels on other shapes, which round differently in
# the last bits (as the batch's compaction of finished rows already does within one pass)
LOGPROBS = ("senior_logprobs", "junior_logprobs", "old_logprobs", "ref_logprobs")


def per_prompt_gib(models, prompts, params) -> float:
    width = max(len(p) for p in prompts)
    per_token = sum(kv_bytes_per_token(m.config, torch.float32) for m in models)
    return per_token * (width + params.max_new_tokens) * params.samples_per_prompt / 2**30


@pytest.mark.parametrize("tandem", [False, True])
def test_chunks_under_a_budget_give_the_rollouts_of_one_pass(
    senior, junior, tokenizer, prompts, tandem: bool
) -> None:
    params = SamplingParams(
        max_new_tokens=40, temperature=1.0, seed=3, samples_per_prompt=2, logprob_temperature=0.7
    )
    models = [senior, junior] if tandem else [senior]
    sampler = WordSampler(tokenizer, p=0.5) if tandem else None
    partner = junior if tandem else None
    whole = generate(senior, partner, prompts, sampler, params, tokenizer=tokenizer)
    # room for two prompts' rows at a time: three chunks of the six prompts
    budget = 2.5 * per_prompt_gib(models, prompts, params)
    small = dataclasses.replace(params, kv_cache_gib=budget)
    chunked = generate(senior, partner, prompts, sampler, small, tokenizer=tokenizer)
    for name in EXACT:
        assert torch.equal(getattr(whole, name), getattr(chunked, name)), name
    for name in LOGPROBS:
        a, b = getattr(whole, name), getattr(chunked, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.allclose(a, b, rtol=0, atol=1e-5), name
    assert whole.texts == chunked.texts
    assert chunked.junior_mask.any() == tandem


def test_the_caches_of_a_chunk_stay_under_the_budget(
    senior, junior, tokenizer, prompts, monkeypatch
) -> None:
    params = SamplingParams(max_new_tokens=30, seed=1, samples_per_prompt=2)
    budget = 2.5 * per_prompt_gib([senior, junior], prompts, params)
    held = []  # the storage each reader reserved for a pass, read right after its prefill
    real_prefill = reader.Reader.prefill

    def prefill(self, *args, **kwargs):
        logits = real_prefill(self, *args, **kwargs)
        held.append(sum(storage_bytes(layer) for layer in self.cache.layers))
        return logits

    monkeypatch.setattr(reader.Reader, "prefill", prefill)
    small = dataclasses.replace(params, kv_cache_gib=budget)
    generate(senior, junior, prompts, WordSampler(tokenizer, p=0.5), small, tokenizer=tokenizer)
    passes = [held[i] + held[i + 1] for i in range(0, len(held), 2)]  # senior + junior
    assert len(passes) == 3, passes
    assert max(passes) <= budget * 2**30
    # and a pass holds about what the budget allows, not far less
    assert max(passes) >= 0.5 * budget * 2**30


def storage_bytes(layer) -> int:
    """What a cache layer reserved: the whole storage its keys and values are views of."""
    return layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes()


def test_a_budget_too_small_for_one_prompt_is_refused(senior, tokenizer, prompts) -> None:
    params = SamplingParams(max_new_tokens=30, samples_per_prompt=4, kv_cache_gib=1e-6)
    with pytest.raises(ValueError, match=r"generation.kv_cache_gib \(1e-06\) holds .* Raise"):
        generate(senior, None, prompts, None, params, tokenizer=tokenizer)


def test_kv_bytes_per_token_of_qwen3_4b() -> None:
    config = Qwen3Config(
        hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128,
    )  # fmt: skip
    assert kv_bytes_per_token(config, torch.bfloat16) == 147456
