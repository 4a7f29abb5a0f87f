"""The vLLM backend's turns and its fallback; no vLLM needed.

A tandem rollout on vLLM is cut into turns: the logits processor steps the sampler over each
request's tokens and stops it at the handover, and the backend replays the same steps to cut the
output. Both must give exactly the schedule that stepping the sampler token by token gives, with
the same coins, whatever the author would have written after the cut.
"""

from __future__ import annotations

import importlib.util
import logging
from types import SimpleNamespace

import pytest
import torch

from tandem.engine import SamplingParams, TorchBackend, build_backend
from tandem.engine import backend as backend_module
from tandem.engine.vllm_backend import VLLMBackend
from tandem.engine.vllm_turns import Replay, Row, Turn, keep_turn
from tandem.samplers import SENIOR, StepSampler, TokenSampler, WordSampler


def reference(sampler, context: int, script: list[int], coins, first_coin):
    """Step the sampler over ``script`` as the torch engine does; retracted tokens are dropped
    and the script's next token is the redraw. Returns the kept ``(token, author)`` pairs."""
    handoff = sampler.start(torch.tensor([context]), first_coin.view(1))
    kept, position, retracted = [], 0, False
    for token in script:
        author = int(handoff.author)
        coin = coins[position, int(retracted)].view(1)
        handoff = sampler.step(handoff.state, torch.tensor([token]), coin)
        retracted = handoff.retract is not None and bool(handoff.retract[0])
        if not retracted:
            kept.append((token, author))
            position += 1
            if handoff.done is not None and bool(handoff.done[0]):
                break
    return kept


def in_turns(sampler, context: int, script: list[int], coins, first_coin, vocab: int):
    """The same through the backend: each request writes the rest of the script until the
    processor ends its turn, and the backend's replay keeps what the turn holds."""
    backend = object.__new__(VLLMBackend)  # only its replay, no engine
    handoff = sampler.start(torch.tensor([context]), first_coin.view(1))
    row = Row([context], 1, turn=Turn(sampler, handoff.state, coins, 0, stop=0))
    params, used, requests = SamplingParams(max_new_tokens=len(script), eos_token_ids=()), 0, 0
    while row.stop is None and used < len(script):
        output: list[int] = []  # what the engine writes, read by the processor as it grows
        replay = Replay(Turn(**vars(row.turn)), output)
        for token in script[used:]:
            replay.advance(vocab)
            if replay.ended:
                break  # the processor forces the stop id here
            output.append(token)
        lps = [{t: SimpleNamespace(logprob=0.0)} for t in output]
        keep_turn(backend, row, SimpleNamespace(token_ids=output, logprobs=lps), params, ())
        used, requests = used + len(output), requests + 1
    return list(zip(row.tokens, row.authors, strict=True)), requests


SAMPLERS = {
    "word": lambda tok: WordSampler(tok, p=0.5, max_gap_tokens=3),
    "word_authors": lambda tok: WordSampler(tok, rule="after_boundary", boundary="leading_space"),
    "token": lambda tok: TokenSampler(p=0.3),
    "step": lambda tok: StepSampler(tok, max_rounds=3),
    "step_coin": lambda tok: StepSampler(tok, first="coin", alternate=False),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_turns_give_the_samplers_schedule(name, tokenizer):
    sampler = SAMPLERS[name](tokenizer)
    sampler.bind(len(tokenizer), "cpu")
    text = "We add 12 and 30.\n\nThen 42 - 2 = 40, so the answer is 40.\n\nDone: \\boxed{40}."
    script = tokenizer(text * 2).input_ids
    context = tokenizer("Q:\n").input_ids[-1]
    g, handovers = torch.Generator().manual_seed(0), 0
    for _ in range(5):
        first, coins = torch.rand(1, generator=g), torch.rand(len(script), 2, generator=g)
        expected = reference(sampler, context, script, coins, first)
        got, requests = in_turns(sampler, context, script, coins, first, len(tokenizer))
        assert got == expected
        handovers += requests - 1
    assert handovers > 0, "the schedule never handed over: nothing was checked"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_falls_back_to_torch_once(senior, prompts, tokenizer, caplog, monkeypatch):
    monkeypatch.setattr(backend_module, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="tandem.engine.backend"):
        first = build_backend("vllm", senior, None, tokenizer, sync_every=2)
        second = build_backend("vllm", senior, None, tokenizer)
    assert isinstance(first, TorchBackend) and isinstance(second, TorchBackend)
    warnings = [r for r in caplog.records if "vLLM is not installed" in r.getMessage()]
    assert len(warnings) == 1, "the fallback must be said once, not at every build"
    r = first.generate(prompts[:2], None, None)
    assert r.junior_logprobs is None and (r.authors[r.mask] == SENIOR).all()
    first.sync(senior, 7)
    assert first.weights_step == 7
