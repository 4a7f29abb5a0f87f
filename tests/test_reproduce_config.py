"""The study's sweeps: the tiny world's and the paper's compose, validate and differ only where
the arms are meant to differ."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tandem.config import validate_train_config

CONF = str(Path(__file__).resolve().parents[1] / "conf")
ARMS = ("grpo", "trl", "kl_reg")


def study_config(name: str, *overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides), return_hydra_config=True)


def sweep(cfg) -> list[tuple[str, ...]]:
    """The jobs of the config's own sweep: one override tuple per job."""
    params = cfg.hydra.sweeper.params
    axes = [[f"{k}={v}" for v in str(values).split(",")] for k, values in params.items()]
    return list(itertools.product(*axes))


def flat(cfg) -> dict[str, object]:
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra", None)
    out: dict[str, object] = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = node

    walk(container, "")
    return out


@pytest.mark.parametrize("name", ["reproduce", "reproduce_paper"])
def test_every_job_of_the_study_validates(name: str, hub_online: None) -> None:
    jobs = sweep(study_config(name))
    assert len(jobs) == 9, jobs  # 3 arms x 3 seeds
    assert {j[0] for j in jobs} == {f"experiment={a}" for a in ARMS}
    for job in jobs:
        cfg = study_config(name, *job)
        validate_train_config(cfg)
        assert cfg.ckpt_path == "last", "an interrupted study must resume"
        # each job has its own folder, named by its overrides, the same on every restart
        arm, seed = (o.split("=")[1] for o in job)
        assert cfg.hydra.sweep.subdir == f"{arm}-seed{seed}"


@pytest.mark.parametrize("name", ["reproduce", "reproduce_paper"])
def test_arms_differ_only_in_rollout_structure_and_kl(name: str) -> None:
    configs = {arm: flat(study_config(name, f"experiment={arm}", "seed=0")) for arm in ARMS}
    allowed = {"experiment_name", "module.loss.kl_beta"}
    for a, b in itertools.combinations(ARMS, 2):
        differ = {k for k in configs[a].keys() | configs[b].keys()}
        differ = {k for k in differ if configs[a].get(k) != configs[b].get(k)}
        assert {k for k in differ if not k.startswith("sampler.")} <= allowed, (a, b, differ)
    assert configs["trl"]["sampler.name"] == "word" and configs["trl"]["sampler.p"] == 0.5
    assert configs["grpo"]["sampler.name"] == configs["kl_reg"]["sampler.name"] == "solo"
    assert configs["kl_reg"]["module.loss.kl_beta"] > 0 == configs["grpo"]["module.loss.kl_beta"]
    # every arm validates and picks checkpoints the same way
    assert len({configs[a]["validation.monitor"] for a in ARMS}) == 1


def test_paper_study_carries_the_paper_recipe() -> None:
    cfg = study_config("reproduce_paper", "experiment=trl", "seed=0")
    assert cfg.model.name_or_path == "Qwen/Qwen3-4B-Instruct-2507"
    assert cfg.model.junior_device == "cuda:1" and cfg.trainer.accelerator == "gpu"
    assert cfg.data.path == "agentica-org/DeepScaleR-Preview-Dataset"
    assert (cfg.batch_size // cfg.group_size, cfg.group_size) == (16, 8)
    assert cfg.module.lr == 1e-6 and cfg.generation.temperature == 0.6
    assert cfg.generation.max_new_tokens == 3000
    assert cfg.module.loss.clip_low == cfg.module.loss.clip_high == 0.2
    assert cfg.validation.monitor == "val/tandem/accuracy"
