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

**The null.** The share and the paper's correlation come out "pulled back" for shifts that have
nothing to do with each other: the N items are chosen for a large ``|grpo - base|``, so any
other model's shift on them is smaller on average (regression to the mean), and ``grpo - base``
enters ``trl - grpo`` with a minus sign. A second GRPO seed in TRL's place reads as pulled back
too. So each pair of models is also read with the roles swapped (``swapped``: the share of
TRL's most moved items that GRPO leaves closer to the base, and the correlation over them), and
the pull-back is the **asymmetry**, the statistic minus its swapped value: zero in expectation
for two shifts drawn alike (two seeds of one arm, or two unrelated shifts of one size), large for
a TRL that moves GRPO's items the same way but less. The study computes every statistic also for
GRPO seed against GRPO seed (``pullback_against_null``): a pull-back is read only where TRL's
asymmetry is clear of the spread of GRPO's own. ``spearman_top`` stays the informative raw
figure: near 1 when the two methods move the displaced items the same way, near 0 when not.

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


# the statistics that are read both ways, and the direction a pull-back moves each: the share
# up (more of GRPO's items closer to the base), the correlation down (more negative)
ASYMMETRIC = {"pulled_back": +1, "pullback_rho": -1}
PULLBACK = "pull-back beyond the null"
NO_PULLBACK = "no pull-back beyond the null"
PUSHED_AWAY = "pushed away beyond the null"
UNDECIDED = "undecided"


def pair_statistics(base: Tensor, a: Tensor, b: Tensor, top: int = 500) -> dict[str, float]:
    """The statistics of ``b`` against ``a`` over ``a``'s most displaced items (``a`` in GRPO's
    place), the share and the correlation with the roles swapped (``<key>_swapped``: ``a``
    against ``b`` over ``b``'s items), and their difference (``<key>_asymmetry``)."""
    forward = displacement(base, a, b, top)
    swapped = displacement(base, b, a, top)
    out = {
        "pulled_back": forward.pulled_back,
        "pullback_rho": forward.pullback_rho,
        "pullback_p": forward.pullback_p,
        "pullback_n": float(forward.pullback_n),
        "spearman_top": forward.spearman_top,
        "spearman_all": forward.spearman_all,
    }
    for key in ASYMMETRIC:
        out[f"{key}_swapped"] = getattr(swapped, key)
        out[f"{key}_asymmetry"] = out[key] - out[f"{key}_swapped"]
    return out


@dataclass(frozen=True)
class NullReading:
    """One pull-back statistic of an arm read against the GRPO-seed-against-GRPO-seed null.

    Attributes:
        key: ``pulled_back`` or ``pullback_rho``.
        arm, null: the paper's figure, mean over the arm's seeds / over the ordered GRPO pairs.
        difference: arm minus null with Welch's 95% interval (``lo``, ``hi``; NaN: too few).
        asymmetry: the arm's mean asymmetry with its 95% t-interval over seeds.
        spread: the lowest and highest asymmetry of the null's pairs.
        verdict: ``PULLBACK``, ``NO_PULLBACK``, ``PUSHED_AWAY`` or ``UNDECIDED`` (one seed, or
            no null pair).
    """

    key: str
    arm: float
    null: float
    difference: tuple[float, float, float]
    asymmetry: tuple[float, float, float]
    spread: tuple[float, float]
    verdict: str

    def sentence(self, fmt: str = "{:+.3f}") -> str:
        """The reading in one sentence, every figure with its interval."""
        f = fmt.format
        d, dlo, dhi = self.difference
        a, alo, ahi = self.asymmetry
        diff = f"{f(d)}" + ("" if math.isnan(dlo) else f" [{f(dlo)}, {f(dhi)}]")
        asym = f"{f(a)}" + ("" if math.isnan(alo) else f" [{f(alo)}, {f(ahi)}]")
        return (
            f"{self.verdict}: paper's figure {f(self.arm)} against the null's {f(self.null)} "
            f"(difference {diff}); asymmetry {asym} against the null's spread "
            f"[{f(self.spread[0])}, {f(self.spread[1])}]."
        )


def pullback_against_null(
    arm: Sequence[dict[str, float]], null: Sequence[dict[str, float]], key: str
) -> NullReading:
    """Read one statistic (``key`` of ``ASYMMETRIC``) of an arm's seeds (``pair_statistics`` of
    each seed's GRPO senior against the arm's) against the null's (the same for each ordered
    pair of GRPO seeds).

    A pull-back is read only where the 95% t-interval of the arm's mean asymmetry lies wholly
    beyond the null's spread in the pull-back direction (``ASYMMETRIC``): the arm must differ
    from GRPO by more than any two GRPO seeds differ from each other. Wholly beyond on the other
    side reads as pushed away; anything else as no pull-back beyond the null.
    """
    from tandem.analysis.claims import difference_interval, t_interval

    if key not in ASYMMETRIC:
        raise ValueError(
            f"key ({key!r}) must be one of {sorted(ASYMMETRIC)}: the statistics read both ways."
        )
    raw = [s[key] for s in arm]
    raw_null = [s[key] for s in null]
    asym = [s[f"{key}_asymmetry"] for s in arm]
    asym_null = [s[f"{key}_asymmetry"] for s in null]
    nan = (math.nan, math.nan, math.nan)
    if not asym or not asym_null:
        spread = (math.nan, math.nan)
        mean = lambda v: sum(v) / len(v) if v else math.nan  # noqa: E731
        return NullReading(key, mean(raw), mean(raw_null), nan, nan, spread, UNDECIDED)
    spread = (min(asym_null), max(asym_null))
    interval = t_interval(asym)
    _, lo, hi = interval
    sign = ASYMMETRIC[key]
    if math.isnan(lo):
        verdict = UNDECIDED
    elif (lo > spread[1]) if sign > 0 else (hi < spread[0]):
        verdict = PULLBACK
    elif (hi < spread[0]) if sign > 0 else (lo > spread[1]):
        verdict = PUSHED_AWAY
    else:
        verdict = NO_PULLBACK
    arm_mean, null_mean = sum(raw) / len(raw), sum(raw_null) / len(raw_null)
    return NullReading(
        key, arm_mean, null_mean, difference_interval(raw, raw_null), interval, spread, verdict
    )
