"""Tandem in one vLLM engine (the pair) against independent references, on the tiny world
(runs where vLLM is installed, in ``.ci/vllm``).

References: a scalar replay of each sampler over the rollout's own tokens with the batch's
coins (authors must be exactly the replay's); Hugging Face teacher forcing under both models
(the recorded log-probs); a plain vLLM engine of one model (p = 1 and p = 0); the same batch
again (seeds). The shared checks of rows and statistics are ``tests/engine/
test_vllm_backend.py``'s; juniors of their own configs are ``tests/engine/test_vllm_juniors.py``'s.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tandem.engine import JUNIOR, SENIOR, SamplingParams, StopReason
from tandem.samplers import SentenceSampler, StepSampler, TokenSampler, WordSampler
from tests.engine.test_vllm_backend import TEST_ENGINE, TOLERANCE, check_rows, forced, kept
from tests.engine.vllm_replay import replay

pytest.importorskip("vllm", reason="vLLM is not installed (see .ci/vllm)")

from tandem.engine.vllm_backend import VLLMBackend


@pytest.fixture(scope="module")
def pair(junior_folder, tokenizer):
    return kept(VLLMBackend("tiny", junior_folder, tokenizer, **TEST_ENGINE))


SAMPLERS = {
    "word_onset": lambda tok: WordSampler(tok, p=0.5, max_gap_tokens=3),
    "word_after_boundary": lambda tok: WordSampler(
        tok, p=0.5, rule="after_boundary", boundary="leading_space"
    ),
    "token": lambda tok: TokenSampler(tok, p=0.3),
    "sentence": lambda tok: SentenceSampler(tok, alternate=False, p=0.5),
    "step_capped": lambda tok: StepSampler(tok, first="junior", max_rounds=2),
}


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_authors_are_the_samplers_scalar_replay(name, pair, senior, junior, prompts, tokenizer):
    sampler = SAMPLERS[name](tokenizer)
    eos = (2, 11)
    params = SamplingParams(max_new_tokens=48, samples_per_prompt=4, eos_token_ids=eos, seed=5)
    r = pair.generate(prompts, sampler, params)
    authors, ends = replay(sampler, r, params)
    assert torch.equal(r.authors, authors), "an author differs from the sampler's replay"
    assert r.senior_mask.any() and r.junior_mask.any()
    assert (r.senior_logprobs - forced(senior, r))[r.mask].abs().max() < TOLERANCE
    assert (r.junior_logprobs - forced(junior, r))[r.mask].abs().max() < TOLERANCE
    if name == "step_capped":  # the cap on turns cuts rows, as a length stop
        assert ends == r.lengths.tolist() and any(e < params.max_new_tokens for e in ends)
        short = r.lengths < params.max_new_tokens
        last = r.tokens[torch.arange(r.num_rows), r.lengths - 1]
        capped = short & ~torch.isin(last, torch.tensor(eos))
        assert capped.any() and (r.stop_reasons[capped] == StopReason.LENGTH).all()
    else:
        check_rows(r, prompts, params, eos, tokenizer)


def test_p1_is_vllm_solo_and_p0_the_junior_alone(pair, junior_folder, prompts, tokenizer):
    """Token for token, under the same seeds, as a plain vLLM engine of either model."""
    params = SamplingParams(max_new_tokens=32, samples_per_prompt=2, seed=3)
    for p, folder, author in ((1.0, "tiny", SENIOR), (0.0, junior_folder, JUNIOR)):
        r = pair.generate(prompts, WordSampler(tokenizer, p=p), params)
        alone = kept(VLLMBackend(folder, None, tokenizer, **TEST_ENGINE))
        solo = alone.generate(prompts, None, params)
        assert torch.equal(r.tokens, solo.tokens) and torch.equal(r.lengths, solo.lengths)
        assert (r.authors[r.mask] == author).all()
        mine = r.senior_logprobs if author == SENIOR else r.junior_logprobs
        assert (mine - solo.senior_logprobs)[r.mask].abs().max() < TOLERANCE


def test_seeds_repeat(pair, prompts, tokenizer):
    sampler = WordSampler(tokenizer, p=0.5)
    params = SamplingParams(max_new_tokens=32, samples_per_prompt=2, seed=11)
    a, b = pair.generate(prompts, sampler, params), pair.generate(prompts, sampler, params)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.authors, b.authors)
    assert torch.equal(a.senior_logprobs, b.senior_logprobs)
    c = pair.generate(prompts, sampler, SamplingParams(max_new_tokens=32, samples_per_prompt=2))
    assert not torch.equal(a.authors, c.authors)


def test_solo_rows_read_both_models(pair, senior, junior, prompts, tokenizer):
    params = SamplingParams(max_new_tokens=24, samples_per_prompt=2)
    r = pair.generate(prompts, None, params, junior=True)
    assert (r.authors[r.mask] == SENIOR).all()
    assert (r.senior_logprobs - forced(senior, r))[r.mask].abs().max() < TOLERANCE
    assert (r.junior_logprobs - forced(junior, r))[r.mask].abs().max() < TOLERANCE
    assert pair.generate(prompts, None, params).junior_logprobs is None


def test_preempted_rows_keep_their_pen(junior_folder, senior, junior, prompts, tokenizer):
    """A KV cache far too small for the batch: vLLM preempts and re-schedules requests, and
    each comes back to its own schedule, tokens and log-probs."""
    small = kept(
        VLLMBackend(
            "tiny",
            junior_folder,
            tokenizer,
            **TEST_ENGINE,
            engine_args={"num_gpu_blocks_override": 40},
        )
    )
    sampler = WordSampler(tokenizer, p=0.5, max_gap_tokens=4)
    params = SamplingParams(max_new_tokens=200, samples_per_prompt=4, eos_token_ids=(), seed=2)
    r = small.generate(prompts, sampler, params)
    assert small.resumed > 0, "no request was preempted: the test misses its case"
    assert torch.equal(r.authors, replay(sampler, r, params)[0])
    assert (r.lengths == params.max_new_tokens).all()
    assert (r.senior_logprobs - forced(senior, r))[r.mask].abs().max() < TOLERANCE
    assert (r.junior_logprobs - forced(junior, r))[r.mask].abs().max() < TOLERANCE
    print(f"{small.resumed} requests came back after a preemption")


def test_weight_load_changes_the_senior_only(junior_folder, senior, junior, prompts, tokenizer):
    third = copy.deepcopy(senior)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in third.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3 * p.std().clamp(min=1e-3))
    backend = kept(VLLMBackend("tiny", junior_folder, tokenizer, **TEST_ENGINE))
    sampler = WordSampler(tokenizer, p=0.5)
    params = SamplingParams(max_new_tokens=24, samples_per_prompt=2)
    backend.load_weights(third.state_dict(), step=7)
    r = backend.generate(prompts, sampler, params)
    assert backend.weights_step == 7
    assert (r.senior_logprobs - forced(third, r))[r.mask].abs().max() < TOLERANCE
    assert (r.senior_logprobs - forced(senior, r))[r.mask].abs().max() > 0.1
    assert (r.junior_logprobs - forced(junior, r))[r.mask].abs().max() < TOLERANCE
    backend.sync(senior, step=8)
    back = backend.generate(prompts, sampler, params)
    assert (back.senior_logprobs - forced(senior, back))[back.mask].abs().max() < TOLERANCE
