"""Which vocabulary items GRPO displaced from the base, and whether Tandem RL moved them back.

All three models (base, GRPO senior, TRL senior) are teacher-forced on the same texts (e.g. the
base's or a senior's solo outputs from ``generations/<set>.jsonl``). Per vocabulary item ``v``
and model ``m`` we aggregate the **mean probability over all response positions**,
``pbar_m(v) = mean_t p_m(v | context_t)``, and call ``pbar_m(v) - pbar_base(v)`` the item's
shift under ``m``. Mean probability rather than a mean log-prob shift, because it weighs an item
by the probability mass that actually moved: a log-prob shift is dominated by items of
negligible probability (1e-12 -> 1e-9 is a large log shift that changes no sample).

- the top N displaced items: the N largest ``|pbar_grpo - pbar_base|``;
- pulled back: the share of those N with ``|pbar_trl - pbar_base| < |pbar_grpo - pbar_base|``;
- the paper's Spearman correlation (``pullback_rho``, with its two-sided p-value
  ``pullback_p`` and the number of items ``pullback_n``), over the top N items, of GRPO's
  displacement from the base (``grpo - base``) against Tandem's shift relative to GRPO
  (``trl - grpo``). Negative: the more GRPO moved an item one way, the more Tandem moves it
  back the other way. It says how the pulled-back share comes about; the share says how many;
- Spearman correlation of the two shifts from the base (``grpo - base`` against
  ``trl - base``), over the top N items (``spearman_top``: do the two methods move the
  displaced items the same way?) and over the whole vocabulary (``spearman_all``).

Every Spearman correlation is ``scipy.stats.spearmanr``'s (ranks average over ties).

**What these statistics cannot say.** The share and the paper's correlation come out "pulled
back" for shifts that have nothing to do with each other: the N items are chosen for a large
``|grpo - base|``, so any other model's shift on them is smaller on average (regression to the
mean), and ``grpo - base`` enters ``trl - grpo`` with a minus sign; a model that drifts less
everywhere, an unrelated shift and a second GRPO seed all read as pulled back. They stay as the
paper's figures, without a verdict; ``tandem.analysis.pullback`` is the statistic the study
reads (held-out items, slopes in units of each model's own drift).

What this file leaves out: sampling the texts (``tandem.evaluate``) and plotting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tandem.evaluation.forcing import forced_chunks
from tandem.metrics import masked_positions


@dataclass(frozen=True)
class Displacement:
    """The displacement analysis of one set of texts.

    Attributes:
        token_ids: the N items GRPO moved most, most moved first.
        base, grpo, trl: each model's mean probability of every vocabulary item.
        pulled_back: share of the N items TRL left closer to the base than GRPO did.
        pullback_rho: Spearman correlation over the N items of ``grpo - base`` against
            ``trl - grpo`` (the paper's; negative: TRL moves them back).
        pullback_p: its two-sided p-value (no correlation as the null).
        pullback_n: the items it is computed over.
        spearman_top: Spearman correlation of the two shifts over the N items.
        spearman_all: the same over the whole vocabulary.
        positions: response positions averaged over.
    """

    token_ids: Tensor  # [N] long
    base: Tensor  # [V] float64
    grpo: Tensor  # [V] float64
    trl: Tensor  # [V] float64
    pulled_back: float
    pullback_rho: float
    pullback_p: float
    pullback_n: int
    spearman_top: float
    spearman_all: float
    positions: int

    def table(self, tokenizer: Any | None = None) -> list[dict[str, Any]]:
        """One row per displaced item: id, text (with a tokenizer) and the three means."""
        rows = []
        for v in self.token_ids.tolist():
            row = {"token_id": v, "base": float(self.base[v])}
            row.update(grpo=float(self.grpo[v]), trl=float(self.trl[v]))
            if tokenizer is not None:
                row["token"] = tokenizer.decode([v])
            rows.append(row)
        return rows


def mean_probabilities(
    models: Sequence[torch.nn.Module],
    prompt_tokens: Tensor,
    prompt_mask: Tensor,
    tokens: Tensor,
    mask: Tensor,
    batch_size: int = 8,
) -> tuple[Tensor, int]:
    """``[M, V]`` each model's next-token probabilities averaged over response positions.

    Args:
        models: causal LMs sharing one vocabulary.
        prompt_tokens, prompt_mask: ``[N, P]`` left-padded prompts.
        tokens, mask: ``[N, T]`` right-padded responses.
        batch_size: rows per forward pass.

    Returns:
        The means (float64) and the number of positions averaged.
    """
    sums: Tensor | None = None
    count = 0
    for chunk in forced_chunks(models, prompt_tokens, prompt_mask, tokens, mask, batch_size):
        step = torch.stack([_summed_probs(x, chunk.mask) for x in chunk.logits])  # [M, V]
        sums = step if sums is None else sums + step
        count += int(chunk.mask.sum())
    assert sums is not None and count > 0, "no response tokens to average over"
    return sums / count, count


def _summed_probs(logits: Tensor, mask: Tensor) -> Tensor:
    """``[V]`` float64 sum over the masked positions of ``softmax(logits [n, T, V])``."""
    picked = masked_positions(logits, mask)  # [m, V]
    total = torch.zeros(picked.shape[-1], dtype=torch.float64)
    rows = max(1, (1 << 24) // max(1, picked.shape[-1]))  # bounds the float32 intermediates
    for lo in range(0, picked.shape[0], rows):
        total += picked[lo : lo + rows].float().softmax(-1).double().sum(0).cpu()
    return total


def displacement(
    base: Tensor, grpo: Tensor, trl: Tensor, top: int = 500, positions: int = 0
) -> Displacement:
    """The analysis from each model's mean probabilities ``[V]``.

    Args:
        base, grpo, trl: mean probability of every vocabulary item under each model.
        top: N, the displaced items to look at (at most V).
        positions: the positions the means came from (recorded only).
    """
    assert base.shape == grpo.shape == trl.shape, "the three means must cover one vocabulary"
    top = min(top, base.numel())
    grpo_shift, trl_shift = grpo - base, trl - base  # [V]
    order = grpo_shift.abs().argsort(descending=True, stable=True)[:top]  # [N]
    closer = trl_shift[order].abs() < grpo_shift[order].abs()  # [N]
    rho, p = spearman_test(grpo_shift[order], (trl - grpo)[order])
    return Displacement(
        token_ids=order,
        base=base,
        grpo=grpo,
        trl=trl,
        pulled_back=float(closer.double().mean()),
        pullback_rho=rho,
        pullback_p=p,
        pullback_n=int(order.numel()),
        spearman_top=spearman(grpo_shift[order], trl_shift[order]),
        spearman_all=spearman(grpo_shift, trl_shift),
        positions=positions,
    )


def displacement_on_records(
    records: Iterable[dict[str, Any]],
    base: torch.nn.Module,
    grpo: torch.nn.Module,
    trl: torch.nn.Module,
    top: int = 500,
    batch_size: int = 8,
) -> Displacement:
    """The analysis on the texts of evaluation records (``prompt_ids`` and ``tokens``)."""
    prompt_tokens, prompt_mask, tokens, mask = records_to_tensors(records)
    means, count = mean_probabilities(
        [base, grpo, trl], prompt_tokens, prompt_mask, tokens, mask, batch_size
    )
    return displacement(means[0], means[1], means[2], top, count)


def records_to_tensors(records: Iterable[dict[str, Any]], pad: int = 0) -> tuple[Tensor, ...]:
    """``prompt_tokens, prompt_mask [N, P]`` (left-padded) and ``tokens, mask [N, T]``."""
    rows = [(r["prompt_ids"], r["tokens"]) for r in records]
    assert rows, "no records"
    p = max(len(a) for a, _ in rows)
    t = max(len(b) for _, b in rows)
    prompt_tokens = torch.full((len(rows), p), pad, dtype=torch.long)
    tokens = torch.full((len(rows), t), pad, dtype=torch.long)
    prompt_mask = torch.zeros(len(rows), p, dtype=torch.bool)
    mask = torch.zeros(len(rows), t, dtype=torch.bool)
    for i, (a, b) in enumerate(rows):
        prompt_tokens[i, p - len(a) :] = torch.tensor(a, dtype=torch.long)
        prompt_mask[i, p - len(a) :] = True
        tokens[i, : len(b)] = torch.tensor(b, dtype=torch.long)
        mask[i, : len(b)] = True
    return prompt_tokens, prompt_mask, tokens, mask


def spearman(x: Tensor, y: Tensor) -> float:
    """Spearman's rank correlation (NaN when either input is constant)."""
    return spearman_test(x, y)[0]


def spearman_test(x: Tensor, y: Tensor) -> tuple[float, float]:
    """Spearman's rho of ``x, y [n]`` and its two-sided p-value (``scipy.stats.spearmanr``).

    Ranks average over ties. NaN for both when there are fewer than 2 pairs or either input is
    constant: there is no ranking to correlate, and scipy would only warn and say the same. Two
    pairs give a rho of +-1 and a NaN p-value.
    """
    from scipy import stats

    assert x.shape == y.shape and x.dim() == 1, "spearman_test takes two [n] vectors"
    if x.numel() < 2 or bool((x == x[0]).all()) or bool((y == y[0]).all()):
        return math.nan, math.nan
    result = stats.spearmanr(x.double().cpu().numpy(), y.double().cpu().numpy())
    return float(result.statistic), float(result.pvalue)
