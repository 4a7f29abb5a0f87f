"""The displacement analysis: Spearman correlations and their p-values, the top-N shift
statistics on known means, and teacher forcing on evaluation records."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from scipy import stats

from tandem.analysis.displacement import (
    displacement,
    displacement_on_records,
    mean_probabilities,
    records_to_tensors,
    spearman,
    spearman_test,
)
from tandem.evaluation.records import read_records
from tandem.modules.models import load_causal_lm


class FixedLM(torch.nn.Module):
    """A stand-in causal LM whose next-token logits are the same at every position: its last
    hidden state is 1 everywhere, and its LM head maps that to the logits."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.head = torch.nn.Linear(1, logits.shape[0], bias=False)
        with torch.no_grad():
            self.head.weight.copy_(logits[:, None])
        self.head.requires_grad_(False)

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.head

    def forward(self, input_ids, attention_mask, position_ids, use_cache):
        return SimpleNamespace(logits=self.head(torch.ones(*input_ids.shape, 1)))


def test_spearman_matches_hand_values_and_averages_ties() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert spearman(x, x**3) == pytest.approx(1.0)
    assert spearman(x, -x) == pytest.approx(-1.0)
    # d = rank differences (0, 0, 1, -1, 0): rho = 1 - 6 * 2 / (5 * 24) = 0.9
    assert spearman(x, torch.tensor([1.0, 2.0, 4.0, 3.0, 5.0])) == pytest.approx(0.9)
    assert math.isnan(spearman(x, torch.ones(5)))
    # ties share their average rank: (10, 20, 10, 5) ranks (2.5, 4, 2.5, 1), against (1, 2, 3, 4)
    # centred: (0, 1.5, 0, -1.5) . (-1.5, -0.5, 0.5, 1.5) = -3, norms sqrt(4.5 * 5)
    tied = spearman(torch.tensor([10.0, 20.0, 10.0, 5.0]), x[:4])
    assert tied == pytest.approx(-3 / math.sqrt(4.5 * 5))


def test_pullback_correlation_is_negative_when_tandem_moves_displaced_items_back() -> None:
    g = torch.Generator().manual_seed(0)
    base = torch.rand(40, generator=g, dtype=torch.float64)
    grpo = base + 0.1 * torch.randn(40, generator=g, dtype=torch.float64)
    # Tandem undoes about half of GRPO's move on every item, with noise
    noise = 0.01 * torch.randn(40, generator=g, dtype=torch.float64)
    trl = grpo - 0.5 * (grpo - base) + noise
    d = displacement(base, grpo, trl, top=10)
    picked = d.token_ids
    want = stats.spearmanr((grpo - base)[picked].numpy(), (trl - grpo)[picked].numpy())
    assert d.pullback_n == 10
    assert d.pullback_rho == pytest.approx(float(want.statistic))
    assert d.pullback_p == pytest.approx(float(want.pvalue))
    assert d.pullback_rho < -0.5 and d.pullback_p < 0.05
    # the same items moved further by Tandem: the correlation turns positive
    away = displacement(base, grpo, grpo + 0.5 * (grpo - base) + noise, top=10)
    assert away.pullback_rho > 0.5 and away.pulled_back == 0.0
    # too few items to rank: NaN, not a number that looks like a finding
    one = torch.ones(1)
    assert all(math.isnan(v) for v in spearman_test(one, one))


def test_top_items_pulled_back_and_correlations_on_known_means() -> None:
    base = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0], dtype=torch.float64)
    grpo = torch.tensor([0.1, 0.3, 0.2, 0.1, 0.3], dtype=torch.float64)  # shifts -.3 0 0 0 +.3
    trl = torch.tensor([0.3, 0.25, 0.2, 0.1, 0.15], dtype=torch.float64)  # -.1 -.05 0 0 +.15
    d = displacement(base, grpo, trl, top=2)
    assert sorted(d.token_ids.tolist()) == [0, 4]
    assert d.pulled_back == 1.0  # both moved less by TRL
    assert d.spearman_top == pytest.approx(1.0)
    # relative to GRPO, TRL moves item 0 up (+.2) and item 4 down (-.15): against GRPO's move
    assert d.pullback_rho == pytest.approx(-1.0) and d.pullback_n == 2
    # over the vocabulary the shifts rank (1, 3, 3, 3, 5) against (1, 2, 3.5, 3.5, 5)
    assert d.spearman_all == pytest.approx(spearman(grpo - base, trl - base))
    assert 0.5 < d.spearman_all < 1.0
    assert [row["token_id"] for row in d.table()] == d.token_ids.tolist()


def test_mean_probabilities_by_teacher_forcing_fixed_models() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    models = [FixedLM(x) for x in logits]
    prompt = torch.tensor([[0, 1, 2], [1, 2, 0]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    tokens = torch.tensor([[1, 2, 0], [2, 0, 0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    means, count = mean_probabilities(models, prompt, prompt_mask, tokens, mask, batch_size=1)
    assert count == 3
    torch.testing.assert_close(means, logits.double().softmax(-1))


def test_displacement_on_evaluation_records(eval_outputs: Path) -> None:
    path = eval_outputs / "results" / "base" / "generations" / "tiny.jsonl"
    records = [r for r in read_records(path) if r["mode"] == "solo"]
    prompt, prompt_mask, tokens, mask = records_to_tensors(records)
    assert int(mask.sum()) == sum(r["length"] for r in records)
    assert prompt_mask.sum(1).tolist() == [len(r["prompt_ids"]) for r in records]
    for i, r in enumerate(records):
        assert prompt[i][prompt_mask[i]].tolist() == r["prompt_ids"]
        assert tokens[i, : r["length"]].tolist() == r["tokens"]
    base = load_causal_lm("tiny")
    moved = load_causal_lm("tiny")
    with torch.no_grad():
        moved.lm_head.weight[5] += 2.0  # tied: token 5's logit rises everywhere
    d = displacement_on_records(records, base, moved, base, top=10, batch_size=4)
    assert d.positions == int(mask.sum())
    assert int(d.token_ids[0]) == 5 and float(d.grpo[5]) > float(d.base[5])
    # TRL = the base: every displaced item is back where the base had it
    assert d.pulled_back == 1.0
