"""The GPU check: the tiny world sharded on GPUs, the paper's layout on them, and a paper-shaped
run whose every phase is measured against the memory (and time) plan.

Run on a GPU machine (about 5 minutes on one H200): ``python benchmarks/gpu_check.py``.

1. ``fsdp``: ``trainer=fsdp_gpu`` (FSDP2, bfloat16 compute, float32 master weights) on
   ``min(2, GPUs)`` processes, Tandem RL on the tiny world;
2. ``paper_layout_tiny``: ``trainer=paper_gpus`` on the tiny world (verl's offload between
   phases, activation checkpointing), a checkpoint every step and the export, so that saving
   and gathering offloaded shards run on a real device;
3. ``junior_on_cuda1`` and ``same_device`` (two GPUs or more): ``trainer=gpu`` with the junior on
   ``cuda:1`` (the paper's layout, the engine queueing the junior's forward while the senior's
   runs), and both on ``cuda:0``, to compare;
4. ``paper_shaped``: Qwen3-4B's shape from the shipped ``config.json`` with random weights
   (nothing downloaded; the tiny world's tokenizer and problems), the paper's recipe in the
   authors' layout (``--config-name reproduce_paper`` with ``trainer=paper_gpus``: FSDP2 on one
   process, bf16 compute, offload between phases, checkpointing, the 10,000-token packed
   update) at a reduced batch (``--paper-batch`` rows of ``--paper-tokens`` new tokens),
   ``--paper-steps`` steps with the torch engine; each phase (rollout, old log-probs, update,
   optimizer step, offload moves) timed and its peak memory on every device measured, beside
   the memory plan's figure and the time plan's (where the plan knows the GPU). Where vLLM is
   installed, the shipped layout runs the same: the vLLM pair on each process.

Prints one JSON object. Exits 1 when a run fails, 2 when there is no GPU. ``tests/
test_gpu_check.py`` runs it where a GPU is present; CI (no GPU) skips it.
"""

from __future__ import annotations

import argparse
import csv
import functools
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
QUIET = [
    "validation.every_n_steps=100000",
    "validation.at_start_and_end=false",
    "logger=csv",
    "trainer.enable_progress_bar=false",
]
TINY = [
    "+data.sizes={train:256,validation:8}",
    "batch_size=32",
    "group_size=4",
    "generation.max_new_tokens=64",
    "checkpoint_every_n_steps=100000",
    *QUIET,
]
PHASES = ("generate", "reward", "update", "step")
# the paper-shaped run's phases, in the order a step takes them
PAPER_PHASES = ("rollout", "old_logprobs", "update", "step", "offload")
MiB = 2**20


def runs(gpus: int) -> dict[str, list[str]]:
    """The tiny world's runs this machine can do, as overrides."""
    plan = {
        "fsdp": ["trainer=fsdp_gpu", f"trainer.devices={min(2, gpus)}"],
        "paper_layout_tiny": ["trainer=paper_gpus", "checkpoint_every_n_steps=1"],
    }
    if gpus >= 2:
        plan["junior_on_cuda1"] = ["trainer=gpu", "model.junior_device=cuda:1"]
        plan["same_device"] = ["trainer=gpu", "model.junior_device=cuda:0"]
    return plan


def paper_overrides(folder: str, gpus: int, rows: int, tokens: int, steps: int) -> list[str]:
    """``reproduce_paper`` at a reduced batch on this machine, in the authors' layout on the
    torch engine (the senior's one FSDP2 process on cuda:0, the junior on cuda:1 where there is
    one): the shapes and the layout kept."""
    return [
        f"model.name_or_path={folder}",
        "backend=torch",
        "trainer=paper_gpus",
        "model.junior_device=" + ("cuda:1" if gpus >= 2 else "null"),
        "data=tiny",
        "world=tiny",
        f"batch_size={rows}",
        f"generation.max_new_tokens={tokens}",
        f"trainer.max_steps={steps}",
        "checkpoint_every_n_steps=100000",
        "threads=null",
        *QUIET,
    ]


def pair_overrides(gpus: int) -> list[str]:
    """The shipped layout, where vLLM is installed: the vLLM pair on each of the processes
    (FSDP2 over two cards where there are two, one process on one)."""
    return ["backend=vllm_pair", "model.junior_device=null"] + (
        ["trainer=paper_fsdp"] if gpus >= 2 else []
    )


