"""Peak resident memory per process: ``trainer=ddp`` against ``trainer=fsdp``, the same steps.

Run: ``python benchmarks/memory.py [--steps 3] [--fsdp OVERRIDE ...] [hydra overrides]``.

A Qwen3-shaped model of about 100M parameters with random weights (the tiny world's tokenizer,
so its data and reward serve) is written to a temporary folder; each strategy then trains it
as senior (the junior is the same checkpoint, frozen, whole on every process) for ``--steps``
Tandem RL steps on 2 CPU processes. Each process records its peak resident set size
(``ru_maxrss``) when training ends and again when the process exits (after the export, which
gathers the whole senior on rank 0). Prints one JSON object: per strategy and rank, the peaks in
MiB, the resident size right after imports, and the highest inside any rollout and any update
(``phase_peak_mib``); and the fsdp/ddp ratio of training peaks.
Overrides reach both runs; ``--fsdp`` ones only the fsdp run, for the keys of its strategy that
ddp lacks (``--fsdp trainer.strategy.rollout_gather=per_layer``: each decoder layer gathered for
its forward in rollouts, instead of the whole senior once per rollout).

The target is fsdp at most 0.65x ddp per process: the senior's parameters, gradients and AdamW
state (16 bytes a parameter in float32) are split in two, while the junior, the imports and the
rollouts are not.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
STRATEGIES = ("ddp", "fsdp")
# Qwen3's shape (grouped-query attention, head_dim apart from hidden/heads), scaled to ~100M
SHAPE = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 64,
}


# the highest resident size of the phases already measured (``phase_peaks`` resets the kernel's)
_EARLIER_PEAK = [0.0]


def rss_mib() -> float:
    """This process's peak resident set size so far, in MiB (Linux reports KiB)."""
    now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return max(_EARLIER_PEAK[0], now)


def phase_peaks(cls: type, names: tuple[str, ...], peaks: dict[str, float]) -> None:
    """Wrap ``cls``'s methods ``names`` to record in ``peaks`` the highest resident size inside
    any one call of each: the kernel's peak is reset on entry (``/proc/self/clear_refs``, which
    ``ru_maxrss`` follows too, so ``rss_mib`` keeps the earlier peak aside). A kernel that does
    not allow it records nothing."""
    for name in names:
        real = getattr(cls, name)

        def measured(self, *args, _real=real, _name=name, **kwargs):
            _EARLIER_PEAK[0] = rss_mib()
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                return _real(self, *args, **kwargs)
            try:
                return _real(self, *args, **kwargs)
            finally:
                inside = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                peaks[_name] = max(peaks.get(_name, 0.0), inside)

        setattr(cls, name, measured)


def current_rss_mib() -> float:
    """This process's resident set size now, in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def build_model(folder: Path) -> int:
    """Write the random ~100M-parameter model and the tiny world's tokenizer; returns its size."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tandem.assets import TINY_WORLD

    config = AutoConfig.from_pretrained(TINY_WORLD)
    for key, value in SHAPE.items():
        setattr(config, key, value)
    config.layer_types = ["full_attention"] * SHAPE["num_hidden_layers"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY_WORLD / name, folder / name)
    shutil.copy(TINY_WORLD / "generation_config.json", folder / "generation_config.json")
    return sum(p.numel() for p in model.parameters())


def worker(strategy: str, model: str, out: Path, steps: int, overrides: list[str]) -> None:
    """One training run (this process is rank 0; Lightning starts rank 1 as this same command).
    Every rank writes ``<out>/<rank>.json`` with its peaks."""
    import lightning as L
    from hydra import compose, initialize_config_dir

    import tandem.train
    from tandem.modules.grpo import TandemGRPO

    rank = int(os.environ.get("LOCAL_RANK", 0))
    # what torch, transformers and Lightning cost before any model: the same for both
    record: dict = {"after_imports_mib": current_rss_mib()}
    # where the peak is: a rollout (generation), or an update (log-probs, backward, AdamW)
    peaks: dict[str, float] = {}
    phase_peaks(TandemGRPO, ("rollout", "update"), peaks)

    def write() -> None:
        record["process_peak_mib"] = rss_mib()
        record["phase_peak_mib"] = peaks
        (out / f"{rank}.json").write_text(json.dumps(record))

    atexit.register(write)

    class TrainingPeak(L.Callback):
        def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            record["training_peak_mib"] = rss_mib()

    def build(cfg):
        trainer, module, data, stop = real_build(cfg)
        trainer.callbacks.append(TrainingPeak())
        return trainer, module, data, stop

    real_build, tandem.train.build = tandem.train.build, build
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[
                f"trainer={strategy}",
                f"model.name_or_path={model}",
                f"output_dir={out / 'run'}",
                f"trainer.max_steps={steps}",
                "+data.sizes={train:64,validation:8}",
                "batch_size=8",
                "group_size=4",
                "generation.max_new_tokens=24",
                "validation.every_n_steps=100000",
                "validation.at_start_and_end=false",
                "checkpoint_every_n_steps=100000",
                "logger=csv",
                "trainer.enable_progress_bar=false",
                "threads=1",
                *overrides,
            ],
        )
    tandem.train.run(cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fsdp", action="append", default=[], metavar="OVERRIDE")
    parser.add_argument("--worker", nargs=3, metavar=("STRATEGY", "MODEL", "OUT"))
    args, overrides = parser.parse_known_args()
    if args.worker:
        strategy, model, out = args.worker
        return worker(strategy, model, Path(out), args.steps, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        params = build_model(model)
        result: dict = {"parameters": params, "steps": args.steps, "processes": 2}
        result["fsdp_overrides"] = args.fsdp
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
        for strategy in STRATEGIES:
            out = Path(tmp) / strategy
            out.mkdir()
            command = [sys.executable, __file__, "--steps", str(args.steps), "--worker"]
            command += [strategy, str(model), str(out), *overrides]
            if strategy == "fsdp":
                command += args.fsdp
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"{strategy} run failed:\n{done.stderr[-3000:]}")
            result[strategy] = {
                f"rank{r}": json.loads((out / f"{r}.json").read_text()) for r in range(2)
            }
        result["fsdp_over_ddp"] = {
            f"rank{r}": round(
                result["fsdp"][f"rank{r}"]["training_peak_mib"]
                / result["ddp"][f"rank{r}"]["training_peak_mib"],
                3,
            )
            for r in range(2)
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
