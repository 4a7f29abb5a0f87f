"""pass@k: the unbiased estimator against exact binomials, its edge cases, and the metric."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tandem.metrics import PassAtK, pass_at_k
from tandem.registry import METRICS


def exact(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize("n", [1, 2, 5, 16, 64])
def test_matches_the_binomial_formula(n: int) -> None:
    for k in range(1, n + 1):
        cs = torch.arange(n + 1)
        got = pass_at_k(torch.full_like(cs, n), cs, k)
        want = torch.tensor([exact(n, int(c), k) for c in cs], dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_stable_where_binomials_overflow_float64() -> None:
    # C(2000, 1000) is about 1e600: the naive ratio is inf / inf
    got = pass_at_k(torch.tensor([2000]), torch.tensor([3]), 1000)
    # exact: 1 - C(1997, 1000) / C(2000, 1000) = 1 - (1000*999*998) / (2000*1999*1998)
    want = 1 - (1000 * 999 * 998) / (2000 * 1999 * 1998)
    assert abs(float(got) - want) < 1e-12


def test_edges_and_monotonicity() -> None:
    n = torch.tensor([10, 10, 10])
    c = torch.tensor([0, 10, 3])
    assert pass_at_k(n, c, 1).tolist() == pytest.approx([0.0, 1.0, 0.3])
    # 3 correct of 10: any 8 samples include one of them
    assert float(pass_at_k(n, c, 8)[2]) == 1.0
    values = [float(pass_at_k(n, c, k)[2]) for k in range(1, 11)]
    assert all(a <= b for a, b in itertools.pairwise(values))


def test_k_above_n_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"pass@4 .* Draw n >= 4"):
        pass_at_k(torch.tensor([2]), torch.tensor([1]), 4)


def test_metric_from_matrix_and_from_counts_agree() -> None:
    correct = torch.tensor([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    a = METRICS.build("pass_at_k", ks=[1, 2, 4])
    a.update(correct[:1])
    a.update(correct[1:])
    b = PassAtK(ks=(1, 2, 4))
    b.update(correct.sum(1), num_samples=4)
    got_a, got_b = a.compute(), b.compute()
    want = {k: sum(exact(4, int(c), k) for c in correct.sum(1)) / 3 for k in (1, 2, 4)}
    for k in (1, 2, 4):
        assert float(got_a[f"pass@{k}"]) == pytest.approx(want[k])
        assert float(got_b[f"pass@{k}"]) == pytest.approx(want[k])
