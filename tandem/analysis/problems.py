"""Problem-level intervals: a paired bootstrap over problems for pass@k differences, and coverage.

Every evaluation writes each sample's verdict to ``generations/<set>.jsonl``; from those, per run,
set and mode (``solo``, ``handoff``), each problem's correct samples ``c`` of ``n``. Then:

- a problem's pass@k is the unbiased estimate ``1 - C(n - c, k) / C(n, k)`` (the same as
  ``tandem.metrics.PassAtK``, so the mean over problems is the figure in ``results.json``);
- an arm's pass@k on a problem is the mean over its seeds; two arms are compared on the problems
  both evaluated (paired), and the 95% interval of the difference of their macro means is the
  percentile interval of a bootstrap that resamples each set's problems with replacement;
- coverage: the problems a run solves at least once (any correct sample), out of those it saw.

Which interval answers which question: the seed intervals of the study (over training seeds) say
how far another training run of the recipe could land (training variance); the problem interval
says how far another draw of problems and samples could move the figure *for these
checkpoints* (evaluation variance), and nothing about another training run.

What this file leaves out: the evaluations themselves (``tandem.evaluate``) and the page
(``tandem.analysis.study``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from tandem.evaluation.records import read_records

# set -> problem index -> (correct samples, samples)
Counts = dict[str, dict[int, tuple[int, int]]]
RESAMPLES = 2000


def problem_counts(generations: Path, sets: Sequence[str], mode: str) -> Counts:
    """Each problem's correct samples of ``mode`` in ``generations/<set>.jsonl``."""
    out: Counts = {}
    for name in sets:
        path = Path(generations) / f"{name}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: the evaluation wrote no generations for set {name!r}. "
                "Remove its evaluation folder and rerun the study to evaluate it again."
            )
        table: dict[int, list[int]] = {}
        for record in read_records(path):
            if record["mode"] == mode:
                row = table.setdefault(int(record["problem_index"]), [0, 0])
                row[0] += int(record["reward"] > 0.5)
                row[1] += 1
        out[name] = {p: (c, n) for p, (c, n) in table.items()}
    return out


def pass_at_k(correct: int, n: int, k: int) -> float:
    """Unbiased pass@k of one problem from ``correct`` of ``n`` samples (``k <= n``)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, the problem has {n}.")
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def arm_pass(runs: Sequence[Counts], k: int) -> dict[str, dict[int, float]]:
    """Per set and problem, pass@k averaged over an arm's runs (problems every run saw)."""
    out: dict[str, dict[int, float]] = {}
    for name in runs[0]:
        shared = set.intersection(*(set(r.get(name, {})) for r in runs))
        out[name] = {p: sum(pass_at_k(*r[name][p], k) for r in runs) / len(runs) for p in shared}
    return out


