"""Fail closed: rollouts whose author mask cannot be trusted stop training."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from tandem.assets import TINY_WORLD
from tandem.engine import JUNIOR, PAD, SENIOR, Rollouts
from tandem.modules.checks import AuthorMaskError, check_rollouts
from tandem.registry import SAMPLERS


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY_WORLD)


def rollouts(authors: list[list[int]], lengths: list[int]) -> Rollouts:
    a = torch.tensor(authors)
    n, t = a.shape
    return Rollouts(
        tokens=torch.where(a == PAD, 0, 5),
        authors=a,
        senior_logprobs=torch.zeros(n, t),
        junior_logprobs=torch.zeros(n, t),
        lengths=torch.tensor(lengths),
        stop_reasons=torch.zeros(n, dtype=torch.long),
        prompt_tokens=torch.ones(n, 2, dtype=torch.long),
        prompt_lengths=torch.full((n,), 2),
        prompt_index=torch.arange(n),
        pad_token_id=0,
    )


def test_tandem_rollouts_without_a_junior_token_stop_the_run(tokenizer) -> None:
    word = SAMPLERS.build("word", tokenizer=tokenizer, p=0.5)
    only_senior = rollouts([[SENIOR, SENIOR, PAD], [SENIOR, SENIOR, SENIOR]], [2, 3])
    with pytest.raises(AuthorMaskError, match="no rollout in this batch holds a junior token"):
        check_rollouts(only_senior, word)
    # the same rollouts are fine for GRPO, and for a tandem sampler that never hands over
    check_rollouts(only_senior, SAMPLERS.build("solo", tokenizer=tokenizer))
    check_rollouts(only_senior, SAMPLERS.build("word", tokenizer=tokenizer, p=1.0))
    mixed = rollouts([[SENIOR, JUNIOR, PAD], [SENIOR, SENIOR, SENIOR]], [2, 3])
    check_rollouts(mixed, word)


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
    only_senior = rollouts([[SENIOR, SENIOR, SENIOR]], [3])
    check_rollouts(only_senior, SAMPLERS.build("sentence", tokenizer=tokenizer))
    with pytest.raises(AuthorMaskError, match="junior token"):
        check_rollouts(
            only_senior, SAMPLERS.build("sentence", tokenizer=tokenizer, alternate=False, p=0.5)
        )
