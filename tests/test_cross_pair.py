"""A junior of another family end to end on the tiny world, as the guide runs it: training with
``model=tiny_cross`` and evaluating with ``junior=tiny-bpe-small sampler=word``."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from tandem.assets import TINY_WORLD
from tandem.evaluate import run as evaluate
from tandem.train import run

CONF = str(Path(__file__).resolve().parents[1] / "conf")
TINY = [
    "+data.sizes={train:32,validation:4}",
    "batch_size=8",
    "group_size=4",
    "generation.max_new_tokens=32",
    "validation.every_n_steps=2",
    "validation.size=4",
    "logger=csv",
    "module.optimizer.lr=1e-3",
    # short answers earn no reward: the imitation term keeps the senior moving, and it reads
    # the senior's log-probs of the junior's words, re-tokenized
    "module.loss.lambda_jun=0.1",
    "trainer.enable_progress_bar=false",
]


def compose_config(name: str, *overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


def test_training_with_a_junior_of_another_vocabulary(tmp_path: Path) -> None:
    cfg = compose_config(
        "train", *TINY, "model=tiny_cross", "trainer.max_steps=2", f"output_dir={tmp_path}"
    )
    metrics = run(cfg)
    assert 0.0 < metrics["train/senior_share"] < 1.0, "both models wrote"
    assert metrics["train/handoffs_per_rollout"] > 0
    # nats per byte of the senior's words: the trained junior reads them at 0.2-0.5, an
    # untrained model of its shape at 2.4-3.2
    assert 0.0 < metrics["train/junior_ce_per_byte"] < 1.0
    assert "train/kl" not in metrics, "no per-token KL to a junior of another vocabulary"
    base, trained = (
        load_file(str(TINY_WORLD / "model.safetensors")),
        load_file(str(tmp_path / "senior" / "model.safetensors")),
    )
    assert any(not torch.equal(base[k], trained[k]) for k in base), "the senior moved"
    (path,) = tmp_path.glob("csv/version_*/metrics.csv")
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/engine_logprob_gap")]
    # the engine's log-probs are the trainer's on the senior's own sequence
    assert rows and all(float(r["train/engine_logprob_gap"]) < 1e-4 for r in rows)


@pytest.mark.parametrize("drift", [True, False])
def test_evaluating_with_a_junior_of_another_vocabulary(tmp_path: Path, drift: bool) -> None:
    cfg = compose_config(
        "evaluate",
        "junior=tiny-bpe-small",
        "sampler=word",
        "eval.tiny.limit=4",
        "eval.tiny.n=2",
        "eval.tiny.ks=[1,2]",
        "eval.tiny.max_new_tokens=48",
        f"drift={str(drift).lower()}",
        "aim=false",
        "progress=false",
        f"output_dir={tmp_path}",
    )
    table = evaluate(cfg)["sets"]["tiny"]
    assert 0.0 < table["handoff/senior_share"] < 1.0
    if drift:
        # the senior is its own base here: no drift, against the base and not the junior
        assert table["drift/kl"] == pytest.approx(0.0, abs=1e-6)
        assert 0.0 < table["legibility/junior_ce_per_byte"] < 1.0
    for key in ("legibility/junior_ce", "legibility/junior_ce_pooled", "legibility/overlap"):
        assert key not in table, f"{key} does not apply across vocabularies"
