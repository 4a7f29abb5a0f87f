"""A packed forward's rows attention (``tandem_rows``) gives what transformers' own packed mask
gives, log-probs and gradient alike, and leaves the model's attention as it found it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import tandem.modules.logprobs as logprobs
from tandem.assets import TINY_WORLD
from tandem.modules.logprobs import RowLayout, lays_out_rows, pack, packed_logprobs

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
    layout = RowLayout.of(packed.positions[0])
    lengths = [a + b for a, b in zip(PROMPTS, RESPONSES, strict=True)]
    assert (layout.rows, layout.width) == (len(lengths), max(lengths))
    expected = torch.cat([i * max(lengths) + torch.arange(n) for i, n in enumerate(lengths)])
    assert torch.equal(layout.slots, expected)


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
