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


# each study's arms: the arm's experiment config, by the name it reports under
STUDIES = {
    "reproduce": {"grpo": "grpo", "trl": "trl", "kl_reg": "kl_reg"},
    "reproduce_paper": {
        "grpo": "grpo",
        "trl": "paper/trl",
        "kl_reg": "paper/kl_reg",
        "grpo_g16": "paper/grpo_g16",
        "trl_token": "paper/trl_token",
        "trl_sentence": "paper/trl_sentence",
    },
}


@pytest.mark.parametrize("name", list(STUDIES))
def test_every_job_of_the_study_validates(name: str, hub_online: None) -> None:
    jobs = sweep(study_config(name))
    arms = STUDIES[name]
    assert len(jobs) == 3 * len(arms), jobs  # every arm x 3 seeds
    assert {j[0] for j in jobs} == {f"experiment={a}" for a in arms.values()}
    for job in jobs:
        cfg = study_config(name, *job)
        validate_train_config(cfg)
        assert cfg.ckpt_path == "last", "an interrupted study must resume"
        # each job has its own folder, named by its arm and seed, the same on every restart
        seed = job[1].split("=")[1]
        assert cfg.experiment_name in arms
        assert cfg.hydra.sweep.subdir == f"{cfg.experiment_name}-seed{seed}"


@pytest.mark.parametrize("name", list(STUDIES))
def test_arms_differ_only_in_rollout_structure_and_kl(name: str) -> None:
    arms = STUDIES[name]
    configs = {a: flat(study_config(name, f"experiment={e}", "seed=0")) for a, e in arms.items()}
    allowed = {"experiment_name", "module.loss.kl_beta"}
    # the rollout-budget control differs in its group size alone (16 prompts x 16 rollouts)
    control = {"group_size", "batch_size"}
    for a, b in itertools.combinations(arms, 2):
        differ = {k for k in configs[a].keys() | configs[b].keys()}
        differ = {k for k in differ if configs[a].get(k) != configs[b].get(k)}
        ok = allowed | (control if "grpo_g16" in (a, b) else set())
        assert {k for k in differ if not k.startswith("sampler.")} <= ok, (a, b, differ)
    assert configs["trl"]["sampler.name"] == "word" and configs["trl"]["sampler.p"] == 0.5
    assert configs["grpo"]["sampler.name"] == configs["kl_reg"]["sampler.name"] == "solo"
    assert configs["kl_reg"]["module.loss.kl_beta"] > 0 == configs["grpo"]["module.loss.kl_beta"]
    # every arm validates and picks checkpoints the same way
    assert len({configs[a]["validation.monitor"] for a in arms}) == 1


def test_paper_study_carries_the_authors_recipe() -> None:
    cfg = study_config("reproduce_paper", "experiment=paper/trl", "seed=0")
    assert cfg.model.name_or_path == "Qwen/Qwen3-4B-Instruct-2507"
    # the layout the plans make fastest on 2 x 80 GB: FSDP2 over both cards, the vLLM pair on each
    assert cfg.model.junior_device is None and cfg.trainer.accelerator == "gpu"
    assert cfg.trainer.devices == 2 and cfg.trainer.strategy.offload == "between_phases"
    assert cfg.module.backend.name == "vllm" and cfg.module.backend.dtype == "bfloat16"
    assert cfg.data.path == "agentica-org/DeepScaleR-Preview-Dataset"
    assert (cfg.data.holdout, cfg.data.holdout_seed) == (1000, 0)
    assert (cfg.batch_size // cfg.group_size, cfg.group_size) == (16, 8)
    assert (cfg.module.mini_batches, cfg.module.num_iterations) == (2, 1)
    opt = cfg.module.optimizer
    assert opt._target_ == "torch.optim.AdamW" and opt.lr == 1e-6
    assert opt.weight_decay == 0.01 and list(opt.betas) == [0.9, 0.999]
    assert cfg.module.scheduler is None, "a constant lr, no warmup"
    assert cfg.generation.temperature == 0.6 and cfg.generation.top_p == 1.0
    assert cfg.generation.max_new_tokens == 3000
    assert cfg.module.logprob_temperature is None, "the loss at the rollout temperature"
    assert cfg.module.loss.clip_low == cfg.module.loss.clip_high == 0.2
    assert cfg.module.loss.aggregation == "token_mean" and cfg.module.advantage == "std"
    assert cfg.module.loss.kl_beta == 0.0
    assert cfg.prompt.instruction.startswith("Solve the following math problem step by step.")
    assert cfg.prompt.separator == " "
    assert cfg.validation.every_n_steps == 20
    assert cfg.validation.monitor == "val/tandem/accuracy"
    # the authors' word schedule, in training and in the tandem validation pass
    for sampler in (cfg.sampler, cfg.validation.sampler):
        assert (sampler.rule, sampler.boundary, sampler.max_gap_tokens) == (
            "after_boundary",
            "leading_space",
            32,
        )
    kl = study_config("reproduce_paper", "experiment=paper/kl_reg", "seed=0").module.loss
    assert (kl.kl_beta, kl.kl_estimator) == (0.001, "k3")


@pytest.mark.parametrize("world", ["tiny", "notation"])
def test_world_selects_its_base_and_its_sweep_folder(world):
    cfg = study_config("reproduce", f"world={world}")
    assert cfg.model.name_or_path == world
    assert cfg.world_name == world
    assert cfg.hydra.sweep.dir == f"multirun/{world}_world"
    validate_train_config(cfg)
    # the world changes the base alone: the same problems, sizes and arms
    other = study_config("reproduce", "world=tiny" if world == "notation" else "world=notation")
    changed = {k for k, v in flat(cfg).items() if flat(other).get(k) != v}
    assert changed == {"model.name_or_path", "world_name", "generation.max_new_tokens"}
