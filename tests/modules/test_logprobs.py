"""A packed forward's rows attention (``tandem_rows``) gives what transformers' own packed mask
gives, log-probs and gradient alike, and leaves the model's attention as it found it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import tandem.modules.logprobs as logprobs
from tandem.assets import TINY_WORLD
from tandem.modules.logprobs import lays_out_rows, pack, packed_logprobs

# rows of very different lengths, a prompt of 1 token and a response of 1 among them
PROMPTS = [3, 17, 1, 9, 30]
RESPONSES = [60, 1, 25, 3, 48]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(TINY_WORLD, dtype=torch.float32)


@pytest.fixture(scope="module")
def packed(model) -> logprobs.Packed:
    g = torch.Generator().manual_seed(0)
    n, p, t = len(PROMPTS), max(PROMPTS), max(RESPONSES)
    ids = torch.randint(3, model.config.vocab_size, (n, p + t), generator=g)
    mask = torch.zeros(n, p + t, dtype=torch.long)
    for i, (a, b) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        mask[i, p - a : p] = 1
        mask[i, p : p + b] = 1
    return pack(ids, mask, p)


def logprobs_and_gradient(model, packed) -> tuple[torch.Tensor, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    (lp,) = packed_logprobs(model, packed, [0.6], chunk_tokens=16)
    (lp * torch.linspace(-1, 1, lp.numel()).view(lp.shape)).sum().backward()
    return lp.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


def test_rows_attention_equals_the_packed_mask(model, packed, monkeypatch) -> None:
    assert lays_out_rows(model), "the tiny world's sdpa model takes rows attention"
    rows_lp, rows_grad = logprobs_and_gradient(model, packed)
    monkeypatch.setattr(logprobs, "lays_out_rows", lambda m: False)
    mask_lp, mask_grad = logprobs_and_gradient(model, packed)
    assert torch.allclose(rows_lp, mask_lp, atol=2e-5)
    assert (rows_grad - mask_grad).norm() / mask_grad.norm() < 1e-5


def test_the_layout_puts_each_token_at_its_row_and_position(packed) -> None:
    layout = packed.layout
    lengths = [a + b for a, b in zip(PROMPTS, RESPONSES, strict=True)]
    assert (layout.rows, layout.width) == (len(lengths), max(lengths))
    expected = torch.cat([i * max(lengths) + torch.arange(n) for i, n in enumerate(lengths)])
    assert torch.equal(layout.slots, expected)
    assert not packed.shares_prompts


def groups(model) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Three groups' rows, interleaved: prompts of 5, 12 and 1 tokens shared by 3, 2 and 1 rows
    with responses of very different lengths."""
    g = torch.Generator().manual_seed(1)
    plens, of = [5, 12, 1], [0, 1, 0, 2, 1, 0]
    rlens = [30, 2, 17, 9, 1, 44]
    p, t = max(plens), max(rlens)
    prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=g) for n in plens]
    ids = torch.randint(3, model.config.vocab_size, (len(of), p + t), generator=g)
    mask = torch.zeros_like(ids)
    for i, (k, r) in enumerate(zip(of, rlens, strict=True)):
        ids[i, p - plens[k] : p] = prompts[k]
        mask[i, p - plens[k] : p + r] = 1
    return ids, mask, p


def test_rows_of_one_prompt_read_one_copy_of_it_and_get_the_same_gradient(model) -> None:
    ids, mask, p = groups(model)
    alone, shared = pack(ids, mask, p), pack(ids, mask, p, share_prompts=True)
    # each prompt once: 5 + 12 + 1 of the 3 * 5 + 2 * 12 + 1 prompt tokens
    assert alone.tokens - shared.tokens == (3 * 5 + 2 * 12 + 1) - (5 + 12 + 1)
    assert shared.shares_prompts and (shared.layout.rows, shared.layout.width) == (6, 49)
    alone_lp, alone_grad = logprobs_and_gradient(model, alone)
    shared_lp, shared_grad = logprobs_and_gradient(model, shared)
    assert torch.allclose(shared_lp, alone_lp, atol=2e-5)
    assert (shared_grad - alone_grad).norm() / alone_grad.norm() < 1e-5
    assert (alone_lp[mask[:, p:] == 0] == 0).all()


def test_a_model_that_cannot_lay_rows_out_refuses_a_shared_pack(model, monkeypatch) -> None:
    ids, mask, p = groups(model)
    monkeypatch.setattr(logprobs, "lays_out_rows", lambda m: False)
    with pytest.raises(ValueError, match="must not share prompts"), torch.no_grad():
        packed_logprobs(model, pack(ids, mask, p, share_prompts=True), [1.0])


def test_the_model_keeps_its_attention_even_when_the_forward_fails(model, packed) -> None:
    def broken(*args, **kwargs):
        assert model.config._attn_implementation == logprobs.ROWS_ATTENTION
        raise RuntimeError("forward failed")

    head = model.get_output_embeddings()
    model.forward, before = broken, model.config._attn_implementation
    try:
        with pytest.raises(RuntimeError, match="forward failed"):
            packed_logprobs(model, packed, [1.0])
    finally:
        del model.forward
    assert model.config._attn_implementation == before == "sdpa"
    assert model.get_output_embeddings() is head


def test_other_attentions_keep_transformers_packed_mask(packed) -> None:
    eager = AutoModelForCausalLM.from_pretrained(
        TINY_WORLD, dtype=torch.float32, attn_implementation="eager"
    )
    sdpa = AutoModelForCausalLM.from_pretrained(TINY_WORLD, dtype=torch.float32)
    assert not lays_out_rows(eager)
    with torch.no_grad():
        (got,) = packed_logprobs(eager, packed, [1.0])
        (rows,) = packed_logprobs(sdpa, packed, [1.0])
    assert eager.config._attn_implementation == "eager"
    assert torch.allclose(got, rows, atol=2e-5)
