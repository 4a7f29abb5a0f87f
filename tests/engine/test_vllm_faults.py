"""A failure inside vLLM's step leaves the pair engine usable (runs where vLLM is installed, in
``.ci/vllm``): the batch's requests are aborted, ``generate`` raises once with the cause, and
the next batch is what a fresh engine gives.

Without the abort, the failed batch's requests stay running in vLLM's scheduler and the next
``generate`` waits on them for ever: a watchdog (``signal.alarm``) turns that into a failure.
"""

from __future__ import annotations

import random
import signal

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.samplers import WordSampler
from tests.engine.test_vllm_backend import TEST_ENGINE, kept

pytest.importorskip("vllm", reason="vLLM is not installed (see .ci/vllm)")

from tandem.engine.vllm_backend import EngineFailed, VLLMBackend
from tandem.engine.vllm_pair import TandemPairForCausalLM
from tandem.engine.vllm_pens import Pens

# where a fault is injected: the processor reading a token, the processor writing the logits,
# the pair model's logits
PLACES = {
    "read": (Pens, "feed"),
    "write": (Pens, "choose"),
    "model": (TandemPairForCausalLM, "compute_logits"),
}
WATCHDOG_S = 120


def batch(tokenizer, prompts, seed: int):
    params = SamplingParams(max_new_tokens=32, samples_per_prompt=2, eos_token_ids=(2,), seed=seed)
    return prompts, WordSampler(tokenizer, p=0.5, max_gap_tokens=3), params


@pytest.fixture(scope="module")
def engine(junior_folder, tokenizer):
    return kept(VLLMBackend("tiny", junior_folder, tokenizer, **TEST_ENGINE))


@pytest.fixture(scope="module")
def fresh(junior_folder, prompts, tokenizer):
    """The next batch, from an engine that never failed."""
    backend = kept(VLLMBackend("tiny", junior_folder, tokenizer, **TEST_ENGINE))
    return backend.generate(*batch(tokenizer, prompts, seed=8))


def watched(run):
    def alarm(*_):
        raise TimeoutError(f"generate did not return within {WATCHDOG_S} s: the engine wedged")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(WATCHDOG_S)
    try:
        return run()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("place", list(PLACES))
def test_a_fault_aborts_its_batch_and_the_next_is_exact(
    place, engine, fresh, prompts, tokenizer, monkeypatch
):
    owner, name = PLACES[place]
    real = getattr(owner, name)
    at = random.Random(place).randrange(1, 30)  # the call (about the step) that fails
    calls = [0]

    def faulty(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            raise ValueError(f"fault injected at call {at}")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, faulty)
    with pytest.raises(EngineFailed, match=f"fault injected at call {at}") as failed:
        watched(lambda: engine.generate(*batch(tokenizer, prompts, seed=7)))
    assert isinstance(failed.value.__cause__, ValueError)
    assert engine.llm.llm_engine.get_num_unfinished_requests() == 0, "requests left running"
    monkeypatch.setattr(owner, name, real)
    after = watched(lambda: engine.generate(*batch(tokenizer, prompts, seed=8)))
    print(f"{place}: fault at call {at}; the next batch of {after.num_rows} rows as fresh")
    assert torch.equal(after.tokens, fresh.tokens) and torch.equal(after.authors, fresh.authors)
    assert torch.equal(after.senior_logprobs, fresh.senior_logprobs)
    assert torch.equal(after.junior_logprobs, fresh.junior_logprobs)
