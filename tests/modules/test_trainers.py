"""Every shipped trainer config trains on this CPU, on the tiny world and on a model with
Qwen3's 151,936-wide vocabulary: 2 steps each, with device overrides only (the accelerator, and
2 processes for the multi-process strategies), the strategy's own settings kept (offload,
activation checkpointing, rollout gather, mixed precision). Where a strategy offers activation
checkpointing, the run with it flipped gives the same gradient norms (within 1e-6 relative) and
the same senior: the recomputation in backward reads the packed update's rows attention as the
forward did.

The runs are grouped by process count into two launches (one process, two processes with gloo),
each running its configs one after another in the same processes, so that the imports are paid
twice, not once a config.
"""

from __future__ import annotations

import csv
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import load_file

from tests.modules.test_train import TINY

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
TRAINERS = sorted(p.stem for p in (CONF / "trainer").glob("*.yaml"))
STEPS = 2
MULTI = ("ddp", "FSDP2Strategy")


def trainer_spec(name: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", [f"trainer={name}"])
    return OmegaConf.to_container(cfg.trainer, resolve=True)


def on_cpu(name: str) -> tuple[list[str], int]:
    """The overrides that put trainer ``name`` on this CPU, and its processes: the accelerator,
    and two processes for a multi-process strategy (``devices: auto`` on GPUs); nothing else."""
    spec = trainer_spec(name)
    strategy = spec.get("strategy")
    target = strategy.get("_target_", "") if isinstance(strategy, dict) else str(strategy)
    multi = any(m in target for m in MULTI)
    devices = spec.get("devices", 1)
    processes = 2 if multi and (devices == "auto" or int(devices) > 1) else 1
    return [f"trainer={name}", "trainer.accelerator=cpu", f"trainer.devices={processes}"], processes


def checkpointing(name: str) -> bool | None:
    """The file's activation_checkpointing, or None where its strategy has no such key."""
    strategy = trainer_spec(name).get("strategy")
    if not isinstance(strategy, dict) or "activation_checkpointing" not in strategy:
        return None
    return bool(strategy["activation_checkpointing"])


def build_qwen151k(folder: Path) -> str:
    """A random Qwen3 with the real vocabulary and a small body, beside the tiny tokenizer."""
    import shutil

    from tandem.assets import TINY_WORLD
    from tests.modules.test_update import qwen151k

    model = qwen151k()
    model.config.eos_token_id, model.config.pad_token_id = 2, 0
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY_WORLD / name, folder / name)
    shutil.copy(TINY_WORLD / "generation_config.json", folder / "generation_config.json")
    return str(folder)


