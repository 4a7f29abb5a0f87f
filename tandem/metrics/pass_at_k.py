"""Unbiased pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code").

For a problem with ``n`` samples of which ``c`` are correct, the chance that at least one of
``k`` samples drawn without replacement is correct is ``1 - C(n-c, k) / C(n, k)``. Binomials of
large ``n`` overflow, so the ratio is taken as the product ``prod_{i=n-c+1}^{n} (1 - k/i)``
(the paper's numerically stable form) in float64. Averaging the per-problem estimates gives
pass@k of the model; the estimate is unbiased for every ``k <= n`` and non-decreasing in ``k``.

What this file leaves out: scoring the samples (``tandem.rewards``) and grouping them by
problem (the caller hands ``[P, n]`` correctness or per-problem counts).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from tandem.registry import METRICS


def pass_at_k(num_samples: Tensor, num_correct: Tensor, k: int) -> Tensor:
    """Per-problem unbiased pass@k.

    Args:
        num_samples: ``[P]`` samples drawn for each problem (n).
        num_correct: ``[P]`` of them correct (c).
        k: samples the estimate allows; must not exceed any problem's n.

    Returns:
        ``[P]`` float64 estimates in [0, 1].
    """
    n = torch.as_tensor(num_samples, dtype=torch.float64).flatten()  # [P]
    c = torch.as_tensor(num_correct, dtype=torch.float64).flatten()  # [P]
    assert n.shape == c.shape, f"num_samples {list(n.shape)} and num_correct {list(c.shape)}"
    if n.numel() == 0:
        return n
    if k < 1 or bool((n < k).any()):
        raise ValueError(
            f"pass@{k} needs k >= 1 and at least k samples per problem, but a problem has "
            f"{int(n.min())}. Draw n >= {k} samples per problem or drop k={k}."
        )
    if bool(((c < 0) | (c > n)).any()):
        raise ValueError("num_correct must lie in [0, num_samples] for every problem.")
    i = torch.arange(1, int(n.max()) + 1, dtype=torch.float64)  # [M]
    in_range = (i[None] > (n - c)[:, None]) & (i[None] <= n[:, None])  # [P, M]
    factors = torch.where(in_range, 1.0 - k / i[None], torch.ones_like(in_range, dtype=i.dtype))
    # fewer than k wrong samples: every draw of k holds a correct one (the product's zero factor)
    return torch.where(n - c < k, 1.0, 1.0 - factors.prod(dim=1))


@METRICS.register("pass_at_k")
class PassAtK(Metric):
    """Mean unbiased pass@k over problems, for several k at once.

    ``update`` takes either a ``[P, n]`` correctness matrix (problems x samples) or per-problem
    counts. States are sums over problems, so processes reduce by summing: the value on several
    ranks equals the value on the union of their problems.

    Args:
        ks: the k values to report (each at most the samples per problem).

    Example:
        >>> m = PassAtK(ks=(1, 2))
        >>> m.update(torch.tensor([[True, False], [False, False]]))
        >>> {k: round(float(v), 3) for k, v in m.compute().items()}
        {'pass@1': 0.25, 'pass@2': 0.5}
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, ks: Sequence[int] = (1,), **kwargs) -> None:
        super().__init__(**kwargs)
        ks = tuple(int(k) for k in ks)
        assert ks and all(k >= 1 for k in ks), f"ks ({ks}) must be a non-empty list of k >= 1"
        self.ks = ks
        self.add_state("total", torch.zeros(len(ks), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("problems", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, correct: Tensor, num_samples: Tensor | int | None = None) -> None:
        """Add problems.

        Args:
            correct: ``[P, n]`` bool, sample j of problem i is correct; or ``[P]`` counts of
                correct samples, with ``num_samples``.
            num_samples: ``[P]`` (or one int for all) samples per problem, when ``correct``
                holds counts.
        """
        correct = torch.as_tensor(correct)
        if num_samples is None:
            assert correct.dim() == 2, (
                f"correct must be [P, n] booleans, or [P] counts with num_samples; "
                f"got shape {list(correct.shape)}"
            )
            counts = correct.to(torch.float64).sum(1)  # [P]
            n = torch.full_like(counts, correct.shape[1])  # [P]
        else:
            counts = correct.to(torch.float64).flatten()  # [P]
            n = torch.as_tensor(num_samples, dtype=torch.float64).expand_as(counts)  # [P]
        for j, k in enumerate(self.ks):
            self.total[j] += pass_at_k(n, counts, k).sum().to(self.total.device)
        self.problems += counts.numel()

    def compute(self) -> dict[str, Tensor]:
        """``{"pass@k": value}`` for every k (NaN before any problem)."""
        mean = self.total / self.problems  # [K]
        return {f"pass@{k}": mean[j] for j, k in enumerate(self.ks)}
