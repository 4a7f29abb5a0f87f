"""The guide's extension examples are real: each block titled with a path is written there (in
a temporary folder the family packages and Hydra search), then trained and sampled with.

A new sampler, reward and metric must each be one file and one YAML file, with no edit to any
existing file: the packages learn of the new modules only through their folders.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import AutoModelForCausalLM, AutoTokenizer

import tandem.metrics
import tandem.rewards
import tandem.samplers
from tandem.assets import TINY_BPE_SMALL, TINY_WORLD
from tandem.config import ConfigError, validate_train_config
from tandem.engine import JUNIOR, SENIOR, SamplingParams, generate
from tandem.evaluate import run as evaluate
from tandem.modules.checks import AuthorMaskError, check_rollouts
from tandem.registry import METRICS, REWARDS, SAMPLERS
from tandem.train import run
from tests.modules.test_checks import senior_wrote

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r'```(?:python|yaml) title="([^"]+)"\n(.*?)```', re.S)
TINY = [
    "+data.sizes={train:16,validation:4}",
    "batch_size=4",
    "group_size=2",
    "generation.max_new_tokens=16",
    "validation.every_n_steps=1",
    "validation.size=2",
    "logger=csv",
    "trainer.max_steps=1",
    "trainer.enable_progress_bar=false",
]


@pytest.fixture
def examples(tmp_path, monkeypatch):
    """Write the guide's examples under ``tmp_path``; returns the conf folder holding theirs."""
    blocks = BLOCK.findall((ROOT / "docs" / "guide.md").read_text())
    assert {path.split("/")[1] for path, _ in blocks} >= {"samplers", "rewards", "metrics"}
    for path, text in blocks:
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for package, registry in (
        (tandem.samplers, SAMPLERS),
        (tandem.rewards, REWARDS),
        (tandem.metrics, METRICS),
    ):
        folder = tmp_path / "tandem" / package.__name__.split(".")[1]
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
        # the registry looks again, and forgets the examples afterwards
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
        monkeypatch.setattr(registry, "_loaded", False)
    yield tmp_path / "conf"
    for name in [m for m in sys.modules if m.startswith("tandem.") and m.count(".") == 2]:
        if Path(getattr(sys.modules[name], "__file__", "") or "").is_relative_to(tmp_path):
            del sys.modules[name]


