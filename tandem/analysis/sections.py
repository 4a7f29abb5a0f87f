"""The page's longer sections, from its inputs: what training did, GRPO's drift against another
world's, the pull-back seed by seed, each arm's coverage, and the runs.

What this file leaves out: the verdicts (``tandem.analysis.page``) and the intervals.
"""

from __future__ import annotations

import math

from tandem.analysis.claims import difference_interval, t_interval
from tandem.analysis.inputs import Inputs
from tandem.analysis.problems import seen, solved

VALIDATION_KEYS = ("val/solo/accuracy", "val/tandem/accuracy")
# GRPO's drift from the base, as another world's page is set against: (key, what it is); a drop
# is the solo figure minus the handoff figure of the same seed
DRIFT = (
    ("drift/kl", "KL to the base (nats per token)"),
    ("legibility/junior_ce", "the junior's cross-entropy on the senior's text (nats per token)"),
    ("drop", "solo minus handoff pass@1"),
    ("greedy/drop", "greedy solo minus handoff accuracy"),
)


def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _cell(values: list[float] | None, digits: int = 3) -> str:
    if not values:
        return "n/a"
    mean, lo, hi = t_interval(values)
    if math.isnan(lo):
        return f"{_fmt(mean, digits)} (n={len(values)})"
    return f"{_fmt(mean, digits)} [{_fmt(lo, digits)}, {_fmt(hi, digits)}]"


def training_section(inputs: Inputs) -> list[str]:
    """Greedy accuracy on the held-out problems, alone and handing off; validation curves."""
    greedy, arms, base = inputs.study.get("greedy"), inputs.arms, inputs.base["metrics"]
    lines = ["## What training did", ""]
    if greedy:
        keys = ("greedy/solo/pass@1", "greedy/handoff/pass@1")
        lines += [
            f"Greedy accuracy on the held-out test problems (`conf/eval/{greedy}.yaml`), the "
            "senior alone and handing off to the junior under the step schedule.",
            "",
            "| metric | base | " + " | ".join(arms) + " |",
            "|" + " --- |" * (len(arms) + 2),
        ]
        for key in keys:
            cells = [
                _cell([r.metrics[key] for r in inputs.arm(a) if key in r.metrics]) for a in arms
            ]
            lines.append(f"| `{key}` | {_fmt(base.get(key))} | " + " | ".join(cells) + " |")
        lines.append("")
        for arm in arms:
            got = [r.metrics[keys[0]] - base[keys[0]] for r in inputs.arm(arm) if keys[0] in base]
            if not got:
                continue
            mean, lo, hi = t_interval(got)
            ends = "" if math.isnan(lo) else f", 95% interval [{100 * lo:+.1f}, {100 * hi:+.1f}]"
            lines.append(
                f"- `{arm}`: solo greedy accuracy {100 * mean:+.1f} points over the base "
                f"({len(got)} seeds{ends})."
            )
        lines.append("")
    return [*lines, *curves_section(inputs)]


def curves_section(inputs: Inputs) -> list[str]:
    """Validation accuracy over training, solo and handing off, mean over seeds per arm."""
    steps = sorted({int(s) for r in inputs.runs for c in r.validation.values() for s in c})
    if not steps:
        return []
    arms = inputs.arms
    lines = [
        "Validation accuracy during training (greedy, the validation split, logged by "
        "`tandem.train`): the senior alone / handing off to the junior under the word sampler "
        "at p=0.5, mean over seeds.",
        "",
        "| step | " + " | ".join(arms) + " |",
        "|" + " --- |" * (len(arms) + 1),
    ]
    for step in steps:
        cells = []
        for arm in arms:
            pair = []
            for key in VALIDATION_KEYS:
                got = [r.validation.get(key, {}).get(str(step)) for r in inputs.arm(arm)]
                got = [v for v in got if v is not None]
                pair.append(_fmt(sum(got) / len(got)) if got else "n/a")
            cells.append(" / ".join(pair))
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def grpo_drift(inputs: Inputs) -> dict[str, list[float]]:
    """GRPO's per-seed drift measures (``DRIFT``), the drops from each seed's pair of figures."""
    runs = [r.metrics for r in inputs.arm("grpo")]
    out = {key: [m[key] for m in runs if key in m] for key, _ in DRIFT if "drop" not in key}
    for prefix in ("", "greedy/"):
        solo, hand = f"{prefix}solo/pass@1", f"{prefix}handoff/pass@1"
        out[f"{prefix}drop"] = [m[solo] - m[hand] for m in runs if solo in m and hand in m]
    return out


