"""Legibility across vocabularies: the junior's cross-entropy per byte of the senior's text.

A junior of another family reads the senior's words in its own tokens, so nats *per token* of
the two models count different things and cannot be compared, nor compared with a same-family
junior's. Per byte of text (UTF-8) they can: ``junior_ce_per_byte`` sums the junior's NLL of the
senior-written text, in whatever tokens the junior read it, and divides by that text's bytes. For
a same-vocabulary pair it is the per-token figure times tokens per byte (the same text scored the
same way, only counted in bytes), so runs with either kind of junior sit on one scale.

Which metrics do *not* apply across vocabularies (``CROSS_VOCABULARY_REFUSED``, refused by the
config checks with a cross pair): the per-token junior cross-entropies (``junior_ce``,
``junior_ce_pooled``: a token of one model is no unit of the other's) and the per-token
distribution overlap (``overlap``: the two next-token distributions are over different sets).
Drift (``token_kl``) still applies, against the senior's own base, which shares its vocabulary.

What this file leaves out: producing the junior's log-probs (the cross engine records them while
generating; ``tandem.evaluation`` teacher-forces them on solo outputs).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor
from torchmetrics import Metric

from tandem.registry import METRICS
from tandem.samplers.boundaries import token_surfaces

# metric name -> why it does not apply when senior and junior have different vocabularies
CROSS_VOCABULARY_REFUSED = {
    "junior_ce": "nats per junior token: the junior's tokens are not the senior's",
    "junior_ce_pooled": "nats per junior token: the junior's tokens are not the senior's",
    "overlap": "sum_v min(p, q) compares two distributions over one vocabulary",
}


def cross_vocabulary_problem(key: str, name: str) -> str | None:
    """The message refusing metric ``name`` (listed at config ``key``) for a cross pair."""
    why = CROSS_VOCABULARY_REFUSED.get(name)
    if why is None:
        return None
    return (
        f"{key} ({name!r}) does not apply across vocabularies ({why}), and this junior has a "
        "tokenizer of its own. Remove it; the junior's legibility across vocabularies is "
        "junior_ce_per_byte (logged as legibility/junior_ce_per_byte)."
    )


# tokenizer -> its [V] table, built once: a run measures every batch with the same tokenizer,
# and spelling out a 151k vocabulary takes a while
_SIZES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def byte_table(tokenizer: Any, width: int | None = None) -> Tensor:
    """``[V]`` long: the bytes each id's surface spells (0 for special tokens), padded with 0
    up to ``width`` ids (ids past the tokenizer: a model's padding rows)."""
    if tokenizer not in _SIZES:
        sizes = [0 if s is None else len(s) for s in token_surfaces(tokenizer)]
        _SIZES[tokenizer] = torch.tensor(sizes, dtype=torch.long)
    sizes = _SIZES[tokenizer]
    extra = (width or 0) - sizes.numel()
    return torch.cat([sizes, sizes.new_zeros(extra)]) if extra > 0 else sizes


@METRICS.register("junior_ce_per_byte")
class JuniorBytesCrossEntropy(Metric):
    """Nats of the junior per byte of senior-written text, pooled over every row.

    Example:
        >>> m = JuniorBytesCrossEntropy()
        >>> lp = torch.tensor([[-2.0, -1.0, -9.0]])
        >>> m.update(lp, torch.tensor([[4, 2, 5]]), torch.tensor([[True, True, False]]))
        >>> float(m.compute())  # 3 nats over 6 bytes
        0.5
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("nats", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("bytes", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, logprobs: Tensor, byte_lengths: Tensor, mask: Tensor) -> None:
        """Add the junior tokens of ``mask``.

        Args:
            logprobs: ``[N, T]`` the junior's log-prob of each of its tokens.
            byte_lengths: ``[N, T]`` the bytes each of those tokens spells.
            mask: ``[N, T]`` bool, the tokens that spell senior-written text.
        """
        mask = mask.to(logprobs.device).bool()
        self.nats += (-logprobs.double() * mask).sum().to(self.nats.device)
        self.bytes += (byte_lengths.to(mask.device) * mask).sum().double().to(self.bytes.device)

    def compute(self) -> Tensor:
        return self.nats / self.bytes
