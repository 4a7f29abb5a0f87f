"""The policy loss at the sampling temperature: engine records, hand gradients, exact ratios."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_train import config, metrics_rows
from transformers import AutoModelForCausalLM

import tandem.modules.update as update
from tandem.assets import TINY_WORLD
from tandem.engine import SamplingParams, generate
from tandem.modules.logprobs import packed_logprobs, sequence_logprobs
from tandem.modules.loss import LossConfig, grpo_loss
from tandem.modules.models import load_tokenizer
from tandem.registry import SAMPLERS
from tandem.train import run


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def pair():
    senior = AutoModelForCausalLM.from_pretrained(TINY_WORLD).eval()
    junior = AutoModelForCausalLM.from_pretrained(TINY_WORLD).eval()
    with torch.no_grad():  # a junior that differs, so its log-probs are not the senior's
        for p in junior.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return senior, junior


def test_engine_records_logprobs_at_the_loss_temperature(pair, tiny_tokenizer) -> None:
    senior, junior = pair
    prompts = [tiny_tokenizer("Tom has 5 apples.").input_ids, tiny_tokenizer("Add 3").input_ids]
    sampler = SAMPLERS.build("word", tokenizer=tiny_tokenizer, p=0.5)
    params = SamplingParams(
        max_new_tokens=12, temperature=0.6, seed=3, samples_per_prompt=2, logprob_temperature=0.6
    )
    r = generate(senior, junior, prompts, sampler, params)
    ids, mask = r.sequences()
    start = r.prompt_tokens.shape[1]
    with torch.no_grad():
        for model, recorded, raw in (
            (senior, r.old_logprobs, r.senior_logprobs),
            (junior, r.ref_logprobs, r.junior_logprobs),
        ):
            at_t, at_1 = sequence_logprobs(model, ids, mask, start, [0.6, 1.0])
            # float32 over a cache read token by token vs one pass: ~1e-5 on -18 nats
            assert torch.allclose(recorded, at_t, atol=1e-4)
            assert torch.allclose(raw, at_1, atol=1e-4)
            # the two kinds really differ: temperature is not a no-op here
            assert (recorded - raw)[r.mask].abs().max() > 1e-2


def test_engine_at_temperature_one_records_the_raw_logprobs(pair, tiny_tokenizer) -> None:
    senior, _ = pair
    params = SamplingParams(max_new_tokens=8, seed=1, logprob_temperature=1.0)
    r = generate(senior, None, [tiny_tokenizer("Add 3").input_ids], None, params)
    assert torch.equal(r.old_logprobs, r.senior_logprobs) and r.ref_logprobs is None
    assert (
        generate(senior, None, [[1, 2]], None, SamplingParams(max_new_tokens=4)).old_logprobs
        is None
    )


class Logits(torch.nn.Module):
    """A 'model' whose last hidden states are its parameter and whose LM head is the identity:
    its logits are the parameter, and gradients land on them directly."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.z = torch.nn.Parameter(logits.clone())  # [1, L, V]
        self.head = torch.nn.Identity()

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, input_ids, position_ids, use_cache):
        return type("Out", (), {"logits": self.head(self.z)})()


@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_per_token_gradient_matches_a_hand_computation(temperature: float) -> None:
    torch.manual_seed(0)
    v, prompt, response = 5, 2, 3
    ids = torch.tensor([[0, 1, 4, 2, 3]])  # [1, P+T]
    mask = torch.ones_like(ids)
    model = Logits(torch.randn(1, prompt + response, v))
    logp = sequence_logprobs(model, ids, mask, prompt, temperature)  # [1, T]
    authors = torch.tensor([[True, False, True]])  # the middle token is the junior's
    adv = torch.tensor([0.7])
    loss, stats = grpo_loss(
        logp, logp.detach(), None, adv, authors, ~authors, LossConfig(aggregation="token_mean")
    )
    assert stats["ratio_mean"] == 1.0
    loss.backward()
    # by hand: d(-A * ratio)/dz = -A * (onehot - softmax(z / T)) / T at ratio 1, per senior
    # token, divided by the 2 senior tokens; nothing for the junior's token or the prompt
    z = model.z.detach()[0]  # [L, V]
    expected = torch.zeros_like(z)
    for t in range(response):
        if authors[0, t]:
            row = prompt - 1 + t  # the logit row that predicts response token t
            onehot = torch.nn.functional.one_hot(ids[0, prompt + t], v).float()
            expected[row] = -adv * (onehot - torch.softmax(z[row] / temperature, -1))
            expected[row] /= temperature * authors.sum()
    assert torch.allclose(model.z.grad[0], expected, atol=1e-6)


@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_first_pass_ratio_is_exactly_one_from_the_trainer(
    tmp_path: Path, monkeypatch, temperature: float
) -> None:
    seen = []
    real = update.grpo_loss

    def spy(logp, old_logp, *args):
        seen.append((logp.detach().clone(), old_logp.clone()))
        return real(logp, old_logp, *args)

    forced = []
    real_forced = update.packed_logprobs

    def spy_forced(model, packed, temperatures, chunk_tokens):
        out = real_forced(model, packed, temperatures, chunk_tokens)
        forced.append(packed)
        return out

    monkeypatch.setattr(update, "grpo_loss", spy)
    monkeypatch.setattr(update, "packed_logprobs", spy_forced)
    run(
        config(
            tmp_path,
            "trainer.max_steps=1",
            f"generation.temperature={temperature}",
            "module.old_logprobs=trainer",
        )
    )
    ((logp, old),) = seen
    assert torch.equal(logp, old), "the first pass's ratio is exactly 1"
    (row,) = [r for r in metrics_rows(tmp_path) if r.get("train/reward")]
    assert float(row["train/ratio_mean"]) == 1.0
    # the engine (float32, the trainer's own weights) agrees with the trainer
    assert 0.0 <= float(row["train/engine_logprob_gap"]) < 1e-4
    # the loss's log-probs are the base's at the sampling temperature, not the raw ones
    base = AutoModelForCausalLM.from_pretrained(TINY_WORLD)
    with torch.no_grad():
        at_t, raw = packed_logprobs(base, forced[-1], [temperature, 1.0])
    assert torch.allclose(logp, at_t, atol=1e-5)
    if temperature != 1.0:
        assert not torch.allclose(logp, raw, atol=1e-3)


def test_engine_old_logprobs_give_a_ratio_near_one(tmp_path: Path) -> None:
    run(config(tmp_path, "trainer.max_steps=1", "module.old_logprobs=auto"))
    (row,) = [r for r in metrics_rows(tmp_path) if r.get("train/reward")]
    assert abs(float(row["train/ratio_mean"]) - 1.0) < 1e-5
    assert 0.0 <= float(row["train/engine_logprob_gap"]) < 1e-4
