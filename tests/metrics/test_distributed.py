"""Every metric reduced over 2 processes (gloo, CPU) equals the metric on the union of the data.

The ranks get shards of different sizes (and rank 1 gets rows of another width), so a reduction
that averaged per-rank means instead of summing states would show.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tandem.metrics import (
    DistributionOverlap,
    HandoffsPerRollout,
    JuniorCrossEntropy,
    PassAtK,
    PooledJuniorCrossEntropy,
    SeniorShare,
    TokenKL,
)

WORLD = 2


def make_data() -> list[dict[str, torch.Tensor]]:
    """Two shards of problems and token-level data: rank 0 gets 5 rows, rank 1 gets 2."""
    g = torch.Generator().manual_seed(0)
    shards = []
    for rows, width in ((5, 6), (2, 9)):
        mask = torch.rand(rows, width, generator=g) < 0.7
        authors = torch.where(torch.rand(rows, width, generator=g) < 0.6, 1, 0)
        shards.append(
            {
                "correct": torch.rand(rows, 4, generator=g) < 0.4,  # [P, n]
                "p": torch.randn(rows, width, 13, generator=g),
                "q": torch.randn(rows, width, 13, generator=g),
                "tokens": torch.randint(0, 13, (rows, width), generator=g),
                "mask": mask,
                "authors": torch.where(mask, authors, -1),
            }
        )
    return shards


def compute_all(shards: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    metrics = {
        "pass": PassAtK(ks=(1, 2, 4)),
        "kl": TokenKL(),
        "overlap": DistributionOverlap(),
        "ce": JuniorCrossEntropy(),
        "ce_pooled": PooledJuniorCrossEntropy(),
        "share": SeniorShare(),
        "handoffs": HandoffsPerRollout(),
    }
    for s in shards:
        metrics["pass"].update(s["correct"])
        metrics["kl"].update(s["p"], s["q"], s["mask"])
        metrics["overlap"].update(s["p"], s["q"], s["mask"])
        metrics["ce"].update(s["q"], s["mask"], tokens=s["tokens"])
        metrics["ce_pooled"].update(s["q"], s["mask"], tokens=s["tokens"])
        metrics["share"].update(s["authors"])
        metrics["handoffs"].update(s["authors"])
    out = {}
    for name, m in metrics.items():
        value = m.compute()
        items = value.items() if isinstance(value, dict) else [(name, value)]
        out.update({k: float(v) for k, v in items})
    return out


def _worker(rank: int, folder: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/store", rank=rank, world_size=WORLD
    )
    try:
        values = compute_all([make_data()[rank]])
        torch.save(values, Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_processes_reduce_to_the_single_process_value(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=WORLD, join=True)
    union = compute_all(make_data())
    single = [compute_all([s]) for s in make_data()]
    for rank in range(WORLD):
        reduced = torch.load(tmp_path / f"rank{rank}.pt")
        assert reduced.keys() == union.keys()
        for key, value in union.items():
            assert abs(reduced[key] - value) < 1e-9, (rank, key, reduced[key], value)
    # the test can fail: each shard alone gives other numbers than the union
    assert any(abs(single[0][k] - union[k]) > 1e-3 for k in union)
