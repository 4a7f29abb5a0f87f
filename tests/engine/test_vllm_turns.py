"""Turns (the vLLM backend's view of a handoff sampler) and the backend fallback; no vLLM needed.

The scalar boundary rules that turns use inside a request must be the samplers' rules exactly,
and the number of coins an author keeps the pen for must be geometric in the coin's odds.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

from tandem.engine import TorchBackend, build_backend
from tandem.engine import backend as backend_module
from tandem.engine.turns import Schedule, TurnTables
from tandem.samplers import SENIOR, SoloSampler, StepSampler, WordSampler
from tandem.samplers.boundaries import leading_space, sentence_end, step_end, word_onset


def test_scalar_rules_are_the_samplers_rules(tokenizer):
    sampler = WordSampler(tokenizer)
    tables = TurnTables(sampler.tables)
    v = sampler.tables.size
    token = torch.arange(v).repeat(v)  # every (prev, token) pair of the vocabulary
    prev = torch.arange(v).repeat_interleave(v)
    rules = (
        ("word", word_onset),
        ("space", leading_space),
        ("step", step_end),
        ("sentence", sentence_end),
    )
    for name, rule in rules:
        expected = rule(sampler.tables, token, prev).view(v, v)  # [prev, token]
        scalar = getattr(tables, name)
        got = torch.tensor([[bool(scalar(t, p)) for t in range(v)] for p in range(v)])
        assert torch.equal(got, expected), name
        assert expected.any(), f"the tiny vocabulary has no {name} boundary to check"
    allowed = tables.allowed_after(int(prev[5]))
    assert torch.equal(allowed, word_onset(sampler.tables, torch.arange(v), prev[5].expand(v)))


@pytest.mark.parametrize("p", [0.5, 0.8])
def test_turn_lengths_are_geometric(p, tokenizer):
    """An author keeps the pen for K coins with P(K >= k) = q^k, q the odds of being redrawn."""
    schedule = Schedule(WordSampler(tokenizer, p=p, seed=0))
    n = 20_000
    keeps = torch.tensor([schedule.turn(SENIOR, 0).keep for _ in range(n)], dtype=torch.float)
    mean, var = p / (1 - p), p / (1 - p) ** 2  # the geometric law on {0, 1, ...}
    assert abs(keeps.mean() - mean) < 4 * (var / n) ** 0.5
    assert abs((keeps >= 2).float().mean() - p**2) < 4 * (p**2 * (1 - p**2) / n) ** 0.5
    firsts = torch.tensor([schedule.first_author() for _ in range(n)], dtype=torch.float)
    assert abs((firsts == SENIOR).float().mean() - p) < 4 * (p * (1 - p) / n) ** 0.5


def test_schedules(tokenizer):
    authors = Schedule(WordSampler(tokenizer, rule="after_boundary", boundary="leading_space"))
    assert (authors.boundary, authors.rule, authors.max_gap) == ("space", "after", 32)
    step = Schedule(StepSampler(tokenizer))
    assert step.first_author() == SENIOR and step.turn(SENIOR, 0).keep == 0  # alternation
    with pytest.raises(NotImplementedError, match="torch backend"):
        Schedule(SoloSampler())


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
