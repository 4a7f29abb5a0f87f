"""Fail closed: rollouts whose author mask cannot be trusted stop the run.

A missing author mask once turned a tandem run into plain GRPO without anyone noticing. Here a
tandem sampler whose batch of rollouts holds no junior token, or an author mask that does not
fit the tokens, raises before any gradient is taken.

What this file leaves out: config checks made before anything loads (``tandem.config``).
"""

from __future__ import annotations

from typing import Any

import torch

from tandem.engine import JUNIOR, PAD, SENIOR, Rollouts


class AuthorMaskError(RuntimeError):
    """The rollouts' author mask is missing, misaligned, or says the junior never wrote."""


def check_rollouts(rollouts: Rollouts, sampler: Any) -> None:
    """Raise ``AuthorMaskError`` unless ``authors`` fits ``tokens`` and matches the sampler."""
    tokens, authors = rollouts.tokens, rollouts.authors
    if authors is None or authors.shape != tokens.shape:
        raise AuthorMaskError(
            f"author mask of shape {None if authors is None else tuple(authors.shape)} does not "
            f"fit tokens of shape {tuple(tokens.shape)}; the loss mask is the author mask, so "
            "training cannot go on. This is a bug in the rollout backend."
        )
    valid = torch.isin(authors, torch.tensor([SENIOR, JUNIOR, PAD], device=authors.device))
    if not bool(valid.all()):
        raise AuthorMaskError(
            f"author mask holds values {sorted(set(authors[~valid].tolist()))}; only SENIOR "
            f"({SENIOR}), JUNIOR ({JUNIOR}) and PAD ({PAD}) are allowed."
        )
    lengths = rollouts.lengths.to(authors.device)
    positions = torch.arange(tokens.shape[1], device=authors.device)
    real = positions.unsqueeze(0) < lengths.unsqueeze(1)  # [N, T]
    if bool(((authors == PAD) == real).any()):
        raise AuthorMaskError(
            "author mask and lengths disagree: PAD must mark exactly the positions past each "
            "row's length. The rollouts are misaligned; refusing to train on them."
        )
    if expects_junior(sampler) and not bool((authors == JUNIOR).any()):
        raise AuthorMaskError(
            f"the {sampler.registry_name!r} sampler (p={getattr(sampler, 'p', None)}) should let "
            "the junior write, but no rollout in this batch holds a junior token. A tandem run "
            "that silently trains as plain GRPO is worse than a stopped one: check that the "
            "junior was loaded and passed to the engine, or use sampler=solo for GRPO."
        )


def expects_junior(sampler: Any) -> bool:
    """Whether a batch of this sampler's rollouts must hold junior tokens.

    Schedules that alternate at step or sentence ends are exempt: there the senior *can* keep
    the junior out by never ending a step (the loophole that ablation studies), which the
    senior-share metric shows rather than a stopped run.
    """
    if getattr(sampler, "solo", True) or getattr(sampler, "alternate", False):
        return False
    p = getattr(sampler, "p", None)
    return p is None or p < 1.0
