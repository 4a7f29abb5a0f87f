"""Dataset sources and the data module: clean rows, reported rejects, resumable batches."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from tandem.assets import TINY_WORLD
from tandem.data.datamodule import PromptDataModule
from tandem.data.sources import ArithmeticSource, HFSource
from tandem.errors import ConfigError


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY_WORLD)


def test_local_jsonl_with_custom_columns_reports_unusable_rows(tmp_path) -> None:
    rows = [
        {"question": "What is 1 + 1?", "final": "2"},
        {"question": "What is 2 + 2?", "final": ""},
        {"question": "What is 3 + 3?", "final": None},
        {"question": "  ", "final": "7"},
        {"question": "What is 4 + 4?", "final": 8},
    ]
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    source = HFSource(
        "json",
        splits={"test": "train"},
        data_files=str(path),
        problem_column="question",
        answer_column="final",
    )
    ds, report = source.load("test")
    assert ds["problem"] == ["What is 1 + 1?", "What is 4 + 4?"]
    assert ds["answer"] == ["2", "8"]
    assert report.kept == 2 and report.unusable == 3
    assert report.reasons == {"empty answer": 1, "missing answer": 1, "empty problem": 1}
    assert report.example["row"] == 1
    assert "unusable" in str(report)


def test_wrong_column_names_are_named(tmp_path) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps({"q": "x", "a": "1"}))
    source = HFSource("json", splits={"test": "train"}, data_files=str(path))
    with pytest.raises(KeyError, match=r"no column\(s\) \['problem', 'answer'\].*problem_column"):
        source.load("test")


def test_a_file_the_builder_cannot_parse_is_named_with_the_reason(tmp_path) -> None:
    path = tmp_path / "set.json"
    path.write_text('[{"problem": "a", "answer": "1"},\n{"problem": "b", answer: 2}]\n')
    source = HFSource("json", data_files=str(path))
    with pytest.raises(ConfigError, match=r"set\.json.*could not be read: Expected object"):
        source.load("train")


def test_unknown_split_is_named() -> None:
    with pytest.raises(KeyError, match="add 'validation' under `splits`"):
        HFSource("json", data_files="x.jsonl").load("validation")


def test_data_module_batches_resume_exactly(tokenizer) -> None:
    source = {"name": "arithmetic", "seed": 3, "sizes": {"train": 50, "validation": 10}}
    dm = PromptDataModule(source, tokenizer, batch_size=4, seed=1)
    dm.setup("fit")
    it = iter(dm.train_dataloader())
    first = [next(it) for _ in range(20)]  # 80 prompts: crosses an epoch boundary
    assert [b.index for b in first] == list(range(20))
    assert all(len(b) == 4 for b in first)
    # one epoch covers every train prompt once
    seen = [p for b in first[:13] for p in b.problems][:50]
    assert len(set(seen)) == 50
    # a data module restored to position 7 yields exactly batches 7, 8, ...
    again = PromptDataModule(source, tokenizer, batch_size=4, seed=1)
    again.load_state_dict({"consumed": 7, "seed": 1})
    again.setup("fit")
    resumed = iter(again.train_dataloader())
    for want in first[7:12]:
        got = next(resumed)
        assert (got.index, got.problems, got.prompt_ids) == (
            want.index,
            want.problems,
            want.prompt_ids,
        )


def test_consumed_counts_batches_taken_not_prefetched(tokenizer) -> None:
    dm = PromptDataModule(
        {"name": "arithmetic", "sizes": {"train": 20, "validation": 4}}, tokenizer, batch_size=2
    )
    dm.setup("fit")
    it = iter(dm.train_dataloader())
    a, _prefetched = next(it), next(it)
    dm.on_after_batch_transfer(a, 0)
    assert dm.state_dict()["consumed"] == 1


def test_resume_with_another_seed_is_refused(tokenizer) -> None:
    dm = PromptDataModule({"name": "arithmetic"}, tokenizer, batch_size=2, seed=1)
    with pytest.raises(ValueError, match=r"data\.seed"):
        dm.load_state_dict({"consumed": 3, "seed": 2})


def test_prompts_are_chat_formatted_and_tokenized(tokenizer) -> None:
    dm = PromptDataModule(
        {"name": "arithmetic", "sizes": {"train": 8, "validation": 4}},
        tokenizer,
        batch_size=2,
        val_batch_size=3,
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    text = tokenizer.decode(batch.prompt_ids[0])
    assert text.startswith("<|im_start|>user\n" + batch.problems[0])
    assert text.endswith("<|im_start|>assistant\n")
    val = list(dm.val_dataloader())
    assert [len(b) for b in val] == [3, 1]
    repeated = batch.repeat(3)
    assert repeated.problems == [batch.problems[0]] * 3 + [batch.problems[1]] * 3


def test_arithmetic_source_maps_columns() -> None:
    ds, report = ArithmeticSource(seed=0, sizes={"train": 5, "validation": 2}).load("validation")
    assert report.kept == 2 and report.unusable == 0
    assert set(ds.column_names) >= {"problem", "answer"}


def test_holdout_splits_a_train_only_set_without_overlap(tmp_path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text(
        "\n".join(json.dumps({"problem": f"p{i}", "answer": str(i)}) for i in range(10))
    )
    source = HFSource("json", data_files=str(path), holdout=3)
    train, _ = source.load("train")
    val, _ = source.load("validation")
    assert train["problem"] == [f"p{i}" for i in range(7)]
    assert val["problem"] == ["p7", "p8", "p9"]
    with pytest.raises(ValueError, match="leaves no training rows"):
        HFSource("json", data_files=str(path), holdout=10).load("train")


def test_seeded_holdout_draws_the_authors_rows(tmp_path) -> None:
    import pandas as pd

    rows = [{"problem": f"p{i}", "answer": "" if i == 4 else str(i)} for i in range(40)]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    source = HFSource("json", data_files=str(path), holdout=5, holdout_seed=0)
    train, _ = source.load("train")
    val, report = source.load("validation")
    # the authors' build: drop rows without an answer, then pandas' sample(n, random_state)
    usable = pd.DataFrame([r for r in rows if r["answer"]])
    held = usable.sample(n=5, random_state=0)
    assert val["problem"] == held["problem"].tolist() and report.kept == 5
    assert train["problem"] == usable.drop(held.index)["problem"].tolist()
    assert val["problem"] != [f"p{i}" for i in range(35, 40)], "not simply the last rows"


def test_every_process_validates_as_many_batches(tokenizer) -> None:
    # 5 problems over 2 processes in batches of 2 would give 3 and 2 problems: 2 batches and 1,
    # and a sharded senior's collectives would wait forever for the missing batch
    source = {"name": "arithmetic", "sizes": {"train": 8, "validation": 5}}
    batches = []
    for rank in (0, 1):
        dm = PromptDataModule(source, tokenizer, batch_size=2, val_batch_size=2)
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2, loggers=[])
        dm.setup("fit")
        batches.append(list(dm.val_dataloader()))
    assert [len(b) for b in batches] == [1, 1]
    problems = [p for ranks in batches for batch in ranks for p in batch.problems]
    assert len(problems) == len(set(problems)) == 4