def _worker(rank: int, world: int, port: int, jobs: list[tuple[str, list[str]]], root: str) -> None:
    """Run each job's config in this process, rank ``rank`` of ``world`` (an external launch:
    Lightning starts no processes of its own and keeps the process group between fits)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
        OMP_WAIT_POLICY="PASSIVE",
    )
    import json

    import lightning as L

    import tandem.train

    class Moves(L.Callback):
        """Where each training step left an offloading strategy's moves (``place``)."""

        def __init__(self, out: Path) -> None:
            self.out, self.steps = out, []

        def on_train_batch_end(self, trainer, *args) -> None:
            moves = getattr(trainer.strategy, "moves", None)
            if moves is not None and trainer.global_rank == 0:
                self.steps.append(list(moves))
                (self.out / "moves.json").write_text(json.dumps(self.steps))

    def build(cfg, *args, **kwargs):
        trainer, module, data, stop = real_build(cfg, *args, **kwargs)
        trainer.callbacks.append(Moves(Path(cfg.output_dir)))
        return trainer, module, data, stop

    real_build, tandem.train.build = tandem.train.build, build
    for name, overrides in jobs:
        out = Path(root) / name
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(
                "train",
                [
                    *TINY,
                    f"output_dir={out}",
                    f"run_name={name}",
                    f"trainer.max_steps={STEPS}",
                    "validation.at_start_and_end=false",
                    "validation.every_n_steps=100",
                    "threads=1",
                    *overrides,
                ],
            )
        tandem.train.run(cfg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jobs(models: dict[str, str]) -> dict[int, list[tuple[str, list[str]]]]:
    """Every (trainer, model) run, and its flipped-checkpointing twin, by process count."""
    out: dict[int, list[tuple[str, list[str]]]] = {1: [], 2: []}
    for trainer in TRAINERS:
        overrides, processes = on_cpu(trainer)
        for model, path in models.items():
            model_keys = [f"model.name_or_path={path}"]
            out[processes].append((f"{trainer}-{model}", [*overrides, *model_keys]))
            flag = checkpointing(trainer)
            if flag is not None:
                flip = f"trainer.strategy.activation_checkpointing={str(not flag).lower()}"
                out[processes].append((f"{trainer}-{model}-flip", [*overrides, *model_keys, flip]))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trainers")
    models = {"tiny": "tiny", "qwen151k": build_qwen151k(root / "qwen151k")}
    for world, todo in jobs(models).items():
        if todo:
            args = (world, free_port(), todo, str(root))
            mp.spawn(_worker, args=args, nprocs=world, join=True)
    return root


def rows(out: Path) -> list[dict[str, str]]:
    (path,) = out.glob("csv/version_*/metrics.csv")
    with path.open() as f:
        return [r for r in csv.DictReader(f) if r.get("train/reward")]


@pytest.mark.parametrize("model", ["tiny", "qwen151k"])
@pytest.mark.parametrize("trainer", TRAINERS)
def test_every_trainer_config_trains_on_this_cpu(runs: Path, trainer: str, model: str) -> None:
    out = runs / f"{trainer}-{model}"
    steps = rows(out)
    assert len(steps) == STEPS
    norms = [float(r["train/grad_norm"]) for r in steps]
    assert all(n > 0 for n in norms), norms
    base = load_file(str(runs / "qwen151k" / "model.safetensors")) if model != "tiny" else None
    if base is None:
        from tandem.assets import TINY_WORLD

        base = load_file(str(TINY_WORLD / "model.safetensors"))
    trained = load_file(str(out / "senior" / "model.safetensors"))
    assert trained.keys() == base.keys()
    assert any(not torch.equal(trained[k], base[k].to(trained[k].dtype)) for k in base)
    if checkpointing(trainer) is None:
        return
    twin = runs / f"{trainer}-{model}-flip"
    # recomputed activations: the same gradient at every step, so the same senior
    flipped = [float(r["train/grad_norm"]) for r in rows(twin)]
    assert flipped == pytest.approx(norms, rel=1e-6)
    again = load_file(str(twin / "senior" / "model.safetensors"))
    for key in trained:
        torch.testing.assert_close(again[key], trained[key], rtol=1e-6, atol=1e-8, msg=key)


@pytest.mark.parametrize("model", ["tiny", "qwen151k"])
def test_the_paper_layout_moves_shards_and_optimizer_state_between_phases(
    runs: Path, model: str
) -> None:
    import json

    steps = json.loads((runs / f"paper_gpus-{model}" / "moves.json").read_text())
    assert len(steps) == STEPS
    # the first step: the (empty) optimizer state joins the shards on the device for the
    # update, which leaves both on the host
    first = [("optimizer_state", "device"), ("shards", "host"), ("optimizer_state", "host")]
    assert [tuple(m) for m in steps[0]] == first
    # then every step: the shards for the rollout (the torch engine reads them), the optimizer
    # state for the update and its steps, both back to the host once it is done
    later = steps[1][len(steps[0]) :]
    assert [tuple(m) for m in later] == [
        ("shards", "device"),
        ("optimizer_state", "device"),
        ("shards", "host"),
        ("optimizer_state", "host"),
    ]


def test_every_multi_process_strategy_runs_two_processes() -> None:
    processes = {name: on_cpu(name)[1] for name in TRAINERS}
    assert processes["ddp"] == processes["fsdp"] == processes["fsdp_gpu"] == 2
    assert processes["paper_fsdp"] == 2
    assert processes["cpu"] == processes["gpu"] == processes["paper_gpus"] == 1
    # the paper's layout keeps its own settings on the CPU: verl's offload and checkpointing
    strategy = trainer_spec("paper_gpus")["strategy"]
    assert strategy["offload"] == "between_phases" and strategy["activation_checkpointing"]
