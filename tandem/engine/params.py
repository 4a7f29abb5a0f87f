"""How the engine draws tokens and when rows stop: ``SamplingParams`` and the range of each of
its values (``RULES``), in one place.

This module imports nothing heavy (no torch), so that ``tandem.config`` checks a config's
``generation`` (and the validation's and the loss's temperatures) against these very rules
before torch, Lightning and transformers are imported; ``tandem.engine`` exports the class.

What this file leaves out: what the engine gives back (``tandem.engine.base.Rollouts``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _optional(rule: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or rule(v)


#: field -> (whether a value is in range, the range in words)
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_new_tokens": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "temperature": (lambda v: _number(v) and v >= 0, "a number >= 0 (0 is greedy)"),
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1] (1 turns it off)"),
    "top_k": (lambda v: _int(v) and v >= 0, "an integer >= 0 (0 turns it off)"),
    "seed": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "samples_per_prompt": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "eos_token_ids": (
        lambda v: (
            v is None
            or (isinstance(v, Sequence) and not isinstance(v, str) and all(_int(i) for i in v))
        ),
        "a list of token ids, () for none, or None for the model's",
    ),
    "context_limit": (_optional(lambda v: _int(v) and v >= 2), "an integer >= 2, or None"),
    "logprob_temperature": (
        _optional(lambda v: _number(v) and v > 0),
        "a number > 0, or None",
    ),
    "kv_cache_gib": (
        _optional(lambda v: _number(v) and v > 0),
        "a number > 0 (GiB), or None (a share of the device's free memory)",
    ),
}


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
        if problems := self.problems(vars(self)):
            raise ValueError("invalid SamplingParams: " + "; ".join(problems) + ".")
        if self.eos_token_ids is not None:
            object.__setattr__(self, "eos_token_ids", tuple(int(i) for i in self.eos_token_ids))

    @classmethod
    def problems(cls, values: Mapping[str, Any], prefix: str = "", none: str = "None") -> list[str]:
        """What is wrong with these field values (``{field: value}``, any subset), one line
        each naming ``prefix + field``, the value and the range (``none``: how the caller
        spells None): the one statement of the ranges, which the config check reads before
        anything heavy is imported."""
        out = []
        for name, value in values.items():
            rule = RULES.get(name)
            if rule is not None and not rule[0](value):
                shown = none if value is None else repr(value)
                out.append(f"{prefix}{name} ({shown}) must be {rule[1].replace('None', none)}")
        return out

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
