"""Prompts longer than the run allows are dropped at load time, counted, and never tokenized
when their length alone proves them too long."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from transformers import AutoTokenizer

from tandem.assets import TINY_WORLD
from tandem.data.datamodule import PromptDataModule, fitting_prompts, prompt_token_cap
from tandem.errors import ConfigError

CONF = str(Path(__file__).resolve().parents[2] / "conf")
# one megabyte of problem: about 250k tokens, far past the tiny model's 512 positions
HUGE = "What is " + "1 + " * 262_144 + "1?"
# over 100 tokens, yet short enough in characters that only tokenizing can tell
LONG = "Add these numbers: " + " ".join(str(i) for i in range(200)) + "."


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY_WORLD)


class CountingTokenizer:
    """The tiny tokenizer, recording the longest text it was asked to tokenize."""

    def __init__(self, tokenizer) -> None:
        self.inner, self.longest = tokenizer, 0

    def __call__(self, texts: list[str], **kwargs):
        self.longest = max([self.longest, *map(len, texts)])
        return self.inner(texts, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_prompts_over_the_cap_are_dropped_and_a_huge_one_is_never_tokenized(tokenizer) -> None:
    counting = CountingTokenizer(tokenizer)
    texts = ["What is 1 + 1?", HUGE, LONG, "What is 2 + 2?"]
    assert len(tokenizer(LONG)["input_ids"]) > 100
    keep, ids = fitting_prompts(counting, texts, cap=100)
    assert keep == [0, 3]
    assert ids == tokenizer([texts[0], texts[3]], add_special_tokens=False)["input_ids"]
    assert counting.longest == len(LONG), "the long prompt is tokenized, the huge one is not"


def test_the_cap_defaults_to_the_context_left_after_the_response() -> None:
    assert prompt_token_cap(None, context=512, max_new_tokens=160) == 352
    assert prompt_token_cap(100, context=512, max_new_tokens=160) == 100
    assert prompt_token_cap(100, context=None, max_new_tokens=160) == 100
    with pytest.raises(ConfigError, match=r"data\.max_prompt_tokens \(400\).*at most 352"):
        prompt_token_cap(400, context=512, max_new_tokens=160)
    with pytest.raises(ConfigError, match=r"generation\.max_new_tokens \(600\) leaves no room"):
        prompt_token_cap(None, context=512, max_new_tokens=600)


def write_jsonl(path: Path, problems: list[str]) -> Path:
    path.write_text("".join(json.dumps({"problem": p, "answer": "1"}) + "\n" for p in problems))
    return path


def test_the_data_module_drops_and_counts(tmp_path: Path, tokenizer, caplog) -> None:
    problems = [f"What is {i} + 1?" for i in range(8)]
    path = write_jsonl(tmp_path / "set.jsonl", [*problems[:3], HUGE, *problems[3:], LONG])
    source = {"name": "hf", "path": "json", "data_files": str(path), "holdout": 2}
    dm = PromptDataModule(source, tokenizer, batch_size=2, max_prompt_tokens=100)
    dm.setup("fit")
    assert dm.dropped == {"train": 1, "validation": 1}
    assert dm.splits["train"]["problems"] == problems[:7]
    assert dm.splits["validation"]["problems"] == problems[7:]
    assert all(len(ids) <= 100 for ids in dm.splits["train"]["ids"])
    assert "dropped 1 of 8 prompts longer than 100 tokens (data.max_prompt_tokens)" in caplog.text


def test_a_split_with_no_prompt_left_is_a_config_error(tmp_path: Path, tokenizer) -> None:
    path = write_jsonl(tmp_path / "set.jsonl", [HUGE, LONG, HUGE])
    source = {"name": "hf", "path": "json", "data_files": str(path)}
    dm = PromptDataModule(source, tokenizer, batch_size=2, max_prompt_tokens=100)
    with pytest.raises(ConfigError, match=r"every train prompt \(3\).*data\.max_prompt_tokens"):
        dm.setup("fit")


def test_training_runs_past_a_megabyte_prompt(tmp_path: Path) -> None:
    from tandem.train import run

    problems = [f"What is {i} + {i}?" for i in range(12)]
    path = write_jsonl(tmp_path / "set.jsonl", [*problems[:5], HUGE, *problems[5:]])
    assert path.stat().st_size > 1_000_000
    out = tmp_path / "run"
    overrides = [
        "data=deepscaler",
        "data.path=json",
        f"+data.data_files={path}",
        "data.holdout=2",
        "batch_size=4",
        "group_size=2",
        "generation.max_new_tokens=8",
        "validation.every_n_steps=10",
        "trainer.max_steps=1",
        "trainer.enable_progress_bar=false",
        "logger=csv",
        f"output_dir={out}",
    ]
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    run(cfg)
    (metrics,) = out.glob("csv/version_*/metrics.csv")
    with metrics.open() as f:
        rows = list(csv.DictReader(f))
    (counts,) = [r for r in rows if r.get("data/dropped_prompts")]
    assert float(counts["data/dropped_prompts"]) == 1.0
    assert float(counts["data/dropped_val_prompts"]) == 0.0
    assert any(r.get("train/reward") for r in rows), "a training step ran"
