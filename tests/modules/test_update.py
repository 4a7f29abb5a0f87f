"""The update's gradient accumulated over packed micro-batches under a token budget equals one
padded pass over the whole mini-batch, for every aggregation and every term of the loss.

The reference is written here from the objective's definition: one forward over the padded
``[rows, prompt | response]`` block, the full log-softmax, each aggregate as a sum over the
masked tokens divided by its own count, so that it shares nothing with the packed path but the
model.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tandem.assets import TINY_WORLD
from tandem.modules.logprobs import micro_batches, prompt_groups, sequence_logprobs
from tandem.modules.loss import AGGREGATIONS, LossConfig, kl_penalty
from tandem.modules.sharding import checkpoint_layers
from tandem.modules.update import UpdateBatch, accumulate

# rows of very different lengths: a prompt of 1 token, a response of 1, one over the budget;
# rows 0, 3 and 6 answer one prompt, rows 1 and 5 another (GRPO groups)
SAME_AS = [0, 1, 2, 0, 4, 1, 0]
PROMPTS = [[3, 17, 1, 9, 30, 5, 12][k] for k in SAME_AS]
RESPONSES = [60, 1, 25, 3, 48, 7, 33]
TEMPERATURE = 0.6
BUDGET = 45


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(TINY_WORLD, dtype=torch.float32)


@pytest.fixture(scope="module")
def batch(model) -> UpdateBatch:
    g = torch.Generator().manual_seed(0)
    n, p, t = len(PROMPTS), max(PROMPTS), max(RESPONSES)
    ids = torch.randint(3, model.config.vocab_size, (n, p + t), generator=g)
    mask = torch.zeros(n, p + t, dtype=torch.long)
    for i, (a, b) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        mask[i, p - a : p] = 1
        mask[i, p : p + b] = 1
        ids[i, :p] = ids[SAME_AS[i], :p]
    with torch.no_grad():
        base = padded_logprobs(model, ids, mask, p)
    real = mask[:, p:].bool()
    # old and reference log-probs off the current ones, so that ratios leave 1 and some clip
    old = (base + 0.3 * torch.randn(base.shape, generator=g)) * real
    ref = (base + 0.5 * torch.randn(base.shape, generator=g)) * real
    senior = real & (torch.rand(real.shape, generator=g) < 0.6)
    return UpdateBatch(
        ids=ids,
        mask=mask,
        start=p,
        old=old,
        ref=ref,
        advantages=torch.randn(n, generator=g),
        senior_mask=senior,
        junior_mask=real & ~senior,
    )


def padded_logprobs(model, ids, mask, start) -> torch.Tensor:
    """``[N, T]`` one padded forward, the whole vocabulary's log-softmax."""
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    logp = (logits[:, start - 1 : -1].float() / TEMPERATURE).log_softmax(-1)
    return logp.gather(-1, ids[:, start:, None]).squeeze(-1) * mask[:, start:]


def reference_mean(values, mask, how, constant, every=None) -> torch.Tensor:
    """``every``: the response tokens of either author (the denominator of
    ``token_mean_all_authors``)."""
    mask = mask.float()
    if how == "token_mean_all_authors":
        return (values * mask).sum() / every.float().sum().clamp(min=1)
    if how == "token_mean":
        return (values * mask).sum() / mask.sum().clamp(min=1)
    if how == "seq_mean_token_mean":
        per_seq = (values * mask).sum(1) / mask.sum(1).clamp(min=1)
        has = (mask.sum(1) > 0).float()
        return (per_seq * has).sum() / has.sum().clamp(min=1)
    return (values * mask).sum() / (constant * values.shape[0])


def reference_loss(logp, b: UpdateBatch, cfg: LossConfig) -> torch.Tensor:
    ratio = torch.exp((logp - b.old).clamp(-20, 20))
    adv = b.advantages[:, None]
    clipped = ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * adv
    per_token = -torch.minimum(ratio * adv, clipped)
    every = b.senior_mask | b.junior_mask
    loss = reference_mean(per_token, b.senior_mask, cfg.aggregation, cfg.constant, every)
    if cfg.kl_beta:
        kl = kl_penalty(logp, b.ref, cfg.kl_estimator)
        kl = reference_mean(kl, b.senior_mask, cfg.aggregation, cfg.constant, every)
        loss = loss + cfg.kl_beta * kl
    if cfg.lambda_jun:
        loss = loss + cfg.lambda_jun * reference_mean(
            -logp, b.junior_mask, cfg.aggregation, cfg.constant, every
        )
    return loss


