"""A rollout's layout, made in one place for every engine.

Everything ``Rollouts`` holds besides what was generated: the prompts, validated, left-padded and
repeated once per sample with their lengths and prompt indices (``Prompts``); the EOS and pad ids
a model names (``eos_ids``, ``pad_id``); the responses' right padding (``padded``); the decoded
texts; and the one clone out of inference mode (``finish``). The torch engine
(``tandem.engine.loop``), the cross-vocabulary engine (``tandem.engine.cross``) and the vLLM
backend (``tandem.engine.vllm_backend``) all build their rollouts with these.

What this file leaves out: generating anything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class Prompts:
    """B prompts, left-padded.

    Attributes:
        ids: the prompt ids, left-padded with the pad id.
        mask: 1 on real prompt tokens.
    """

    ids: Tensor  # [B, P] long
    mask: Tensor  # [B, P] long

    @classmethod
    def of(cls, prompts: Sequence[Sequence[int]] | Sequence[Tensor], pad: int) -> Prompts:
        """Left-pad ``prompts`` (one id sequence each, of any lengths) with ``pad``.

        Raises:
            ValueError: no prompt, or an empty one.
        """
        seqs = [torch.as_tensor(p, dtype=torch.long).flatten().cpu() for p in prompts]
        if not seqs or any(s.numel() == 0 for s in seqs):
            raise ValueError("prompts must be a non-empty list of non-empty token id sequences.")
        width = max(s.numel() for s in seqs)
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - s.numel() :] = s
            mask[i, width - s.numel() :] = 1
        return cls(ids, mask)

    @property
    def lengths(self) -> Tensor:
        """``[B]`` each prompt's length."""
        return self.mask.sum(1)

    def __getitem__(self, rows: slice) -> Prompts:
        return Prompts(self.ids[rows], self.mask[rows])

    def rows(self, g: int, device: Any = None, first: int = 0) -> dict[str, Tensor]:
        """``Rollouts``' prompt fields for ``g`` rows per prompt: ``prompt_tokens [B*g, P]``,
        ``prompt_lengths [B*g]`` and ``prompt_index [B*g]`` (these being prompts ``first ...``
        of the call's)."""
        b = self.ids.shape[0]
        return {
            "prompt_tokens": self.ids.repeat_interleave(g, dim=0).to(device),
            "prompt_lengths": self.lengths.repeat_interleave(g).to(device),
            "prompt_index": torch.arange(first, first + b, device=device).repeat_interleave(g),
        }


def model_configs(model: Any) -> tuple[Any, ...]:
    """Where a Hugging Face model names its EOS and pad ids: generation config, then config."""
    return getattr(model, "generation_config", None), model.config


def eos_ids(given: tuple[int, ...] | None, configs: Sequence[Any]) -> tuple[int, ...]:
    """The ids that end a row: ``given`` (``SamplingParams.eos_token_ids``) unless None, else the
    first of ``configs`` that names ``eos_token_id``.

    Raises:
        ValueError: none is given and no config names one.
    """
    if given is not None:
        return given
    for source in configs:
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            return (eos,) if isinstance(eos, int) else tuple(eos)
    raise ValueError(
        "the model's generation_config and config name no eos_token_id, so rows would never "
        "stop early. Pass SamplingParams(eos_token_ids=(...)), or () to always run to "
        "max_new_tokens."
    )


def pad_id(eos: tuple[int, ...], sources: Sequence[Any]) -> int:
    """The padding id: the first of ``sources`` (tokenizer, configs) naming ``pad_token_id``,
    else the first EOS id, else 0."""
    for source in sources:
        pad = getattr(source, "pad_token_id", None)
        if pad is not None:
            return int(pad)
    return eos[0] if eos else 0


def padded(rows: Sequence[Sequence[Any]], fill: float, dtype: torch.dtype) -> Tensor:
    """``[N, T]``: each row right-padded with ``fill`` to the longest (``T`` at least 1)."""
    width = max(1, max(len(r) for r in rows))
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
    return out


def decoded(tokenizer: Any, tokens: Tensor, lengths: Tensor) -> list[str]:
    """Each row's ``tokens[:length]`` decoded once, special tokens skipped."""
    rows = [row[:n].tolist() for row, n in zip(tokens, lengths.tolist(), strict=True)]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


def finish(cls: type, **fields: Any) -> Any:
    """``cls(**fields)`` (``Rollouts`` or another dataclass of tensors), each tensor cloned once.

    Called outside inference mode, so that training may save the clones for backward (tensors
    made in inference mode cannot be). A dataclass among the fields was finished already."""
    return cls(**{k: v.clone() if isinstance(v, Tensor) else v for k, v in fields.items()})


@contextlib.contextmanager
def eval_mode(models: Sequence[Any]) -> Iterator[None]:
    """Generate in eval mode (no dropout), then restore each model's mode."""
    modes = [m.training for m in models]
    try:
        for m in models:
            m.eval()
        yield
    finally:
        for m, mode in zip(models, modes, strict=True):
            m.train(mode)
