"""The pull-back statistic: direction apart from size, on known shifts and in a synthetic world
(``tandem.analysis.simulate.World``) read by the study's own procedure
(``tandem.analysis.estimates.paired``): a shift unrelated to GRPO's of any size, a second GRPO
seed and a uniformly smaller drift read no pull-back at most 5% of the time (plus Monte Carlo
error); a model that takes back half of GRPO's move on its most displaced items is found."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tandem.analysis.displacement import mean_probabilities, records_to_tensors
from tandem.analysis.estimates import paired, pullback_pairs
from tandem.analysis.pullback import halves, problem_probabilities, pullback, scaled
from tandem.analysis.simulate import World, world_pullbacks
from tandem.evaluation.records import read_records
from tandem.modules.models import load_causal_lm

V, P = 200, 10


def means(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A base's and a GRPO's mean probabilities ``[V]``."""
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(V, generator=g, dtype=torch.float64)
    shift = 0.5 * torch.randn(V, generator=g, dtype=torch.float64)
    return logits.softmax(0), (logits + shift).softmax(0)


def same_on_every_problem(*models: torch.Tensor) -> torch.Tensor:
    """``[M, P, V]`` per-problem sums of one position each, every problem alike."""
    return torch.stack(models)[:, None, :].expand(-1, P, -1).clone()


def test_a_uniformly_smaller_drift_is_size_not_pullback() -> None:
    base, grpo = means()
    ones = torch.ones(P, dtype=torch.float64)
    for fraction in (0.2, 0.5, 1.5):
        other = base + fraction * (grpo - base)
        got = pullback(same_on_every_problem(base, grpo, other), ones, halves(P))
        assert got.value == pytest.approx(0.0, abs=1e-9)
        # in units of each model's own drift, it follows GRPO exactly
        assert got.top == pytest.approx(1.0) and got.rest == pytest.approx(1.0)


def test_taking_back_half_on_the_most_displaced_items() -> None:
    base, grpo = means()
    x = scaled(base, grpo)
    items = math.ceil(0.05 * V)
    top = x.abs().argsort(descending=True)[:items]
    weight = torch.ones(V, dtype=torch.float64)
    weight[top] = 0.5
    other = base + weight * (grpo - base)  # sums to one only approximately: a mean is enough
    ones = torch.ones(P, dtype=torch.float64)
    got = pullback(same_on_every_problem(base, grpo, other), ones, halves(P))
    assert got.items == items
    size = x.norm() / (weight * x).norm()  # each slope is in the model's own drift's units
    assert got.top == pytest.approx(0.5 * size) and got.rest == pytest.approx(float(size))
    assert got.value == pytest.approx(0.5 * size)


def test_the_influence_is_each_problems_weight_derivative() -> None:
    g = torch.Generator().manual_seed(1)
    sums = torch.rand(3, P, V, generator=g, dtype=torch.float64)
    sums[2] = sums[0] + 0.7 * (sums[1] - sums[0]) + 0.05 * torch.rand(P, V, generator=g)
    positions = 1 + torch.rand(P, generator=g, dtype=torch.float64)
    sums = sums / sums.sum(-1, keepdim=True) * positions[None, :, None]
    first = halves(P)
    got = pullback(sums, positions, first)
    assert float(got.influence.sum()) == pytest.approx(0.0, abs=1e-12)
    step = 1e-6
    for p in (0, 3, 6, 9):
        weight = torch.ones(P, dtype=torch.float64)
        weight[p] += step
        moved = pullback(sums * weight[None, :, None], positions * weight, first)
        assert (moved.value - got.value) / step == pytest.approx(float(got.influence[p]), rel=1e-3)


def test_most_displaced_is_a_share_of_the_vocabulary() -> None:
    base, grpo = means()
    ones = torch.ones(P, dtype=torch.float64)
    sums = same_on_every_problem(base, grpo, grpo)
    assert pullback(sums, ones, halves(P), top_share=0.1).items == 20
    with pytest.raises(ValueError, match="top_share"):
        pullback(sums, ones, halves(P), top_share=500)


def test_problem_sums_average_to_the_mean_probabilities(eval_outputs: Path) -> None:
    path = eval_outputs / "results" / "base" / "generations" / "tiny.jsonl"
    records = [r for r in read_records(path) if r["mode"] == "solo"]
    model = load_causal_lm("tiny")
    sums, positions, problems = problem_probabilities([model], records, batch_size=2)
    assert problems == [("tiny", p) for p in sorted({r["problem_index"] for r in records})]
    assert positions.tolist() == [
        sum(r["length"] for r in records if r["problem_index"] == p) for _, p in problems
    ]
    mean, count = mean_probabilities([model], *records_to_tensors(records), batch_size=2)
    assert count == int(positions.sum())
    torch.testing.assert_close(sums.sum(1) / positions.sum(), mean)


def reads_pullback(kind: str, replicates: int, seed: int, size: float = 1.0) -> float:
    """How often the study's reading of 3 seeds in ``World`` finds a pull-back."""
    rng = np.random.default_rng(seed)
    world = World(problems=60)
    found = 0
    for _ in range(replicates):
        moved = world_pullbacks(world, kind, 3, rng, size)
        lo, _ = paired(moved, pullback_pairs("trl", [0, 1, 2], [0, 1, 2])).interval()
        found += bool(lo[0] > 0)
    return found / replicates


NULLS = [("independent", 0.5), ("independent", 2.0), ("seed_like", 1.0), ("shrunken", 1.0)]


@pytest.mark.parametrize(("kind", "size"), NULLS, ids=[f"{k}-{s}" for k, s in NULLS])
def test_no_pullback_reads_as_pullback_at_most_five_percent(kind: str, size: float) -> None:
    replicates = 40
    rate = reads_pullback(kind, replicates, seed=10, size=size)
    assert rate <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / replicates), rate


def test_a_half_pullback_is_found() -> None:
    power = reads_pullback("half_pullback", 40, seed=11)
    print(f"power at 3 seeds for a half pull-back: {power:.2f}")
    assert power >= 0.7, power


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "size"), NULLS, ids=[f"{k}-{s}" for k, s in NULLS])
def test_no_pullback_reads_as_pullback_at_most_five_percent_long(kind: str, size: float) -> None:
    replicates = 400
    rate = reads_pullback(kind, replicates, seed=20, size=size)
    assert rate <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / replicates), rate
