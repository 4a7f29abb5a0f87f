"""The pair check of a junior with a tokenizer of its own (``tandem.config.check_pair`` and the
evaluation's): what needs one vocabulary is refused, each by its key, before any model loads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import transformers
from cross_tokenizers import trailing_space_tokenizer
from hydra import compose, initialize_config_dir

from tandem.assets import TINY_WORLD
from tandem.config import ConfigError, validate_train_config
from tandem.evaluation.config import validate_eval_config

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def compose_config(name: str, *overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any model load fails the test: the checks read tokenizers only."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded during the config check")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def problems(name: str, *overrides: str) -> str:
    check = validate_train_config if name == "train" else validate_eval_config
    with pytest.raises(ConfigError) as err:
        check(compose_config(name, *overrides))
    return str(err.value)


def test_the_cross_pair_config_validates(no_model_loads) -> None:
    cfg = compose_config("train", "model=tiny_cross")
    assert cfg.model.junior_name_or_path == "tiny-bpe-small"
    validate_train_config(cfg)
    validate_eval_config(
        compose_config("evaluate", "junior=tiny-bpe-small", "sampler=word", "output_dir=x")
    )


def test_what_needs_one_vocabulary_is_refused_by_its_key(no_model_loads) -> None:
    msg = problems(
        "train",
        "model=tiny_cross",
        "sampler=token",
        "module.loss.kl_beta=0.1",
        "+module.backend={name:vllm}",
    )
    # every sampler writes across vocabularies: the schedule is not what is refused
    assert "sampler.name" not in msg
    assert "module.loss.kl_beta (0.1)" in msg and "kl_beta=0" in msg
    assert "module.backend.name ('vllm')" in msg
    msg = problems(
        "train", "model=tiny_cross", "trainer=fsdp", "trainer.strategy.rollout_gather=per_layer"
    )
    assert "trainer.strategy.rollout_gather ('per_layer')" in msg and "=whole" in msg


def test_every_schedule_is_taken_with_a_junior_of_another_vocabulary(no_model_loads) -> None:
    for sampler in ("token", "sentence", "step", "word_authors"):
        validate_train_config(compose_config("train", "model=tiny_cross", f"sampler={sampler}"))
    # the evaluation's default handoff schedule (reasoning steps) included
    validate_eval_config(compose_config("evaluate", "junior=tiny-bpe-small", "output_dir=x"))


def test_the_same_junior_config_is_not_touched(no_model_loads) -> None:
    validate_train_config(compose_config("train", "sampler=token", "module.loss.kl_beta=0.1"))


def _trailing_space_model(folder: Path) -> Path:
    """A model folder whose tokenizer's words carry the space after them: it cannot cut text
    before a space."""
    trailing_space_tokenizer().save_pretrained(folder)
    shutil.copy(TINY_WORLD / "config.json", folder / "config.json")
    return folder


def test_a_pair_that_cannot_agree_on_boundaries_is_refused_before_models_load(
    tmp_path: Path, no_model_loads
) -> None:
    folder = _trailing_space_model(tmp_path / "sp")
    msg = problems("train", f"model.junior_name_or_path={folder}")
    assert "model.junior_name_or_path" in msg
    assert "pre-tokenizer does not split before a space" in msg
    assert "model.name_or_path" not in msg, "the senior's tokenizer is fine"