@dataclass(frozen=True)
class Paired:
    """A paired difference over problems: ``a`` minus ``b`` of the macro mean, its 95% bootstrap
    interval, and the problems compared."""

    difference: float
    lo: float
    hi: float
    problems: int

    def cell(self, scale: float = 1.0) -> str:
        d, lo, hi = (scale * x for x in (self.difference, self.lo, self.hi))
        return f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def paired_bootstrap(
    a: dict[str, dict[int, float]],
    b: dict[str, dict[int, float]],
    resamples: int = RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> Paired:
    """``a`` minus ``b`` (per set and problem, as ``arm_pass`` gives them) on the problems both
    have: the macro mean (each set weighs the same) and its percentile bootstrap interval, each
    set's problems resampled with replacement, the same draw for both arms."""
    g = torch.Generator().manual_seed(seed)
    means, draws, total = [], [], 0
    for name in sorted(set(a) & set(b)):
        shared = sorted(set(a[name]) & set(b[name]))
        if not shared:
            continue
        diff = torch.tensor([a[name][p] - b[name][p] for p in shared], dtype=torch.float64)
        pick = torch.randint(len(shared), (resamples, len(shared)), generator=g)
        means.append(diff.mean())
        draws.append(diff[pick].mean(1))  # [resamples]
        total += len(shared)
    if not means:
        raise ValueError("the two arms share no problem: nothing to compare.")
    macro = torch.stack(draws).mean(0)  # [resamples]
    tail = (1 - level) / 2
    lo, hi = torch.quantile(macro, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return Paired(float(torch.stack(means).mean()), lo, hi, total)


def coverage(counts: Counts) -> tuple[int, int]:
    """Problems solved at least once, and problems seen, over every set."""
    solved = sum(c > 0 for table in counts.values() for c, _ in table.values())
    return solved, sum(len(table) for table in counts.values())


def union_coverage(runs: Sequence[Counts]) -> int:
    """Problems solved at least once by any of the runs."""
    return len(
        {(name, p) for r in runs for name, table in r.items() for p, (c, _) in table.items() if c}
    )


def _counts_or_none(generations: Path, sets: Sequence[str], mode: str) -> Counts | None:
    try:
        return problem_counts(generations, sets, mode)
    except FileNotFoundError:
        return None


def problem_section(
    folders: dict[str, list[tuple[int, Path]]],
    base: Path | None,
    sets: Sequence[str],
    metrics: Sequence[str],
) -> list[str]:
    """The page's section of paired problem intervals and coverage.

    Args:
        folders: per arm, ``(seed, evaluation folder)`` of each run (``<folder>/generations``).
        base: the base's evaluation folder (None: no base column).
        sets: the eval sets the claims are measured on.
        metrics: ``<mode>/pass@<k>`` figures to compare.
    """
    counts = {
        (arm, seed): {m: _counts_or_none(f / "generations", sets, m) for m in ("solo", "handoff")}
        for arm, runs in folders.items()
        for seed, f in runs
    }
    lines = [
        "## Problems: paired intervals and coverage",
        "",
        "Two intervals answer two questions. The seed intervals of the tables above (over "
        "training seeds) say how far another training run of the recipe could land: training "
        "variance. The intervals here are a paired bootstrap over problems (both arms on the "
        f"same problems, each problem's pass@k averaged over an arm's seeds, {RESAMPLES} "
        "resamples of each set's problems, the 95% percentile interval of the difference of "
        "the macro means): how far another draw of problems and samples could move the "
        "difference *for these checkpoints*, evaluation variance only. The null row compares "
        "single GRPO seeds with each other the same way.",
        "",
        "| metric | trl − grpo | kl_reg − grpo | grpo seed − grpo seed (null) |",
        "| --- | --- | --- | --- |",
    ]
    for metric in metrics:
        mode, k = metric.split("/pass@")
        lines.append(_paired_row(metric, mode, int(k), counts, folders))
    lines += ["", *_coverage_lines(counts, folders, base, sets), ""]
    return lines


def _paired_row(metric: str, mode: str, k: int, counts: dict, folders: dict) -> str:
    def runs_of(arm: str) -> list[Counts]:
        got = [counts[(arm, seed)][mode] for seed, _ in folders.get(arm, [])]
        return [c for c in got if c is not None and _least_n(c) >= k]

    grpo = runs_of("grpo")
    cells = []
    for arm in ("trl", "kl_reg"):
        other = runs_of(arm)
        if not other or not grpo:
            cells.append("n/a")
            continue
        paired = paired_bootstrap(arm_pass(other, k), arm_pass(grpo, k))
        cells.append(f"{paired.cell()} ({paired.problems} problems)")
    nulls = [
        paired_bootstrap(arm_pass([a], k), arm_pass([b], k)).cell()
        for i, a in enumerate(grpo)
        for b in grpo[i + 1 :]
    ]
    cells.append("; ".join(nulls) if nulls else "n/a (one GRPO seed)")
    return f"| `{metric}` | " + " | ".join(cells) + " |"


def _least_n(counts: Counts) -> int:
    return min((n for table in counts.values() for _, n in table.values()), default=0)


def _coverage_lines(
    counts: dict, folders: dict, base: Path | None, sets: Sequence[str]
) -> list[str]:
    """Problems solved at least once, per run and arm, solo and handing off."""
    from tandem.analysis.claims import t_interval

    lines = [
        "Coverage: the problems solved at least once (any correct sample), as the independent "
        "reproduction counts distinct problems solved; the mean over an arm's seeds with its "
        "95% t-interval, then the union over its seeds.",
        "",
        "| arm | solo | handoff |",
        "| --- | --- | --- |",
    ]
    if base is not None:
        cells = []
        for mode in ("solo", "handoff"):
            got = _counts_or_none(base / "generations", sets, mode)
            cells.append("n/a" if got is None else "{} of {}".format(*coverage(got)))
        lines.append("| base | " + " | ".join(cells) + " |")
    for arm, runs in folders.items():
        cells = []
        for mode in ("solo", "handoff"):
            got = [counts[(arm, seed)][mode] for seed, _ in runs]
            got = [c for c in got if c is not None]
            if not got:
                cells.append("n/a")
                continue
            solved = [coverage(c)[0] for c in got]
            mean, lo, hi = t_interval(solved)
            interval = "" if math.isnan(lo) else f" [{lo:.1f}, {hi:.1f}]"
            seen = coverage(got[0])[1]
            cells.append(
                f"{mean:.1f}{interval} of {seen}; union of {len(got)} seeds {union_coverage(got)}"
            )
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines
