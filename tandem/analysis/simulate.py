"""Simulated studies with the pages' noise: what the study's procedure is calibrated on.

A simulated study has two arms (``trl`` and ``grpo``), ``seeds`` runs each, evaluated on the
same ``problems`` problems with ``samples`` samples each, as the tiny world's pages are. A run's
chance of solving a problem is ``expit(difficulty[p] + effect * (arm is trl) + i[a, p] +
u[a, s] + e[a, s, p])``: a problem's difficulty (logit normal, fit to the tiny world's GRPO
pass@1 of 0.36 and pass@8 of 0.76), an arm-by-problem effect ``i`` shared by the arm's seeds, a
seed effect ``u`` (logit sd 0.15, which gives a run's pass@1 a spread over seeds of about 0.02,
the tiny page's GRPO 0.021), and a seed-by-problem effect ``e``; each sample is a coin of that
chance. Every replicate draws new problems, seeds and samples.

Effects are given in ``sigma``: the spread over seeds of one run's pass@k (``Noise.sigma``),
the unit of the paper's effect sizes in ``benchmarks/power.py``, and turned into a logit shift
whose expected pass@k difference over the problem population is that many sigma
(``Noise.shift``); that expected difference is the truth a coverage test checks against.

What this file leaves out: the procedure itself (``tandem.analysis.mixed``) and its verdicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit

from tandem.analysis.mixed import Arm, linearize


@dataclass(frozen=True)
class Noise:
    """The noise of a simulated study (logit scale; defaults: the tiny world's pages).

    Attributes:
        problems: problems per study (one eval set).
        samples: samples per problem, and pass@k's k.
        k: pass@k's k (at most ``samples``).
        difficulty: mean and sd of a problem's logit.
        seed_sd: the seed effect's sd of each arm, ``(trl, grpo)``.
        seed_problem_sd: the seed-by-problem effect's sd.
        arm_problem_sd: the arm-by-problem effect's sd.
    """

    problems: int = 200
    samples: int = 8
    k: int = 1
    difficulty: tuple[float, float] = (-0.9, 2.0)
    seed_sd: tuple[float, float] = (0.15, 0.15)
    seed_problem_sd: float = 0.3
    arm_problem_sd: float = 0.1
    # the problem population the expected figures are taken over (fixed draws)
    _population: np.ndarray = field(
        default_factory=lambda: np.random.default_rng(12345).standard_normal((4, 100_000)),
        repr=False,
        compare=False,
    )

    def expected(self, shift: float, arm: int = 1) -> float:
        """A run's expected pass@k over the problem population, its arm (0: trl, 1: grpo, for
        its seed sd) shifted by ``shift``."""
        z = self._population
        logit = (
            self.difficulty[0]
            + self.difficulty[1] * z[0]
            + shift
            + self.arm_problem_sd * z[1]
            + self.seed_sd[arm] * z[2]
            + self.seed_problem_sd * z[3]
        )
        return float(_pass_at_k_of_chance(expit(logit), self.k).mean())

    def truth(self, shift: float) -> float:
        """trl's expected pass@k minus grpo's, trl shifted by ``shift``."""
        return self.expected(shift, 0) - self.expected(0.0, 1)

    def shift(self, difference: float) -> float:
        """The logit shift of trl whose expected pass@k difference from grpo is ``difference``."""
        return float(brentq(lambda s: self.truth(s) - difference, -6.0, 6.0))

    def sigma(self, seeds: int = 10, replicates: int = 400, seed: int = 0) -> float:
        """The spread over seeds of one grpo run's pass@k (problems fixed within a study)."""
        counts = simulate(self, seeds, 0.0, replicates, np.random.default_rng(seed))
        runs = figures(counts, self)[1].runs  # [R, n]
        return float(math.sqrt(runs.var(-1, ddof=1).mean()))


def _pass_at_k_of_chance(p: np.ndarray, k: int) -> np.ndarray:
    return 1.0 - (1.0 - p) ** k


def simulate(
    noise: Noise, seeds: int, shift: float, replicates: int, rng: np.random.Generator
) -> np.ndarray:
    """``[R, 2, n, P]`` correct samples of each problem, for arms (trl, grpo) and ``seeds``
    runs each; ``shift``: trl's logit shift (``Noise.shift`` of a difference)."""
    r, n, p = replicates, seeds, noise.problems
    difficulty = noise.difficulty[0] + noise.difficulty[1] * rng.standard_normal((r, 1, 1, p))
    arm_problem = noise.arm_problem_sd * rng.standard_normal((r, 2, 1, p))
    seed_sd = np.asarray(noise.seed_sd).reshape(1, 2, 1, 1)
    seed = seed_sd * rng.standard_normal((r, 2, n, 1))
    seed_problem = noise.seed_problem_sd * rng.standard_normal((r, 2, n, p))
    effect = np.asarray([shift, 0.0]).reshape(1, 2, 1, 1)
    chance = expit(difficulty + effect + arm_problem + seed + seed_problem)  # [R, 2, n, P]
    return rng.binomial(noise.samples, chance)


def pass_at_k(correct: np.ndarray, n: int, k: int) -> np.ndarray:
    """The unbiased pass@k of each problem from ``correct`` of ``n`` samples (elementwise)."""
    correct = np.asarray(correct)
    if k == 1:
        return correct / n
    table = np.array([_one(c, n, k) for c in range(n + 1)])
    return table[correct]


def _one(correct: int, n: int, k: int) -> float:
    return 1.0 if n - correct < k else 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def figures(counts: np.ndarray, noise: Noise) -> list[Arm]:
    """The two arms (trl, grpo) of simulated ``counts [R, 2, n, P]`` as the study reads them."""
    score = pass_at_k(counts, noise.samples, noise.k)  # [R, 2, n, P]
    sets = np.zeros(score.shape[-1], dtype=int)
    arms = []
    for a in range(2):
        runs, contributions = linearize(score[:, a], np.ones_like(score[:, a]), sets)
        arms.append(Arm(runs, contributions))
    return arms


# the pull-back's synthetic world: how GRPO's seeds share their recipe's shift
RECIPE = 0.7
KINDS = ("independent", "seed_like", "shrunken", "half_pullback")


@dataclass(frozen=True)
class World:
    """A synthetic vocabulary for the pull-back statistic (``tandem.analysis.pullback``).

    Every model's next-token distribution on problem ``p`` is ``softmax(logits + context[p] +
    strength * shift)``: one base, GRPO seeds whose shifts share a recipe direction (correlation
    ``RECIPE`` between seeds, as runs of one recipe), and another arm of a ``kind``:
    ``independent`` (a shift of its own, ``size`` times GRPO's), ``seed_like`` (built as
    another GRPO seed), ``shrunken`` (a GRPO-like seed's probabilities moved halfway back to
    the base's everywhere: less drift, the same direction) or ``half_pullback`` (a GRPO-like
    seed that takes back half of its move on the recipe's ``top_share`` most displaced items).

    Attributes:
        vocab, problems: the vocabulary's and the texts' sizes.
        strength: how far a unit shift moves the logits.
        context: the sd of a problem's own logits (the texts' sampling noise).
        top_share: the share of items a half pull-back targets.
    """

    vocab: int = 1110
    problems: int = 100
    strength: float = 0.3
    context: float = 1.0
    top_share: float = 0.05

    def studies(
        self, kind: str, seeds: int, rng: np.random.Generator, size: float = 1.0
    ) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
        """Per GRPO seed ``i``: ``[3, P, V]`` probabilities of (base, GRPO ``i``, the other
        arm's seed ``i``), and of (base, GRPO ``i``, GRPO ``j``) for every ``j != i``."""
        if kind not in KINDS:
            raise ValueError(f"kind ({kind!r}) must be one of {KINDS}.")
        v = self.vocab
        logits = 2.0 * rng.standard_normal(v) + self.context * rng.standard_normal(
            (self.problems, v)
        )  # [P, V]
        recipe = rng.standard_normal(v)

        def seed_shift() -> np.ndarray:
            return math.sqrt(RECIPE) * recipe + math.sqrt(1 - RECIPE) * rng.standard_normal(v)

        def model(shift: np.ndarray) -> np.ndarray:
            z = logits + self.strength * shift
            z = np.exp(z - z.max(-1, keepdims=True))
            return z / z.sum(-1, keepdims=True)  # [P, V]

        base = model(np.zeros(v))
        grpo = [model(seed_shift()) for _ in range(seeds)]
        other = [self._other(kind, base, model, seed_shift, recipe, size, rng) for _ in grpo]
        arm = [np.stack([base, g, o]) for g, o in zip(grpo, other, strict=True)]
        null = [[np.stack([base, g, h]) for h in grpo if h is not g] for g in grpo]
        return arm, null

    def _other(self, kind, base, model, seed_shift, recipe, size, rng) -> np.ndarray:
        if kind == "independent":
            return model(size * rng.standard_normal(self.vocab))
        like = model(seed_shift())
        if kind == "seed_like":
            return like
        if kind == "shrunken":
            return base + 0.5 * (like - base)
        moved = np.abs(model(math.sqrt(RECIPE) * recipe).mean(0) - base.mean(0))
        top = moved.argsort()[::-1][: max(1, math.ceil(self.top_share * self.vocab))]
        weight = np.ones(self.vocab)
        weight[top] = 0.5
        pulled = np.clip(base + weight * (like - base), 0.0, None)
        return pulled / pulled.sum(-1, keepdims=True)


def world_pullbacks(
    world: World, kind: str, seeds: int, rng: np.random.Generator, size: float = 1.0
) -> dict:
    """A study's ``pullback.json`` in ``world``: per GRPO seed, the other arm's seed (``trl``)
    and the next GRPO seeds (``null_seeds``) read against it (``tandem.analysis.pullback``),
    with 8 positions per problem."""
    import torch

    from tandem.analysis.estimates import null_seeds
    from tandem.analysis.pullback import halves, pullback

    arm, null = world.studies(kind, seeds, rng, size)
    first = halves(world.problems)
    positions = torch.full((world.problems,), 8.0, dtype=torch.float64)
    references = {}
    for i in range(seeds):
        others = [j for j in range(seeds) if j != i]  # the order of ``null[i]``
        models = [(f"trl-seed{i}", arm[i])]
        models += [
            (f"grpo-seed{j}", null[i][others.index(j)]) for j in null_seeds(i, list(range(seeds)))
        ]
        runs = {}
        for name, probs in models:
            got = pullback(8 * torch.from_numpy(probs), positions, first, world.top_share)
            runs[name] = {"value": got.value, "top": got.top, "rest": got.rest}
            runs[name].update(items=got.items, influence=got.influence.tolist())
        references[str(i)] = {"runs": runs}
    return {"top_share": world.top_share, "references": references}