def drift_section(inputs: Inputs, other: Inputs | None) -> list[str]:
    """GRPO's drift from the base here against the ``compare`` world's, with Welch's 95%
    interval of the difference (seed level: two worlds share no problems to pair)."""
    name = inputs.study["compare"]
    if other is None:
        return [
            f"## GRPO's drift here and in the `{name}` world",
            "",
            f"Not measured: no inputs for the `{name}` study at this checkpoint.",
            "",
        ]
    lines = [
        f"## GRPO's drift here and in `{other.study['runs']}`",
        "",
        f"Can this world tell? GRPO's drift from its base, per seed, on this page's runs and on "
        f"those of the `{name}` study (`{other.study['data']}`, its {other.study['checkpoint']} "
        "checkpoints), with Welch's 95% interval of the difference of the means. A drop is a "
        "seed's solo figure minus its handoff figure (the step schedule).",
        "",
        f"| measure | here | `{other.study['runs']}` | difference |",
        "| --- | --- | --- | --- |",
    ]
    mine, yours = grpo_drift(inputs), grpo_drift(other)
    verdicts = []
    for key, what in DRIFT:
        a, b = mine.get(key, []), yours.get(key, [])
        if not a or not b:
            lines.append(f"| {what} | {_cell(a)} | {_cell(b)} | n/a |")
            continue
        diff, lo, hi = difference_interval(a, b)
        ends = "n/a" if math.isnan(lo) else f"[{lo:+.3f}, {hi:+.3f}]"
        lines.append(f"| {what} | {_cell(a)} | {_cell(b)} | {diff:+.3f} {ends} |")
        said = (
            "no interval with one seed"
            if math.isnan(lo)
            else "larger here, the interval clear of zero"
            if lo > 0
            else "smaller here, the interval clear of zero"
            if hi < 0
            else "no detectable difference, the interval contains zero"
        )
        verdicts.append(f"- {what}: {said} ({diff:+.3f}, 95% interval {ends}).")
    return [*lines, "", *verdicts, ""]


def pullback_section(inputs: Inputs) -> list[str]:
    """Each pair's pull-back and slopes, and the paper's own statistics beside them."""
    refs = inputs.pullback.get("references", {})
    if not refs:
        return []
    lines = [
        "## The pull-back, seed by seed",
        "",
        f"On each GRPO seed's own solo texts, every other run read against it "
        f"(`tandem/analysis/pullback.py`): the slopes of its shift on GRPO's over GRPO's most "
        f"displaced items (the top {inputs.pullback['top_share']:.0%} of the vocabulary, "
        "chosen on one half of the problems and measured on the other, both ways) and over the "
        "rest, in units of each model's own drift; the pull-back is rest minus top. Beside it, "
        "the paper's statistics on the same items and all texts: the share closer to the base "
        "and the Spearman correlation of `grpo - base` with `run - grpo`, which read "
        '"pulled back" for any smaller or unrelated shift and carry no verdict here.',
        "",
        "| GRPO seed | run | slope, top | slope, rest | pull-back | paper's share closer | "
        "paper's rho |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for seed, found in refs.items():
        for name, got in found["runs"].items():
            row = [seed, f"`{name}`", *(f"{got[k]:+.3f}" for k in ("top", "rest", "value"))]
            row += [f"{got['pulled_back']:.0%}", f"{got['pullback_rho']:+.3f}"]
            lines.append("| " + " | ".join(row) + " |")
    return [*lines, ""]


def coverage_section(inputs: Inputs) -> list[str]:
    """Problems solved at least once, per run and arm, solo and handing off."""
    lines = [
        "## Coverage",
        "",
        "The problems solved at least once (any correct sample), as the independent "
        "reproduction counts distinct problems solved: the mean over an arm's seeds with its "
        "95% t-interval, then the union over its seeds.",
        "",
        "| arm | solo | handoff |",
        "| --- | --- | --- |",
    ]
    base = inputs.base["problems"]
    lines.append(
        "| base | "
        + " | ".join(f"{len(solved(base, m))} of {seen(base)}" for m in ("solo", "handoff"))
        + " |"
    )
    for arm in inputs.arms:
        runs = [r.problems for r in inputs.arm(arm)]
        cells = []
        for mode in ("solo", "handoff"):
            counts = [float(len(solved(p, mode))) for p in runs]
            mean, lo, hi = t_interval(counts)
            ends = "" if math.isnan(lo) else f" [{lo:.1f}, {hi:.1f}]"
            union = len(set().union(*(solved(p, mode) for p in runs)))
            cells.append(f"{mean:.1f}{ends} of {seen(runs[0])}; union of {len(runs)} seeds {union}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def runs_section(inputs: Inputs) -> list[str]:
    """The runs and the code each was trained and evaluated under."""
    lines = [
        "## Runs",
        "",
        "The code each run was trained under (the commit of each start and the step it started "
        "from; `unrecorded`: steps run before runs recorded their commit) and evaluated under.",
        "",
        "| arm | seed | folder | trained at | evaluated at |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in sorted(inputs.runs, key=lambda r: (r.arm, r.seed)):
        starts = [f"`{c}` from step {s}" for c, s in r.trained]
        if not r.trained or r.trained[0][1] > 0:
            first = f" to step {r.trained[0][1]}" if r.trained else ""
            starts.insert(0, "unrecorded" + first)
        lines.append(
            f"| {r.arm} | {r.seed} | `{r.folder}` | {', '.join(starts)} | `{r.evaluated}` |"
        )
    return [*lines, ""]
