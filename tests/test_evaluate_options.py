"""The authors' evaluation as options: the solo samples of the paper's figure or of the release
(``paper_solo``), and the handoff cap in their rounds (``handoff_rounds``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tandem.config import ConfigError
from tandem.evaluation.config import handoff_sampler, validate_eval_config

CONF = str(Path(__file__).resolve().parents[1] / "conf")
SETS = ("aime24", "aime25", "aime26", "amc23_25", "minerva")


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        overrides = [f"eval=[{','.join(SETS)}]", "output_dir=x", *overrides]
        return compose("evaluate", overrides=overrides)


def test_the_paper_sets_take_the_figures_or_the_releases_solo_samples() -> None:
    figure, release = _compose(), _compose("paper_solo=release")
    for name in SETS:
        assert figure.eval[name].n == 32 and list(figure.eval[name].ks)[-1] == 32
        assert release.eval[name].n == 8 and list(release.eval[name].ks) == [1, 2, 4, 8]
        # the handoff pass is the authors' n=8 under either choice
        assert figure.eval[name].handoff_n == release.eval[name].handoff_n == 8
    validate_eval_config(figure)
    validate_eval_config(release)
    # the tiny world's set keeps its own samples
    tiny = _compose("eval=[tiny]", "paper_solo=release")
    assert tiny.eval.tiny.n == 8 and list(tiny.eval.tiny.ks) == [1, 2, 4, 8]


def test_a_bad_sample_count_through_the_group_is_still_named() -> None:
    with pytest.raises(ConfigError, match=r"eval\.aime24\.ks .* must be a non-empty list"):
        validate_eval_config(_compose("paper_solo.n=4"))


def test_handoff_rounds_are_a_senior_and_a_junior_turn_each() -> None:
    cfg = _compose("handoff_rounds=150")
    validate_eval_config(cfg)
    c = OmegaConf.to_container(cfg, resolve=True)
    assert handoff_sampler(c)["max_rounds"] == 300
    assert handoff_sampler(OmegaConf.to_container(_compose(), resolve=True))["max_rounds"] is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["handoff_rounds=0"], r"handoff_rounds \(0\) must be a positive integer"),
        (["handoff_rounds=150", "sampler=word"], r"only the step sampler.*Set sampler=step"),
        (["handoff_rounds=150", "sampler.max_rounds=150"], r"both cap.*300 steps"),
    ],
)
def test_a_handoff_cap_that_cannot_hold_is_named(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_eval_config(_compose(*overrides))
