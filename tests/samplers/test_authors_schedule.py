"""The authors' word schedule on Qwen3's real vocabulary: boundary set and handoff statistics.

The authors' vLLM fork redraws the author after emitting a token whose surface starts with
``Ġ`` (ids below ``tokenizer.vocab_size``), or after 32 tokens without one; the first token's
author is a coin; no proposal is ever redrawn. Here a scalar replay of that rule, written from
its description, says where coins may fall, and ``conf/sampler/word_authors.yaml``'s sampler,
stepped over real text, must change authors only there, at the coin's rate.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from test_schedules import changed, within_binomial

from tandem.registry import SAMPLERS
from tandem.samplers import SENIOR

CONF = Path(__file__).resolve().parents[2] / "conf" / "sampler" / "word_authors.yaml"
TEXT = (
    "To find the sum, note that $\\frac{a}{b} + \\frac{c}{d} = \\frac{ad + bc}{bd}$.\n\n"
    "Then we compute:\n\\[\\sum_{k=1}^{n} k^2 = \\frac{n(n+1)(2n+1)}{6}\\]\n"
    "So for n = 12345, the value is 636{,}503{,}155. Hence \\boxed{636503155}.\n\n"
    "\\begin{align*}x_1x_2x_3x_4x_5x_6x_7x_8x_9x_{10}x_{11}x_{12}x_{13}x_{14}x_{15}"
    "y_1y_2y_3y_4y_5y_6y_7y_8y_9y_{10}\\end{align*}\n"
)


def authors_sampler(tokenizer, p: float):
    spec = yaml.safe_load(CONF.read_text())
    return SAMPLERS.build(spec.pop("name"), tokenizer=tokenizer, **{**spec, "p": p})


def replay_coins(tokens: list[int], boundary: set[int], max_gap: int) -> list[bool]:
    """Where the authors' rule draws a coin: before token 0, and after each boundary token or
    each ``max_gap`` tokens without a redraw (the fork's ``_word_post_update``)."""
    coins, since = [True], 0
    for tid in tokens[:-1]:
        since += 1
        redraw = tid in boundary or since >= max_gap
        coins.append(redraw)
        if redraw:
            since = 0
    return coins


def authors_boundary(tokenizer) -> set[int]:
    """The authors' set, from the vocabulary's own spelling."""
    vocab = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
    return {i for i, piece in enumerate(vocab) if piece.startswith("Ġ")}


def test_boundary_set_is_the_authors_53021_ids(qwen_tokenizer) -> None:
    sampler = authors_sampler(qwen_tokenizer, 0.5)
    table = sampler.tables.leading_space
    theirs = authors_boundary(qwen_tokenizer)
    assert len(theirs) == 53_021
    assert set(table.nonzero().squeeze(1).tolist()) == theirs
    ids = qwen_tokenizer.convert_tokens_to_ids
    assert table[ids("Ġ")] and table[ids("Ġthe")] and not table[ids("the")]
    assert not table[ids("ĊĊ")] and not table[ids("<|im_end|>")]


@pytest.mark.parametrize("p", [0.5, 0.2])
def test_handoffs_fall_where_the_authors_rule_says(qwen_tokenizer, p: float) -> None:
    tokens = qwen_tokenizer(TEXT * 3).input_ids
    boundary = authors_boundary(qwen_tokenizer)
    coins = torch.tensor(replay_coins(tokens, boundary, 32))  # [T]
    after_space = torch.tensor([t in boundary for t in tokens[:-1]])  # [T-1]
    assert coins.sum() > 40 and (coins[1:] & ~after_space).any(), (
        "the text must hold both boundary coins and max-gap coins"
    )

    rows = 256
    sampler = authors_sampler(qwen_tokenizer, p)
    newline = qwen_tokenizer.convert_tokens_to_ids("Ċ")
    sampler.bind(len(qwen_tokenizer), "cpu")
    g = torch.Generator().manual_seed(0)
    handoff = sampler.start(torch.full((rows,), newline), torch.rand(rows, generator=g))
    authors = []
    for tid in tokens:
        authors.append(handoff.author)
        token = torch.full((rows,), tid)
        handoff = sampler.step(handoff.state, token, torch.rand(rows, generator=g))
        assert handoff.retract is None, "no proposal is redrawn at a switch"
    authors = torch.stack(authors, 1)  # [rows, T]
    moved = changed(authors)  # [rows, T-1]: position t's author differs from t-1's
    at = coins[1:].expand_as(moved)
    assert not moved[~at].any(), "the author changed where no coin falls"
    # each coin is fresh: it changes the author with probability 2p(1-p)
    assert within_binomial(int(moved[at].sum()), int(at.sum()), 2 * p * (1 - p))
    # the first token's author is a coin too
    assert within_binomial(int((authors[:, 0] == SENIOR).sum()), rows, p)