def gradient(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("kl_beta", [0.0, 0.05])
@pytest.mark.parametrize("lambda_jun", [0.0, 0.3])
def test_accumulated_packed_gradient_equals_one_padded_pass(
    model, batch, aggregation, kl_beta, lambda_jun
) -> None:
    cfg = LossConfig(aggregation=aggregation, kl_beta=kl_beta, lambda_jun=lambda_jun, constant=64)
    model.zero_grad(set_to_none=True)
    expected_loss = reference_loss(padded_logprobs(model, *batch_inputs(batch)), batch, cfg)
    expected_loss.backward()
    expected = gradient(model).clone()

    model.zero_grad(set_to_none=True)
    rows = torch.arange(len(PROMPTS))
    groups = prompt_groups(batch.ids, batch.mask, batch.start)
    parts = micro_batches(batch.mask.sum(1), BUDGET, groups)
    assert len(parts) >= 4, "the budget splits the mini-batch"
    assert any(len(p) > 1 for p in parts), "some micro-batches pack several rows"
    assert any(len(set(groups[p].tolist())) < len(p) for p in parts), "some share a prompt"
    stats, _ = accumulate(
        model,
        batch,
        rows,
        [(p, 1.0) for p in parts],
        cfg,
        TEMPERATURE,
        lambda loss: loss.backward(),
        chunk_tokens=7,
    )
    got = gradient(model)
    assert (got - expected).norm() / expected.norm() < 1e-5
    assert torch.allclose(stats["loss"], expected_loss.detach(), rtol=1e-5, atol=1e-7)


def test_a_repeat_with_no_share_adds_nothing(model, batch) -> None:
    cfg = LossConfig(lambda_jun=0.3)
    rows = torch.arange(len(PROMPTS))
    parts = [(p, 1.0) for p in micro_batches(batch.mask.sum(1), BUDGET)]
    grads = []
    for extra in ([], [(parts[0][0], 0.0)]):
        model.zero_grad(set_to_none=True)
        accumulate(model, batch, rows, parts + extra, cfg, TEMPERATURE, lambda x: x.backward())
        grads.append(gradient(model).clone())
    assert torch.equal(grads[0], grads[1])


def test_micro_batches_respect_the_budget_and_keep_every_row() -> None:
    tokens = torch.tensor([63, 18, 26, 12, 78, 12, 45, 5, 5, 5])
    parts = micro_batches(tokens, 50)
    assert sorted(torch.cat(parts).tolist()) == list(range(len(tokens)))
    for p in parts:
        # a row longer than the budget travels alone
        assert int(tokens[p].sum()) <= 50 or len(p) == 1
    assert len(micro_batches(tokens, None)) == 1


def test_a_row_joins_the_rows_of_its_prompt_where_it_fits() -> None:
    tokens = torch.tensor([40, 30, 10])
    # first fit alone puts row 2 beside row 0; its prompt's row is in the second pack
    assert [p.tolist() for p in micro_batches(tokens, 50)] == [[0, 2], [1]]
    parts = micro_batches(tokens, 50, torch.tensor([1, 0, 0]))
    assert [p.tolist() for p in parts] == [[0], [1, 2]]


def test_packed_logprobs_equal_a_padded_forward(model, batch) -> None:
    with torch.no_grad():
        padded = padded_logprobs(model, *batch_inputs(batch))
        packed = sequence_logprobs(model, *batch_inputs(batch), TEMPERATURE, chunk_tokens=5)
    assert torch.allclose(packed, padded, atol=2e-5)


def batch_inputs(b: UpdateBatch) -> tuple[torch.Tensor, torch.Tensor, int]:
    return b.ids, b.mask, b.start


def qwen151k() -> torch.nn.Module:
    """A random Qwen3 with Qwen3's 151,936-wide vocabulary and a small body (the benchmarks')."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=True,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config)


@pytest.mark.parametrize("which", ["tiny", "qwen151k"])
def test_checkpointed_layers_give_the_plain_gradient(model, batch, which) -> None:
    # the recomputation in backward reads the rows attention and its layout again: the plain
    # packed update's gradient, within 1e-6 relative
    net = model if which == "tiny" else qwen151k()
    net.train()
    cfg = LossConfig(kl_beta=0.05, lambda_jun=0.3)
    rows = torch.arange(len(PROMPTS))
    parts = [(p, 1.0) for p in micro_batches(batch.mask.sum(1), BUDGET)]
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            checkpoint_layers(net)
        net.zero_grad(set_to_none=True)
        accumulate(net, batch, rows, parts, cfg, TEMPERATURE, lambda x: x.backward())
        grads.append(gradient(net).clone())
    getattr(net, "activation_checkpointing_disable", net.gradient_checkpointing_disable)()
    plain, checkpointed = grads
    assert plain.norm() > 0
    assert (checkpointed - plain).norm() / plain.norm() < 1e-6