def build_paper_model(folder: Path) -> None:
    """Qwen3-4B's shape with random bfloat16 weights (made on the GPU, where it is quick) and
    the tiny world's tokenizer, written to ``folder``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tandem.assets import TINY_WORLD

    shape = ROOT / "tandem" / "plan" / "shapes" / "Qwen--Qwen3-4B-Instruct-2507"
    config = AutoConfig.from_pretrained(shape)
    config.eos_token_id, config.pad_token_id = 2, 0
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY_WORLD / name, folder / name)
    shutil.copy(TINY_WORLD / "generation_config.json", folder / "generation_config.json")


class PhaseMeter:
    """Times each phase of the module's training steps and the peak memory each device
    allocates in it (the peak counters reset as a phase begins), first step included."""

    def __init__(self) -> None:
        self.steps: list[dict[str, dict[str, Any]]] = []

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        import torch

        real = getattr(owner, name)

        @functools.wraps(real)
        def timed(*args: Any, **kwargs: Any) -> Any:
            devices = range(torch.cuda.device_count())
            torch.cuda.synchronize()
            for d in devices:
                torch.cuda.reset_peak_memory_stats(d)
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                torch.cuda.synchronize()
                seconds = time.perf_counter() - start
                peaks = {f"cuda:{d}": torch.cuda.max_memory_allocated(d) for d in devices}
                record = self.steps[-1].setdefault(phase, {"seconds": 0.0, "calls": 0})
                record["seconds"] += seconds
                record["calls"] += 1
                old = record.get("peak_bytes", {})
                record["peak_bytes"] = {k: max(v, old.get(k, 0)) for k, v in peaks.items()}

        setattr(owner, name, timed)

    def install(self) -> None:
        import tandem.modules.grpo as grpo

        module = grpo.TandemGRPO
        real_step = module.training_step

        def training_step(this: Any, *args: Any, **kwargs: Any) -> Any:
            self.steps.append({})
            return real_step(this, *args, **kwargs)

        module.training_step = training_step
        self.wrap(module, "rollout", "rollout")
        self.wrap(module, "old_and_ref", "old_logprobs")
        self.wrap(grpo, "accumulate", "update")
        self.wrap(module, "optimizer_step", "step")
        self.wrap(module, "place", "offload")


def compare(steps: list[dict[str, Any]], plan: Any, predicted: dict | None) -> dict[str, Any]:
    """Each phase's measured seconds and peaks (the last step's: the first warms up) against
    the plans'. The memory plan counts a CUDA runtime term the allocator does not see: it is
    taken off before the ratio."""
    last = steps[-1]
    out: dict[str, Any] = {}
    for phase in PAPER_PHASES:
        seen = last.get(phase)
        if seen is None:
            continue
        row: dict[str, Any] = {
            "seconds": round(seen["seconds"], 3),
            "seconds_first_step": round(steps[0].get(phase, {}).get("seconds", 0.0), 3),
            "measured_mib": {k: round(v / MiB) for k, v in seen["peak_bytes"].items()},
        }
        if predicted and phase in predicted:
            row["planned_seconds"] = round(predicted[phase], 3)
            row["time_ratio"] = round(predicted[phase] / max(seen["seconds"], 1e-9), 3)
        for device in plan.devices:
            terms = device.phases.get(phase)
            if not terms:
                continue
            planned = sum(v for t, v in terms.items() if t != "runtime")
            measured = seen["peak_bytes"].get(device.name, 0)
            row.setdefault("planned_mib", {})[device.name] = round(planned / MiB)
            if measured:
                row.setdefault("memory_ratio", {})[device.name] = round(planned / measured, 3)
        out[phase] = row
    return out


def planned_seconds(cfg: Any, plan: Any) -> dict[str, float] | None:
    """The time plan's seconds a phase on this machine's GPU (None where the plan does not know
    its kind), in the meter's phases: the old and reference passes are one call here."""
    from tandem.plan.devices import local_gpu
    from tandem.plan.time import make_time_plan

    device = local_gpu()
    if device is None:
        return None
    timed = make_time_plan(cfg, plan, device)
    seconds = {phase: timed.phase_s(phase) for phase in timed.phases}
    seconds["old_logprobs"] = seconds.get("old_logprobs", 0.0) + seconds.pop("ref_logprobs", 0.0)
    return seconds