def compose_with(conf: Path, out: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(
            "train",
            overrides=[f"hydra.searchpath=[file://{conf}]", *TINY, f"output_dir={out}", *overrides],
        )


def test_the_examples_train_and_are_checked(examples, tmp_path):
    cfg = compose_with(examples, tmp_path / "run", "sampler=relay", "reward=boxed_format")
    assert cfg.sampler.n == 8 and cfg.reward.name == "boxed_format"
    with pytest.raises(ConfigError, match=r"unknown argument 'nn' \(did you mean 'n'\?\)"):
        validate_train_config(
            compose_with(examples, tmp_path / "x", "sampler=relay", "+sampler.nn=3")
        )
    with pytest.raises(ConfigError, match=r"sampler: n \(0\) is the tokens of one turn"):
        validate_train_config(
            compose_with(examples, tmp_path / "x", "sampler=relay", "sampler.n=0")
        )
    metrics = run(cfg)
    assert "train/reward" in metrics and "val/tandem/accuracy" in metrics
    assert 0.0 < metrics["train/senior_share"] < 1.0, "the junior must write under relay"


def test_the_example_sampler_runs_on_both_backends(examples, monkeypatch):
    tokenizer = AutoTokenizer.from_pretrained(TINY_WORLD)
    model = AutoModelForCausalLM.from_pretrained(TINY_WORLD, dtype=torch.float32)
    sampler = SAMPLERS.build("relay", tokenizer=tokenizer, n=3)
    prompts = [tokenizer("What is 2 + 3?")["input_ids"]] * 2
    params = SamplingParams(max_new_tokens=12, eos_token_ids=(), samples_per_prompt=2)
    r = generate(model, model, prompts, sampler, params)
    turn = torch.tensor([SENIOR] * 3 + [JUNIOR] * 3)
    assert torch.equal(r.authors, turn.repeat(2).expand(4, -1))
    # the vLLM pair's pens, without vLLM: the same schedule, stepped as its processor steps it
    from tests.engine.vllm_replay import pens_authors

    sampler.bind(len(tokenizer), "cpu")
    authors = pens_authors(sampler, 5, list(range(10, 30)), seed=3, vocab=len(tokenizer))
    assert authors == ([SENIOR] * 3 + [JUNIOR] * 3) * 3 + [SENIOR] * 2


def test_a_sampler_that_may_keep_the_junior_out_runs_on(examples, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(TINY_WORLD)
    line = SAMPLERS.build("line", tokenizer=tokenizer, p=0.5)

    # 4 rows of one line: 4 coins, all the senior's one time in 16: the run goes on
    check_rollouts(senior_wrote(tokenizer, "2 + 3 = 5", rows=4), line)
    # 8 rows of 4 lines: 32 coins all the senior's is a junior that never wrote
    with pytest.raises(AuthorMaskError, match="no rollout in this batch holds a junior token"):
        check_rollouts(senior_wrote(tokenizer, "1\n2\n3\n4", rows=8), line)
    # trained with the senior's coin at 0.99 on short rollouts, most batches hold no junior
    # token, and the run goes on
    out = tmp_path / "line"
    cfg = compose_with(
        examples,
        out,
        "sampler=line",
        "sampler.p=0.99",
        "generation.max_new_tokens=4",
        "trainer.max_steps=3",
    )
    run(cfg)
    (path,) = out.glob("csv/version_*/metrics.csv")
    with path.open() as f:
        shares = [
            float(r["train/senior_share"]) for r in csv.DictReader(f) if r.get("train/senior_share")
        ]
    assert len(shares) == 3 and 1.0 in shares, shares
    # across vocabularies: the cross engine steps the same rule over the junior's own tokens
    senior = AutoModelForCausalLM.from_pretrained(TINY_WORLD, dtype=torch.float32)
    junior = AutoModelForCausalLM.from_pretrained(TINY_BPE_SMALL, dtype=torch.float32)
    r = generate(
        senior,
        junior,
        [tokenizer("What is 2 + 3?")["input_ids"]] * 4,
        line,
        SamplingParams(max_new_tokens=16, eos_token_ids=(), seed=1),
        tokenizer=tokenizer,
        junior_tokenizer=AutoTokenizer.from_pretrained(TINY_BPE_SMALL),
    )
    assert bool(r.junior_mask.any()) and bool(r.senior_mask.any())


def test_the_example_reward_and_metric(examples):
    reward = REWARDS.build("boxed_format")
    assert reward.score(["so \\boxed{4}", "4"], ["4", "4"]) == [1.0, 0.0]
    metric = METRICS.build("junior_tokens")
    metric.update(torch.tensor([[1, 0, 0, -1], [1, -1, -1, -1]]))
    assert float(metric.compute()) == 1.0


def test_the_example_metric_is_listed_in_training_validation_and_evaluation(examples, tmp_path):
    cfg = compose_with(examples, tmp_path / "run", "+metrics.junior=junior_tokens")
    metrics = run(cfg)
    for key in ("train/junior", "val/tandem/junior"):
        assert 0.0 <= metrics[key] <= 16.0, key  # tokens per rollout, at most max_new_tokens
    assert metrics["val/solo/junior"] == 0.0
    # the built-in figures of the same rollouts: the junior's tokens are its share of them
    expected = (1 - metrics["train/senior_share"]) * metrics["train/response_length"]
    assert metrics["train/junior"] == pytest.approx(expected, rel=1e-5)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "evaluate",
            overrides=[
                "+metrics.junior=junior_tokens",
                "eval.tiny.limit=2",
                "eval.tiny.ks=[1,2]",
                "eval.tiny.n=2",
                "eval.tiny.max_new_tokens=8",
                "drift=false",
                "aim=false",
                "progress=false",
                f"output_dir={tmp_path / 'eval'}",
            ],
        )
    table = evaluate(cfg)["sets"]["tiny"]
    for mode in ("solo", "handoff"):
        share, length = table[f"{mode}/senior_share"], table[f"{mode}/response_length"]
        assert table[f"{mode}/junior"] == pytest.approx((1 - share) * length, rel=1e-5, abs=1e-9)
    assert table["handoff/junior"] > 0.0
