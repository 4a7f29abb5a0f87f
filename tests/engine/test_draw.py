"""Token draws: each path samples the distribution it claims, and never a zero-mass token."""

from __future__ import annotations

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.draw import block_shape, draw, draw_mixed, logprobs, new_buffer, score

ROWS = 40_000  # draws per check: a 5-sigma band per token is a few tenths of a percent wide


def draws(logits: torch.Tensor, params: SamplingParams, allowed=None, rows=ROWS) -> torch.Tensor:
    """``rows`` tokens drawn from one row of ``logits [V]``, each with its own uniform."""
    batch = logits.expand(rows, -1).contiguous()
    buffer = new_buffer(rows, logits.shape[0], logits.device)
    scores = score(batch, params, buffer)
    u = torch.rand(rows, generator=torch.Generator().manual_seed(0))
    mask = None if allowed is None else allowed.expand(rows, -1)
    return draw(scores, torch.arange(rows), u, params, mask)


def assert_frequencies(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    """Every token's count within 5 standard deviations of its expectation; zero mass never."""
    counts = torch.bincount(tokens, minlength=probs.shape[0]).double()
    expected = tokens.shape[0] * probs.double()
    sigma = (expected * (1 - probs.double())).sqrt()
    assert (counts[probs == 0] == 0).all(), "a token of zero mass was drawn"
    assert ((counts - expected).abs() <= 5 * sigma + 2).all()


def peaked_logits(vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, generator=g) * 2.0


@pytest.mark.parametrize("vocab", [7, 50, 1110])  # 1110: the last block is partly padding
def test_fast_path_matches_softmax(vocab):
    logits = peaked_logits(vocab)
    logits[vocab // 2] = float("-inf")  # a masked token (e.g. padding rows) is never drawn
    logits[-1] = float("-inf")
    assert_frequencies(draws(logits, SamplingParams()), logits.softmax(-1))


def test_temperature_restriction_top_k_top_p():
    logits = peaked_logits(300)
    cold = SamplingParams(temperature=0.5)
    assert_frequencies(draws(logits, cold), (logits / 0.5).softmax(-1))
    allowed = torch.zeros(300, dtype=torch.bool)
    allowed[::7] = True
    restricted = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
    assert_frequencies(draws(logits, SamplingParams(), allowed), restricted)
    top = logits.topk(5).indices
    kept = torch.full_like(logits, float("-inf"))
    kept[top] = logits[top]
    assert_frequencies(draws(logits, SamplingParams(top_k=5)), kept.softmax(-1))


def test_restriction_to_tokens_far_below_the_best():
    # the allowed tokens' weights exp(logit - max) underflow to 0: the draw must renormalise
    logits = torch.full((20,), -300.0)
    logits[0] = 0.0
    logits[5], logits[9] = -200.0, -201.0
    allowed = torch.zeros(20, dtype=torch.bool)
    allowed[[5, 9]] = True
    restricted = logits.masked_fill(~allowed, float("-inf")).softmax(-1)
    assert_frequencies(draws(logits, SamplingParams(), allowed, rows=5000), restricted)


def test_top_p_grows_past_the_first_guess():
    # nearly flat over 600 ids: the 0.8 nucleus holds ~480 of them, beyond the first topk(256)
    logits = peaked_logits(600) * 0.05
    probs = logits.softmax(-1)
    ordered, order = probs.sort(descending=True)
    keep = (ordered.cumsum(0) - ordered) < 0.8
    nucleus = torch.zeros_like(probs)
    nucleus[order[keep]] = ordered[keep]
    assert keep.sum() > 256
    tokens = draws(logits, SamplingParams(top_p=0.8), rows=10_000)
    assert_frequencies(tokens, nucleus / nucleus.sum())


def test_extreme_uniforms_land_on_tokens_with_mass():
    vocab = 1110
    b, s = block_shape(vocab)
    assert b * s >= vocab and s * s >= vocab
    logits = torch.full((2, vocab), float("-inf"))
    logits[:, 3] = 0.0
    logits[:, 1000] = 0.0
    scores = score(logits, SamplingParams(), new_buffer(2, vocab, logits.device))
    u = torch.tensor([0.0, 1.0 - 2.0**-24])
    assert draw(scores, torch.arange(2), u, SamplingParams()).tolist() == [3, 1000]


def test_scores_give_the_raw_log_softmax():
    logits = peaked_logits(1110).expand(3, -1) * torch.tensor([[1.0], [3.0], [0.1]])
    tokens = torch.tensor([0, 500, 1109])
    want = logits.log_softmax(-1).gather(1, tokens[:, None]).squeeze(1)
    for params in (SamplingParams(), SamplingParams(temperature=0.6, top_k=4)):
        scores = score(logits, params, new_buffer(3, 1110, logits.device))
        assert torch.allclose(logprobs(scores, tokens), want, atol=1e-5)


@pytest.mark.parametrize("vocab", [50, 1110, 151_936])
def test_two_models_rows_in_one_search_draw_what_each_model_alone_draws(vocab):
    """``draw_mixed``: each row's token is the one its own model's scores give it."""
    g = torch.Generator().manual_seed(1)
    n, params = 48, SamplingParams()
    scores = [score(torch.randn(n, vocab, generator=g) * 3, params, new_buffer(n, vocab, "cpu"))]
    scores.append(
        score(torch.randn(n, vocab, generator=g) * 3, params, new_buffer(n, vocab, "cpu"))
    )
    which = torch.randint(0, 2, (n,), generator=g)
    u = torch.rand(n, generator=g)
    got = draw_mixed(scores, which, u)
    for m in (0, 1):
        rows = (which == m).nonzero().squeeze(1)
        assert torch.equal(got[rows], draw(scores[m], rows, u[rows], params))
    assert not torch.equal(draw(scores[0], None, u, params), draw(scores[1], None, u, params))