def worker(out: Path, steps: int, overrides: list[str], config_name: str, paper: bool) -> None:
    """One training run; rank 0 writes ``<out>/<rank>.json`` with its devices' peaks (and, for
    the paper-shaped run, every phase against the plan)."""
    import lightning as L
    import torch
    from hydra import compose, initialize_config_dir

    import tandem.train
    from tandem.plan import make_plan

    rank = int(os.environ.get("LOCAL_RANK", 0))
    meter = PhaseMeter()
    if paper:
        meter.install()

    class Peaks(L.Callback):
        def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            peaks = {
                f"cuda:{d}": torch.cuda.max_memory_allocated(d) / MiB
                for d in range(torch.cuda.device_count())
                if torch.cuda.max_memory_allocated(d)
            }
            result: dict[str, Any] = {"peak_allocated_mib": peaks}
            if paper:
                world = trainer.world_size
                plan = make_plan(cfg, world, fixes=False)
                result["phases"] = compare(meter.steps, plan, planned_seconds(cfg, plan))
                result["plan_peak_gib"] = round(plan.peak / 2**30, 2)
                result["plan_fits"] = plan.fits
            (out / f"{rank}.json").write_text(json.dumps(result))

    def build(cfg: Any, *args: Any, **kwargs: Any):
        trainer, module, data, stop = real_build(cfg, *args, **kwargs)
        trainer.callbacks.append(Peaks())
        return trainer, module, data, stop

    real_build, tandem.train.build = tandem.train.build, build
    own = [f"output_dir={out / 'run'}"]
    if not paper:
        own.append(f"trainer.max_steps={steps}")
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name, overrides=[*overrides, *own])
    tandem.train.run(cfg)


def step_times(out: Path) -> dict[str, float]:
    """Median seconds per phase over the logged steps, the first dropped as warm-up."""
    (path,) = (out / "run").glob("csv/version_*/metrics.csv")
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("time/step")]
    rows = rows[1:] or rows
    return {k: statistics.median(float(r[f"time/{k}"]) for r in rows) for k in PHASES}


def launch(tmp: Path, name: str, args: argparse.Namespace, overrides: list[str], **how) -> dict:
    """Run one configuration in a process of its own; its result, or its error."""
    out = tmp / name
    out.mkdir()
    config_name, paper = how.get("config_name", "train"), how.get("paper", False)
    command = [sys.executable, __file__, "--steps", str(args.steps), "--worker", str(out)]
    command += ["--config-name", config_name] + (["--paper-worker"] if paper else [])
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    done = subprocess.run([*command, *overrides], env=env, capture_output=True, text=True)
    seconds = round(time.perf_counter() - start, 1)
    if done.returncode != 0:
        return {"error": done.stderr[-3000:], "wall_seconds": seconds}
    ranks = sorted(out.glob("[0-9].json"))
    result = {"wall_seconds": seconds}
    result.update({f"rank{p.stem}": json.loads(p.read_text()) for p in ranks})
    if not paper:
        result["seconds"] = step_times(out)
    return result


def paper_shaped(tmp: Path, args: argparse.Namespace, gpus: int) -> dict[str, Any]:
    """The paper-shaped run on the torch engine, then on the vLLM pair where installed."""
    folder = tmp / "qwen3_4b_random"
    start = time.perf_counter()
    build_paper_model(folder)
    built = round(time.perf_counter() - start, 1)
    base = paper_overrides(str(folder), gpus, args.paper_batch, args.paper_tokens, args.paper_steps)
    how = {"config_name": "reproduce_paper", "paper": True}
    result = {"build_seconds": built, "torch": launch(tmp, "paper_torch", args, base, **how)}
    if importlib.util.find_spec("vllm") is None:
        result["vllm"] = {"skipped": "vLLM is not installed on this machine"}
    else:
        result["vllm"] = launch(tmp, "paper_vllm", args, [*base, *pair_overrides(gpus)], **how)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="steps of the tiny world's runs")
    parser.add_argument("--paper-steps", type=int, default=2)
    parser.add_argument("--paper-batch", type=int, default=16, help="rows of the paper run")
    parser.add_argument("--paper-tokens", type=int, default=384, help="its max_new_tokens")
    parser.add_argument("--only", default=None, help="comma-separated runs to do (default: all)")
    parser.add_argument("--worker", metavar="OUT")
    parser.add_argument("--config-name", default="train")
    parser.add_argument("--paper-worker", action="store_true")
    args, overrides = parser.parse_known_args()
    if args.worker:
        return worker(Path(args.worker), args.steps, overrides, args.config_name, args.paper_worker)
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        print(json.dumps({"error": "no GPU: this check needs one (CUDA)"}))
        sys.exit(2)
    result: dict = {"gpus": gpus, "device": torch.cuda.get_device_name(0), "steps": args.steps}
    only = None if args.only is None else set(args.only.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        for name, run_overrides in runs(gpus).items():
            if only is None or name in only:
                tiny = [*TINY, *run_overrides, *overrides]
                result[name] = launch(Path(tmp), name, args, tiny)
                print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)
        if only is None or "paper_shaped" in only:
            result["paper_shaped"] = paper_shaped(Path(tmp), args, gpus)
    print(json.dumps(result, indent=2))
    sys.exit(1 if failed(result) else 0)


def failed(result: Any) -> bool:
    """Whether any run of the result holds an ``error``."""
    if isinstance(result, dict):
        return "error" in result or any(failed(v) for v in result.values())
    return False


if __name__ == "__main__":
    main()
