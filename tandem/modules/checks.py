"""Fail closed: rollouts whose author mask cannot be trusted stop the run.

A missing author mask once turned a tandem run into plain GRPO without anyone noticing. Here an
author mask that does not fit the tokens raises before any gradient is taken, and so does a
tandem batch with no junior token where the sampler's own rule, replayed on the batch's tokens
(``Sampler.senior_only_logprob``), gives that less than a one-in-a-million chance: a schedule that
may legitimately keep the junior out (alternation at step ends the senior never writes, a coin
on few short rows) runs on, and a false stop comes at most once in a million batches.

What this file leaves out: config checks made before anything loads (``tandem.config``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tandem.engine import JUNIOR, PAD, SENIOR, Rollouts

#: A tandem batch with no junior token stops the run when its rule gives that less chance.
NO_JUNIOR_ODDS = 1e-6


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
    if getattr(sampler, "solo", True) or bool((authors == JUNIOR).any()):
        return
    logprob = sampler.senior_only_logprob(rollouts.prompt_tokens[:, -1], tokens, rollouts.lengths)
    if logprob < math.log(NO_JUNIOR_ODDS):
        odds = "no chance" if logprob == float("-inf") else f"a chance of e^{logprob:.0f}"
        raise AuthorMaskError(
            f"the {sampler!r} sampler should let the junior write, but no rollout in this "
            f"batch holds a junior token: its rule gives {odds} of that on these tokens. A "
            "tandem run that silently trains as plain GRPO is worse than a stopped one: check "
            "that the junior was loaded and passed to the engine, or use sampler=solo for GRPO."
        )
