"""The vLLM backend against the torch engine, on the tiny world (runs where vLLM is installed).

Run in the vLLM virtual environment (``.ci/vllm``). Every check compares vLLM's rollouts with
something computed independently: teacher-forced log-probs of the Hugging Face models
(``tandem.modules.logprobs.sequence_logprobs``), the sampler's boundary rules, the torch
engine's statistics on the same prompts.
"""

from __future__ import annotations

import os

import pytest
import torch

from tandem.engine import JUNIOR, PAD, SENIOR, Rollouts, SamplingParams, StopReason, generate
from tandem.engine.vllm_backend import VLLMBackend
from tandem.modules.logprobs import sequence_logprobs
from tandem.samplers import StepSampler, WordSampler
from tandem.samplers.boundaries import step_end, word_onset

pytest.importorskip("vllm", reason="vLLM is not installed (see .ci/vllm)")


# float32 on CPU: vLLM's kernels and Hugging Face's differ by rounding only
TOLERANCE = 1e-3
# a test engine: the tiny world's positions, and a KV cache of 128 MiB of host memory (its
# batches need a few MiB; a session holds a dozen engines). On a GPU, TANDEM_TEST_MODEL_RUNNER=v2
# runs the engines on vLLM's Model Runner V2 (docs/vllm.md, what only a GPU can confirm)
TEST_ENGINE = {"max_model_len": 512, "kv_cache_gib": 0.125}
if os.environ.get("TANDEM_TEST_MODEL_RUNNER"):
    TEST_ENGINE["model_runner"] = os.environ["TANDEM_TEST_MODEL_RUNNER"]
# Every engine a test starts lives to the end of the session: a vLLM engine that is garbage
# collected tears down the process's distributed state, which the other engines still use.
ALIVE: list[VLLMBackend] = []


def kept(backend: VLLMBackend) -> VLLMBackend:
    ALIVE.append(backend)
    return backend


@pytest.fixture(scope="module")
def backend(junior_folder, tokenizer):
    """The tandem engine: one vLLM engine holding both models."""
    return kept(VLLMBackend("tiny", junior_folder, tokenizer, **TEST_ENGINE))


def forced(model, r: Rollouts) -> torch.Tensor:
    """``[N, T]`` each response token's log-prob, recomputed by teacher forcing."""
    ids, mask = r.sequences()
    with torch.inference_mode():
        return sequence_logprobs(model, ids, mask, r.prompt_tokens.shape[1])


