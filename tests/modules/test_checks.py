"""Fail closed: rollouts whose author mask cannot be trusted stop training."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer

from tandem.assets import TINY_WORLD
from tandem.engine import JUNIOR, PAD, SENIOR, Rollouts
from tandem.modules.checks import AuthorMaskError, check_rollouts
from tandem.registry import SAMPLERS
from tandem.samplers import WordSampler

NEWLINE = 201  # the last prompt token: a word may begin after it


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY_WORLD)


def rollouts(authors: list[list[int]], lengths: list[int], tokens=None) -> Rollouts:
    a = torch.tensor(authors)
    n, t = a.shape
    if tokens is None:
        tokens = [[5] * t] * n
    return Rollouts(
        tokens=torch.where(a == PAD, 0, torch.tensor(tokens)),
        authors=a,
        senior_logprobs=torch.zeros(n, t),
        junior_logprobs=torch.zeros(n, t),
        lengths=torch.tensor(lengths),
        stop_reasons=torch.zeros(n, dtype=torch.long),
        prompt_tokens=torch.full((n, 2), NEWLINE),
        prompt_lengths=torch.full((n,), 2),
        prompt_index=torch.arange(n),
        pad_token_id=0,
    )


def senior_wrote(tokenizer, text: str, rows: int) -> Rollouts:
    """``rows`` rollouts of ``text``, every token the senior's."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return rollouts([[SENIOR] * len(ids)] * rows, [len(ids)] * rows, [ids] * rows)


def test_tandem_rollouts_without_a_junior_token_stop_the_run(tokenizer) -> None:
    word = SAMPLERS.build("word", tokenizer=tokenizer, p=0.5)
    # the first token's coin, then one at each of Ġc Ġs Ġon Ġthe Ġma: 6 coins a row
    text = "the cat sat on the mat"
    many = senior_wrote(tokenizer, text, rows=8)
    odds = word.senior_only_logprob(many.prompt_tokens[:, -1], many.tokens, many.lengths)
    assert odds == pytest.approx(48 * math.log(0.5))
    # a last token that begins a word was a coin too: its loser would have written it
    last = senior_wrote(tokenizer, "the cat sat on the", rows=1)
    odds = word.senior_only_logprob(last.prompt_tokens[:, -1], last.tokens, last.lengths)
    assert odds == pytest.approx(5 * math.log(0.5))
    with pytest.raises(AuthorMaskError, match="no rollout in this batch holds a junior token"):
        check_rollouts(many, word)
    # the same rollouts are fine for GRPO, and for a tandem sampler that never hands over
    check_rollouts(many, SAMPLERS.build("solo", tokenizer=tokenizer))
    check_rollouts(many, SAMPLERS.build("word", tokenizer=tokenizer, p=1.0))
    # two short rows: 4 coins, all the senior's one time in 16: a legitimate batch
    check_rollouts(senior_wrote(tokenizer, "a b", rows=2), word)
    mixed = rollouts([[SENIOR, JUNIOR, PAD], [SENIOR, SENIOR, SENIOR]], [2, 3])
    check_rollouts(mixed, word)


def test_the_odds_are_the_rules_own(tokenizer) -> None:
    # a coin at every token: one decision per real token, none past a row's length
    token = SAMPLERS.build("token", tokenizer=tokenizer, p=0.9)
    r = rollouts([[SENIOR] * 4, [SENIOR, SENIOR, PAD, PAD], [PAD] * 4], [4, 2, 0])
    assert token.senior_only_logprob(r.prompt_tokens[:, -1], r.tokens, r.lengths) == pytest.approx(
        6 * math.log(0.9)
    )
    # the authors' rule: the coin after each emitted word start decides the next token, so the
    # last token's onset (Ġma is followed by t) decides one and a final onset none
    after = WordSampler(tokenizer, p=0.5, rule="after_boundary", boundary="leading_space")
    one = senior_wrote(tokenizer, "the cat sat on the mat", rows=1)
    onsets = sum(bool(after.tables.leading_space[t]) for t in one.tokens[0, :-1].tolist())
    assert after.senior_only_logprob(
        one.prompt_tokens[:, -1], one.tokens, one.lengths
    ) == pytest.approx((1 + onsets) * math.log(0.5))


def test_author_mask_that_does_not_fit_the_tokens(tokenizer) -> None:
    solo = SAMPLERS.build("solo", tokenizer=tokenizer)
    # PAD inside a row's length, or a real author past it: misaligned
    with pytest.raises(AuthorMaskError, match="disagree"):
        check_rollouts(rollouts([[SENIOR, PAD, PAD]], [3]), solo)
    with pytest.raises(AuthorMaskError, match="disagree"):
        check_rollouts(rollouts([[SENIOR, SENIOR, SENIOR]], [2]), solo)
    with pytest.raises(AuthorMaskError, match="values \\[7\\]"):
        check_rollouts(rollouts([[SENIOR, 7, PAD]], [2]), solo)


def test_alternating_schedules_may_starve_the_junior(tokenizer) -> None:
    # alternation at step ends: a senior that never ends a step keeps the pen, legitimately
    step = SAMPLERS.build("step", tokenizer=tokenizer)
    check_rollouts(senior_wrote(tokenizer, "step one. step two", rows=8), step)
    # but a step end followed by more senior tokens means the junior was never asked
    with pytest.raises(AuthorMaskError, match="gives no chance"):
        check_rollouts(senior_wrote(tokenizer, "step one.\n\nstep two", rows=1), step)
    # a step end as a row's last token hands over nothing
    check_rollouts(senior_wrote(tokenizer, "step one.\n\n", rows=8), step)
    only_senior = rollouts([[SENIOR, SENIOR, SENIOR]], [3])
    check_rollouts(only_senior, SAMPLERS.build("sentence", tokenizer=tokenizer))
    coin = SAMPLERS.build("sentence", tokenizer=tokenizer, alternate=False, p=0.5)
    check_rollouts(only_senior, coin)  # one coin, at the start
    sentences = senior_wrote(tokenizer, "One.\n\nTwo.\n\nThree.\n\nFour.\n\nFive.", rows=8)
    with pytest.raises(AuthorMaskError, match="junior token"):
        check_rollouts(sentences, coin)
