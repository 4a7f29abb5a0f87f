"""Power of the study's procedure at the pages' noise: ``python benchmarks/power.py``.

Simulates studies as ``tandem.analysis.simulate`` builds them (the tiny world's pages: 200
problems, 8 samples each, a seed effect of logit sd 0.15) with Tandem RL better than GRPO by 0
to 6 sigma, sigma being the spread over seeds of one run's pass@1 (``Noise.sigma``), at 3, 5 and
10 seeds per arm, and prints one JSON object: per seed count and effect, how often

- ``procedure``: the study's reading (``tandem.analysis.mixed.difference``: the 95% interval of
  the model of seed and problem variance clear of zero the paper's way) reproduces the claim;
- ``welch``: Welch's interval of the run figures alone does (the seed level only);
- ``old_rule``: the rule the pages used before, Welch's interval wholly beyond the largest
  difference between two GRPO seeds, does;

with the effect in pass@1 points beside each sigma, the false positive rate at 0 sigma (either
direction), and the power of the pull-back reading (``tandem.analysis.estimates.paired``) for a
model that takes back half of GRPO's move on its most displaced items (``World``,
``half_pullback``) and how often an unrelated shift reads as one. ``--replicates`` sets the
studies per cell (2,000 by default; the pull-back's a tenth of that).

What this file leaves out: assertions (``tests/analysis/test_mixed.py`` and ``test_pullback.py``
hold them, on fewer studies).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from scipy import stats

from tandem.analysis.estimates import paired, pullback_pairs
from tandem.analysis.mixed import difference
from tandem.analysis.simulate import Noise, World, figures, simulate, world_pullbacks

SEEDS = (3, 5, 10)
SIGMAS = (0, 1, 2, 3, 4, 5, 6)


def welch(trl: np.ndarray, grpo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Welch's 95% interval of the difference of run means, ``[R, n]`` each."""
    n, m = trl.shape[-1], grpo.shape[-1]
    a, b = trl.var(-1, ddof=1) / n, grpo.var(-1, ddof=1) / m
    df = (a + b) ** 2 / (a**2 / (n - 1) + b**2 / (m - 1))
    half = stats.t.ppf(0.975, df) * np.sqrt(a + b)
    diff = trl.mean(-1) - grpo.mean(-1)
    return diff - half, diff + half


def old_rule(trl: np.ndarray, grpo: np.ndarray) -> np.ndarray:
    """Reproduces by the pages' former rule: Welch's interval beyond the null's spread (the
    largest difference between two GRPO seeds)."""
    lo, _ = welch(trl, grpo)
    n = grpo.shape[-1]
    pairs = [np.abs(grpo[:, i] - grpo[:, j]) for i in range(n) for j in range(i + 1, n)]
    return lo > np.max(pairs, axis=0)


def power_table(noise: Noise, replicates: int) -> dict:
    sigma = noise.sigma()
    out = {"sigma": round(sigma, 4), "replicates": replicates, "seeds": {}}
    for seeds in SEEDS:
        rows = {}
        for k in SIGMAS:
            shift = noise.shift(k * sigma)
            counts = simulate(noise, seeds, shift, replicates, np.random.default_rng(1000 + k))
            trl, grpo = figures(counts, noise)
            lo, hi = difference([trl, grpo], [1, -1]).interval()
            w_lo, w_hi = welch(trl.runs, grpo.runs)
            found = {
                "procedure": lo > 0,
                "welch": w_lo > 0,
                "old_rule": old_rule(trl.runs, grpo.runs),
            }
            row = {"points": round(100 * noise.truth(shift), 2)}
            row.update({name: round(float(hit.mean()), 4) for name, hit in found.items()})
            if k == 0:
                row["procedure_either_way"] = round(float(((lo > 0) | (hi < 0)).mean()), 4)
                row["welch_either_way"] = round(float(((w_lo > 0) | (w_hi < 0)).mean()), 4)
            rows[f"{k} sigma"] = row
        out["seeds"][str(seeds)] = rows
    return out


def pullback_table(replicates: int) -> dict:
    world = World(problems=100)
    out = {"problems": world.problems, "replicates": replicates, "seeds": {}}
    for seeds in SEEDS:
        rows = {}
        for kind in ("half_pullback", "independent", "seed_like"):
            rng = np.random.default_rng(seeds)
            hits = 0
            for _ in range(replicates):
                moved = world_pullbacks(world, kind, seeds, rng)
                pairs = pullback_pairs("trl", list(range(seeds)), list(range(seeds)))
                lo, _ = paired(moved, pairs).interval()
                hits += bool(lo[0] > 0)
            rows[kind] = round(hits / replicates, 4)
        out["seeds"][str(seeds)] = rows
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicates", type=int, default=2000, help="studies per cell")
    args = parser.parse_args()
    result = {"pass@1": power_table(Noise(), args.replicates)}
    result["pullback"] = pullback_table(max(20, args.replicates // 10))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
