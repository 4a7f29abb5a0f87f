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

What this file leaves out: the generation loop (``tandem.engine.loop``), the layout every engine
builds its rollouts with (``tandem.engine.layout``) and token sampling (``tandem.engine.draw``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

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
class SamplingParams:
    """How tokens are drawn and when rows stop.

    Attributes:
        max_new_tokens: the most response tokens per row.
        temperature: divides the logits before sampling; 0 means greedy.
        top_p: nucleus sampling: keep the fewest most likely tokens holding this much mass
            (1 = off).
        top_k: keep the k most likely tokens (0 = off). Applied before top_p, as in
            Hugging Face.
        seed: seeds token sampling; the same seed (and the same sampler state) gives the same
            rollouts. Vary it between calls (e.g. ``seed + step``) to get fresh samples.
        samples_per_prompt: G, rows per prompt (rows ``i*G ... i*G+G-1`` share prompt ``i``).
        eos_token_ids: ids that end a row; ``None`` reads them from the senior's
            ``generation_config`` (then its ``config``); ``()`` never stops early.
        context_limit: the most prompt + response tokens of a row: a row whose prompt is long
            gets fewer than ``max_new_tokens`` (``budget``); ``None``: no such limit.
        logprob_temperature: also record each token's log-prob with the logits divided by
            this (``Rollouts.old_logprobs`` / ``ref_logprobs``, the policy loss's inputs);
            ``None`` records only the raw ones.
        kv_cache_gib: the most GiB the torch engine's KV caches may hold in one call, per
            device (senior and junior together where they share one): it generates whole
            prompt groups a pass at a time to stay under it, with the rollouts of one pass
            (``tandem.engine.budget``); ``None``: 90% of the memory free on each device when
            the call starts. The vLLM backend sizes its own cache and ignores it.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    samples_per_prompt: int = 1
    eos_token_ids: tuple[int, ...] | None = None
    context_limit: int | None = None
    logprob_temperature: float | None = None
    kv_cache_gib: float | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens ({self.max_new_tokens}) must be at least 1")
        if self.temperature < 0:
            problems.append(f"temperature ({self.temperature}) must be >= 0 (0 is greedy)")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p ({self.top_p}) must be in (0, 1] (1 turns it off)")
        if self.top_k < 0:
            problems.append(f"top_k ({self.top_k}) must be >= 0 (0 turns it off)")
        if self.samples_per_prompt < 1:
            problems.append(f"samples_per_prompt ({self.samples_per_prompt}) must be >= 1")
        if self.context_limit is not None and self.context_limit < 2:
            problems.append(f"context_limit ({self.context_limit}) must be at least 2 tokens")
        if self.logprob_temperature is not None and not self.logprob_temperature > 0:
            problems.append(
                f"logprob_temperature ({self.logprob_temperature}) must be > 0 (None: raw only)"
            )
        if self.kv_cache_gib is not None and not self.kv_cache_gib > 0:
            problems.append(
                f"kv_cache_gib ({self.kv_cache_gib}) must be > 0 (None: a share of free memory)"
            )
        if problems:
            raise ValueError("invalid SamplingParams: " + "; ".join(problems) + ".")
        if self.eos_token_ids is not None:
            object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))

    def budget(self, prompt_length: int) -> int:
        """The most response tokens after a prompt of ``prompt_length`` tokens (at least 1)."""
        if self.context_limit is None:
            return self.max_new_tokens
        return max(1, min(self.max_new_tokens, self.context_limit - prompt_length))

    @property
    def greedy(self) -> bool:
        """Whether tokens are argmaxes (temperature 0)."""
        return self.temperature == 0

    @property
    def truncated(self) -> bool:
        """Whether top-k or top-p cut the distribution."""
        return self.top_k > 0 or self.top_p < 1.0


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

    @property
    def senior_share(self) -> Tensor:
        """``[N]``: the fraction of each row's tokens that the senior wrote."""
        return self.senior_mask.sum(1) / self.lengths.clamp(min=1)

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