def check_rows(r: Rollouts, prompts, params: SamplingParams, eos, tokenizer) -> None:
    """Padding, EOS, lengths, prompts and texts line up, as the torch engine's do."""
    g = params.samples_per_prompt
    assert r.num_rows == len(prompts) * g and r.tokens.shape[1] == int(r.lengths.max())
    for i in range(r.num_rows):
        k = int(r.lengths[i])
        assert ((r.authors[i, :k] == SENIOR) | (r.authors[i, :k] == JUNIOR)).all()
        assert (r.authors[i, k:] == PAD).all() and (r.tokens[i, k:] == r.pad_token_id).all()
        is_eos = torch.isin(r.tokens[i, :k], torch.tensor(eos))
        assert not is_eos[:-1].any(), "a row went on after an EOS"
        if r.stop_reasons[i] == StopReason.EOS:
            assert is_eos[-1]
        else:
            assert k == params.max_new_tokens
        prompt = prompts[i // g]
        assert r.prompt_tokens[i, -len(prompt) :].tolist() == list(prompt)
        assert int(r.prompt_lengths[i]) == len(prompt) and int(r.prompt_index[i]) == i // g
        assert r.texts[i] == tokenizer.decode(r.tokens[i, :k].tolist(), skip_special_tokens=True)


def max_error(r: Rollouts, senior, junior) -> float:
    worst = (r.senior_logprobs - forced(senior, r)).abs().max()
    if r.junior_logprobs is not None:
        worst = max(worst, (r.junior_logprobs - forced(junior, r)).abs().max())
    print(f"max |log-prob - teacher forced| = {float(worst):.2e}")
    return float(worst)


def test_solo_matches_teacher_forcing(backend, senior, junior, prompts, tokenizer):
    eos = (2, 7, 11)  # extra EOS ids so that some rows stop early
    params = SamplingParams(max_new_tokens=24, samples_per_prompt=2, eos_token_ids=eos)
    r = backend.generate(prompts, None, params, junior=True)
    check_rows(r, prompts, params, eos, tokenizer)
    assert (r.authors[r.mask] == SENIOR).all()
    assert max_error(r, senior, junior) < TOLERANCE
    # the two models really differ, so swapped engines would have shown
    assert (r.senior_logprobs - r.junior_logprobs)[r.mask].abs().max() > 0.1
    again = backend.generate(prompts, None, params)
    assert again.junior_logprobs is None and torch.equal(again.tokens, r.tokens)
    other = backend.generate(prompts, None, SamplingParams(max_new_tokens=24))
    assert not torch.equal(other.tokens[:, :8], r.tokens[::2, :8])


@pytest.mark.parametrize("rule", ["onset", "after_boundary"])
def test_word_tandem_matches_teacher_forcing(rule, backend, senior, junior, prompts, tokenizer):
    sampler = WordSampler(tokenizer, p=0.5, rule=rule, max_gap_tokens=2)
    params = SamplingParams(max_new_tokens=32, samples_per_prompt=2)
    r = backend.generate(prompts, sampler, params)
    check_rows(r, prompts, params, (2,), tokenizer)
    assert r.junior_mask.any() and r.senior_mask.any()
    assert max_error(r, senior, junior) < TOLERANCE
    changed, coin, gap = coins(r, sampler)
    assert changed.any() and not (changed & ~coin).any(), "the author changed without a coin"
    assert gap.any(), "max_gap_tokens never forced a coin: the test misses that rule"


def coins(r: Rollouts, sampler: WordSampler):
    """``[N, T-1]`` masks over positions 1..T-1: the author changed; a coin fell (replaying the
    word sampler: at onsets, or after them under ``after_boundary``, and after
    ``max_gap_tokens`` tokens without one); the coin was one forced by the gap."""
    prev = torch.cat([r.prompt_tokens[:, -1:], r.tokens[:, :-1]], dim=1)
    onset = word_onset(sampler.tables, r.tokens, prev) & r.mask  # [N, T]
    changed = (r.authors[:, 1:] != r.authors[:, :-1]) & r.mask[:, 1:]  # [N, T-1]
    after = sampler.rule == "after_boundary"
    coin, gap = torch.zeros_like(changed), torch.zeros_like(changed)
    since = torch.ones(r.num_rows, dtype=torch.long)  # the first token is a coin
    for t in range(1, r.tokens.shape[1]):
        due = onset[:, t - 1] if after else torch.zeros_like(since, dtype=torch.bool)
        gap[:, t - 1] = (since >= sampler.max_gap_tokens) & ~due
        coin[:, t - 1] = due | gap[:, t - 1] | (onset[:, t] & (not after))
        since = torch.where(coin[:, t - 1], 1, since + 1)
    return changed, coin, gap


def word_statistics(r: Rollouts, sampler: WordSampler) -> tuple[int, int, int]:
    """(onsets after the first token, how many the senior wrote, how many changed author)."""
    changed, coin, _ = coins(r, sampler)
    senior = int((r.authors[:, 1:][coin] == SENIOR).sum())
    return int(coin.sum()), senior, int(changed[coin].sum())


@pytest.mark.parametrize("p", [0.5, 0.8])
def test_word_statistics_agree_with_torch(p, backend, senior, junior, prompts, tokenizer):
    """The senior's share of words and the share of onsets where the pen changes hands: both
    engines against the process's values, within 3.3 binomial standard deviations."""
    params = SamplingParams(max_new_tokens=40, samples_per_prompt=8, eos_token_ids=())
    for name in ("vllm", "torch"):
        sampler = WordSampler(tokenizer, p=p, max_gap_tokens=1000)
        if name == "vllm":
            r = backend.generate(prompts, sampler, params)
        else:
            r = generate(senior, junior, prompts, sampler, params)
        n, seniors, changes = word_statistics(r, sampler)
        assert n > 300
        # each onset's author is a fresh coin: senior with p, a change with 2p(1-p)
        for count, q in ((seniors, p), (changes, 2 * p * (1 - p))):
            spread = 3.29 * (n * q * (1 - q)) ** 0.5 + 1
            assert abs(count - n * q) <= spread, (name, count, n, q)
        print(f"{name} p={p}: {n} onsets, senior {seniors / n:.3f}, changed {changes / n:.3f}")


def test_step_alternation(backend, prompts, tokenizer):
    sampler = StepSampler(tokenizer)
    params = SamplingParams(max_new_tokens=64, samples_per_prompt=2, eos_token_ids=())
    r = backend.generate(prompts, sampler, params)
    prev = torch.cat([r.prompt_tokens[:, -1:], r.tokens[:, :-1]], dim=1)
    ended = step_end(sampler.tables, r.tokens, prev)[:, :-1]
    assert (r.authors[:, 0] == SENIOR).all()
    assert torch.equal(r.authors[:, 1:] != r.authors[:, :-1], ended)
    assert ended.any()


def test_weights_load_in_place(junior_folder, senior, junior, prompts, tokenizer):
    """New weights reach the running engine (not its prefix cache of the old ones), and the
    step they come from is what the backend reports."""
    backend = kept(VLLMBackend("tiny", None, tokenizer, **TEST_ENGINE))
    params = SamplingParams(max_new_tokens=12)
    before = backend.generate(prompts, None, params)
    assert backend.weights_step == -1
    assert (before.senior_logprobs - forced(senior, before)).abs().max() < TOLERANCE
    backend.load_weights(junior.state_dict(), step=3)
    after = backend.generate(prompts, None, params)
    assert backend.weights_step == 3
    assert (after.senior_logprobs - forced(junior, after)).abs().max() < TOLERANCE
    assert (after.senior_logprobs - forced(senior, after)).abs().max() > 0.1
    backend.sync(senior, step=4)  # every step by default: the senior's weights come back
    assert backend.weights_step == 4
    again = backend.generate(prompts, None, params)
    assert torch.equal(again.tokens, before.tokens)
