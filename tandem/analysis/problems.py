"""Each run's figures problem by problem, from its evaluation's generations: what the model of
seed and problem variance reads, what the study commits, and each arm's coverage.

Every evaluation writes each sample to ``generations/<set>.jsonl``. Per run and set, per problem
(``summarize``; kilobytes per run, committed with the pages under ``docs/results/data/``):

- ``solo`` and ``handoff``: the correct samples of each mode (of ``samples[mode]``);
- ``kl``, ``overlap``: the summed per-token KL to the base and overlap with the junior over the
  problem's solo samples, and ``tokens``, the tokens summed over;
- ``ce``: the summed per-chain mean of the junior's negative log-prob, and ``chains``, how many.

A run's figure is then a ratio per set (pass@k: the unbiased estimate ``1 - C(n - c, k) /
C(n, k)`` per problem, over problems; KL and overlap per token; the junior's cross-entropy per
chain, as ``tandem.metrics`` computes them), averaged over sets (``metric_arms``; macro: each set
alike, the paper's; micro: each problem alike). Coverage: the problems a run solves at least once.

What this file leaves out: the evaluations (``tandem.evaluate``), the model
(``tandem.analysis.mixed``) and the page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tandem.analysis.mixed import MACRO, Arm, linearize
from tandem.evaluation.records import read_records

MODES = ("solo", "handoff")
# ratio metrics: (numerator, denominator) fields of a set's summary
RATIOS = {
    "drift/kl": ("kl", "tokens"),
    "legibility/overlap": ("overlap", "tokens"),
    "legibility/junior_ce": ("ce", "chains"),
}
# decimals kept for the committed sums (float32 per-token values carry about 7 digits)
DIGITS = 7


def summarize(generations: Path, sets: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per set, each problem's figures (see the module docstring) from ``generations``."""
    out = {}
    for name in sets:
        path = Path(generations) / f"{name}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: the evaluation wrote no generations for set {name!r}. "
                "Remove its evaluation folder and rerun the study to evaluate it again."
            )
        out[name] = _summarize_set(read_records(path))
    return out


def _summarize_set(records: Any) -> dict[str, Any]:
    rows: dict[int, dict[str, float]] = {}
    samples = {mode: 0 for mode in MODES}
    for r in records:
        row = rows.setdefault(int(r["problem_index"]), dict.fromkeys(_FIELDS, 0.0))
        mode = r["mode"]
        row[mode] += float(r["reward"] > 0.5)
        row[f"{mode}_n"] += 1
        if mode != "solo" or r.get("kl") is None:
            continue
        mask = [a == 1 for a in r["authors"]]  # the senior's tokens: all of a solo sample
        row["kl"] += sum(v for v, m in zip(r["kl"], mask, strict=True) if m)
        row["overlap"] += sum(v for v, m in zip(r.get("overlap") or [], mask, strict=False) if m)
        row["tokens"] += sum(mask)
        lps = [v for v, m in zip(r.get("junior_logprobs") or [], mask, strict=False) if m]
        if lps:
            row["ce"] += -sum(lps) / len(lps)
            row["chains"] += 1
    problems = sorted(rows)
    for mode in MODES:
        counts = {rows[p][f"{mode}_n"] for p in problems if rows[p][f"{mode}_n"]}
        if len(counts) > 1:
            raise ValueError(f"problems have unequal {mode} sample counts {sorted(counts)}.")
        samples[mode] = int(counts.pop()) if counts else 0
    out: dict[str, Any] = {"problems": problems, "samples": samples}
    for key in _FIELDS:
        if key.endswith("_n"):
            continue
        values = [rows[p][key] for p in problems]
        integer = key in (*MODES, "tokens", "chains")
        out[key] = [int(v) for v in values] if integer else [round(v, DIGITS) for v in values]
    return out


_FIELDS = ("solo", "solo_n", "handoff", "handoff_n", "kl", "overlap", "tokens", "ce", "chains")


def pass_at_k(correct: int, n: int, k: int) -> float:
    """Unbiased pass@k of one problem from ``correct`` of ``n`` samples (``k <= n``)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, the problem has {n}.")
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def _num_den(summary: dict[str, Any], metric: str) -> tuple[list[float], list[float]] | None:
    """One set's numerators and denominators of ``metric`` per problem (None: not measured)."""
    if "/pass@" in metric:
        mode, k = metric.split("/pass@")
        n = summary["samples"].get(mode, 0)
        if n < int(k):
            return None
        return [pass_at_k(c, n, int(k)) for c in summary[mode]], [1.0] * len(summary[mode])
    if metric in RATIOS:
        num, den = RATIOS[metric]
        if not sum(summary[den]):
            return None
        return list(map(float, summary[num])), list(map(float, summary[den]))
    raise KeyError(f"metric ({metric!r}) has no per-problem figure: {sorted(RATIOS)} or pass@k.")


def metric_arms(
    runs: dict[str, Sequence[dict[str, Any]]], metric: str, average: str = MACRO
) -> tuple[dict[str, Arm], np.ndarray] | None:
    """Each arm's runs of ``metric`` (``runs[arm]``: each run's ``summarize``) as the model reads
    them, on the problems every run has, and each problem's set; None where a run lacks it."""
    every = [s for group in runs.values() for s in group]
    if not every:
        return None
    names = sorted(set.intersection(*(set(s) for s in every)))
    keys = [
        (name, p)
        for name in names
        for p in sorted(set.intersection(*(set(s[name]["problems"]) for s in every)))
    ]
    sets = np.array([names.index(name) for name, _ in keys])
    arms = {}
    for arm, group in runs.items():
        rows = []
        for summary in group:
            got = _aligned(summary, names, keys, metric)
            if got is None:
                return None
            rows.append(got)
        num = np.array([r[0] for r in rows])[None]  # [1, n, P]
        den = np.array([r[1] for r in rows])[None]
        arms[arm] = Arm(*linearize(num, den, sets, average))
    return arms, sets


def _aligned(summary: dict, names: list[str], keys: list, metric: str) -> tuple | None:
    num, den = [], []
    for name in names:
        got = _num_den(summary[name], metric)
        if got is None:
            return None
        where = {p: i for i, p in enumerate(summary[name]["problems"])}
        picked = [where[p] for n, p in keys if n == name]
        num += [got[0][i] for i in picked]
        den += [got[1][i] for i in picked]
    return num, den


def solved(summary: dict[str, Any], mode: str) -> set[tuple[str, int]]:
    """The problems a run solved at least once in ``mode``, as ``(set, index)``."""
    return {
        (name, p)
        for name, table in summary.items()
        for p, c in zip(table["problems"], table[mode], strict=True)
        if c > 0
    }


def seen(summary: dict[str, Any]) -> int:
    """How many problems a run was evaluated on."""
    return sum(len(table["problems"]) for table in summary.values())
