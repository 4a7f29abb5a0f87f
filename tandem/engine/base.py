"""The engine's contract: what ``generate`` takes (``SamplingParams``) and gives (``Rollouts``).

``Rollouts`` holds N rows (prompts x samples per prompt, prompt-major, so that GRPO's groups are
contiguous), every ``[N, T]`` tensor aligned by construction: position ``t`` of a row is one
token, its author, and its log-prob under each model.

Log-probs come in two kinds. ``senior_logprobs`` and ``junior_logprobs`` are the *raw* model's:
``log_softmax`` of the logits at temperature 1, without top-k or top-p, for the emitted token
under each model; the drift and legibility metrics measure those. ``old_logprobs`` and
``ref_logprobs``, recorded when ``SamplingParams.logprob_temperature`` is set, are the same with
the logits divided by that temperature first: the quantity GRPO's ratio and its KL term use, as in
verl and TRL (the trainer recomputes it with gradients). Neither includes top-k, top-p or the word
sampler's onset restriction: those only decide which token is drawn.

``SamplingParams`` is defined in ``tandem.engine.params`` (no torch there, so that the config
check reads its rules before the heavy imports) and exported here.

What this file leaves out: the generation loop (``tandem.engine.loop``), the layout every engine
builds its rollouts with (``tandem.engine.layout``) and token sampling (``tandem.engine.draw``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from tandem.engine.params import SamplingParams
from tandem.samplers.base import JUNIOR, PAD, SENIOR

__all__ = ["JUNIOR", "PAD", "SENIOR", "Lockstep", "Rollouts", "SamplingParams", "StopReason"]

# For a senior whose forward is a collective (FSDP2 gathering each layer as it computes), so
# that every process must make as many forwards: called by every process at the same points
# with its own value, returns the largest any process passed (an all-reduce of the maximum).
Lockstep = Callable[[int], int]


class StopReason(enum.IntEnum):
    """Why a row stopped (``Rollouts.stop_reasons``)."""

    EOS = 0  # the row emitted one of the EOS ids (kept as its last token)
    # the row ran out of room: max_new_tokens, or what context_limit leaves after its prompt
    # (SamplingParams.budget), or its schedule ended it (Handoff.done: a cap on turns); so
    # masking truncated rows masks all three
    LENGTH = 1


@dataclass(frozen=True)
class Rollouts:
    """N co-written responses, aligned token by token.

    Positions past a row's length hold ``pad_token_id`` in ``tokens``, ``PAD`` in ``authors``
    and 0 in the log-probs. A row's last token is its EOS when it stopped on one.

    Attributes:
        tokens: response token ids.
        authors: SENIOR (1), JUNIOR (0), or PAD (-1) past the end.
        senior_logprobs: each token's raw log-prob under the senior (float32).
        junior_logprobs: the same under the junior; ``None`` when no junior ran (solo).
        lengths: response tokens per row, EOS included.
        stop_reasons: a ``StopReason`` per row.
        prompt_tokens: the prompts, left-padded with ``pad_token_id``.
        prompt_lengths: each row's prompt length.
        prompt_index: which input prompt each row answers.
        pad_token_id: the padding id used in ``tokens`` and ``prompt_tokens``.
        texts: each response decoded once from ``tokens[:length]`` (special tokens skipped);
            ``None`` when ``generate`` had no tokenizer.
        old_logprobs: each token's senior log-prob at ``SamplingParams.logprob_temperature``
            (the policy loss's old log-probs); ``None`` when not recorded.
        ref_logprobs: the same under the junior (the KL term's reference); ``None`` when not
            recorded or no junior ran.
    """

    tokens: Tensor  # [N, T] long
    authors: Tensor  # [N, T] long
    senior_logprobs: Tensor  # [N, T] float32
    junior_logprobs: Tensor | None  # [N, T] float32
    lengths: Tensor  # [N] long
    stop_reasons: Tensor  # [N] long
    prompt_tokens: Tensor  # [N, P] long
    prompt_lengths: Tensor  # [N] long
    prompt_index: Tensor  # [N] long
    pad_token_id: int
    texts: list[str] | None = None
    old_logprobs: Tensor | None = None  # [N, T] float32
    ref_logprobs: Tensor | None = None  # [N, T] float32

    def __post_init__(self) -> None:
        n, t = self.tokens.shape
        aligned = [self.authors, self.senior_logprobs]
        for extra in (self.junior_logprobs, self.old_logprobs, self.ref_logprobs):
            if extra is not None:
                aligned.append(extra)
        assert all(x.shape == (n, t) for x in aligned), (
            f"tokens, authors and log-probs must all be [N, T] = {[n, t]}, got "
            f"{[list(x.shape) for x in aligned]}"
        )
        rows = [self.lengths, self.stop_reasons, self.prompt_lengths, self.prompt_index]
        assert all(x.shape == (n,) for x in rows), "per-row tensors must be [N]"
        assert self.prompt_tokens.shape[0] == n, "prompt_tokens must have one row per rollout"
        assert self.texts is None or len(self.texts) == n, "one text per row"

    @property
    def num_rows(self) -> int:
        """N."""
        return self.tokens.shape[0]

    @property
    def mask(self) -> Tensor:
        """``[N, T]`` bool: real response tokens."""
        return self.authors != PAD

    @property
    def senior_mask(self) -> Tensor:
        """``[N, T]`` bool: tokens the senior wrote (GRPO's loss mask)."""
        return self.authors == SENIOR

    @property
    def junior_mask(self) -> Tensor:
        """``[N, T]`` bool: tokens the junior wrote."""
        return self.authors == JUNIOR

    @property
    def author_logprobs(self) -> Tensor:
        """``[N, T]``: each token's log-prob under the model that wrote it."""
        if self.junior_logprobs is None:
            return self.senior_logprobs
        return torch.where(self.junior_mask, self.junior_logprobs, self.senior_logprobs)

    def sequences(self) -> tuple[Tensor, Tensor]:
        """Prompt and response side by side, for teacher forcing without re-tokenizing.

        Returns:
            ``ids [N, P + T]`` (the prompt left-padded, the response right-padded) and its
            ``attention_mask [N, P + T]`` (1 on real tokens).
        """
        p = self.prompt_tokens.shape[1]
        prompt_mask = (
            torch.arange(p, device=self.tokens.device) >= (p - self.prompt_lengths)[:, None]
        )
        ids = torch.cat([self.prompt_tokens, self.tokens], dim=1)
        return ids, torch.cat([prompt_mask, self.mask], dim=1).long()
