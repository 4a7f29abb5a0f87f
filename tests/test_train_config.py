"""The composed training config, and the checks that stop a bad one before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tandem.config import ConfigError, validate_train_config

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def train_config(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def test_defaults_compose_and_validate() -> None:
    cfg = train_config()
    assert cfg.sampler.name == "word"
    assert cfg.reward.name == "boxed_math"
    assert cfg.model.name_or_path == "tiny"
    validate_train_config(cfg)


@pytest.mark.parametrize("sampler", ["solo", "token", "word", "sentence", "step"])
def test_every_sampler_config_validates(sampler: str) -> None:
    validate_train_config(train_config(f"sampler={sampler}"))


@pytest.mark.parametrize("experiment", ["trl", "grpo", "kl_reg"])
def test_experiment_arms_validate(experiment: str) -> None:
    validate_train_config(train_config(f"experiment={experiment}"))


def _problems(*overrides: str, world_size: int = 1) -> str:
    with pytest.raises(ConfigError) as err:
        validate_train_config(train_config(*overrides), world_size)
    return str(err.value)


def test_unknown_sampler_lists_the_known_ones() -> None:
    message = _problems("sampler.name=wrod")
    assert "sampler.name: unknown sampler 'wrod'" in message
    assert "Did you mean 'word'?" in message


def test_p_outside_unit_interval() -> None:
    message = _problems("sampler.p=1.5")
    assert "sampler.p (1.5) must be a probability in [0, 1]" in message


def test_batch_size_not_a_multiple_of_group_size() -> None:
    message = _problems("batch_size=12", "group_size=8")
    assert "batch_size (12) must be divisible by group_size (8)" in message
    assert "Set batch_size to a multiple of 8" in message


def test_batch_must_split_into_whole_groups_per_rank() -> None:
    message = _problems("batch_size=24", "group_size=8", world_size=2)
    assert "multiple of 16" in message


def test_model_path_that_does_not_exist() -> None:
    message = _problems("model.name_or_path=/no/such/model")
    assert "model.name_or_path ('/no/such/model') is not a model folder" in message


def test_all_problems_are_reported_at_once() -> None:
    message = _problems(
        "sampler.p=-1",
        "batch_size=7",
        "generation.temperature=0",
        "module.loss.aggregation=sum",
        "validation.monitor=val/loss",
    )
    assert message.startswith("5 problem(s)")
    for key in (
        "sampler.p",
        "batch_size (7)",
        "generation.temperature",
        "aggregation",
        "validation.monitor",
    ):
        assert key in message


def test_unknown_sampler_argument_is_named() -> None:
    message = _problems("+sampler.prob=0.3")
    assert "unknown argument 'prob'" in message


def test_the_readme_sweep_composes_for_every_sampler() -> None:
    for sampler in ("word", "token", "sentence"):
        for p in ("0.25", "0.5", "0.75"):
            validate_train_config(train_config(f"sampler={sampler}", f"sampler.p={p}"))


@pytest.mark.parametrize("trainer", ["gpu", "ddp", "fsdp"])
def test_paper_scale_configs_compose(trainer: str, hub_online: None) -> None:
    cfg = train_config("model=qwen3_4b", "data=deepscaler", f"trainer={trainer}", "experiment=trl")
    validate_train_config(cfg, world_size=2 if trainer != "gpu" else 1)
    assert cfg.model.name_or_path == "Qwen/Qwen3-4B-Instruct-2507"
    assert cfg.data.holdout > 0


def test_rollout_backend_is_checked_before_anything_loads() -> None:
    validate_train_config(train_config("module.backend.name=vllm", "+module.backend.sync_every=2"))
    problems = _problems("module.backend.name=sglang")
    assert "module.backend.name" in problems and "vllm" in problems
    problems = _problems("+module.backend.sync_evry=2")
    assert "sync_evry" in problems
