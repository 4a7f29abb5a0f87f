"""Step time of the trl arm against the grpo arm, split into phases.

Run: ``python benchmarks/train_step.py [--quick] [hydra overrides]``.

Both arms run the same config on the tiny world (batch, group, lengths, learning rate); only the
rollout structure differs (word sampler at p=0.5 vs solo). Each arm trains ``--steps`` steps in
its own folder; the first step is dropped as warm-up and the rest averaged from the logged
``time/*`` values. Prints one JSON object with per-phase seconds and the trl/grpo ratio.

``--peer-prompts FILE.jsonl`` writes instead the prompts the grpo arm draws in its ``--steps``
steps, chat formatted, as ``{"prompt", "answer"}`` lines: the problems of the peer benchmark of
TRL's GRPOTrainer (``shared/peers/trl_grpo_step.py --problems``), which then trains on the same
prompts (one epoch of them, in its own order) with the same model.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from tandem.data.prompts import format_prompt
from tandem.train import build, run

CONF = str(Path(__file__).resolve().parents[1] / "conf")
PHASES = ("generate", "reward", "update", "step")


def arm_config(experiment: str, steps: int, out: Path, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(
            "train",
            overrides=[
                f"experiment={experiment}",
                f"output_dir={out}",
                f"trainer.max_steps={steps}",
                "logger=csv",
                "trainer.enable_progress_bar=false",
                "validation.every_n_steps=100000",
                "validation.at_start_and_end=false",
                *overrides,
            ],
        )


def arm_times(experiment: str, steps: int, out: Path, overrides: list[str]) -> dict[str, float]:
    run(arm_config(experiment, steps, out, overrides))
    (path,) = out.glob("csv/version_*/metrics.csv")
    rows = [r for r in csv.DictReader(path.open()) if r.get("time/step")][1:]
    out_times = {p: statistics.mean(float(r[f"time/{p}"]) for r in rows) for p in PHASES}
    out_times["senior_share"] = statistics.mean(float(r["train/senior_share"]) for r in rows)
    out_times["response_length"] = statistics.mean(float(r["train/response_length"]) for r in rows)
    return out_times


def write_peer_prompts(path: Path, steps: int, overrides: list[str]) -> int:
    """The grpo arm's prompts of its first ``steps`` steps as JSONL; returns how many."""
    with tempfile.TemporaryDirectory() as tmp:
        _, _, data, _ = build(arm_config("grpo", steps, Path(tmp), overrides))
        data.setup()
        batches = iter(data.train_dataloader())
        lines = [
            json.dumps(
                {
                    "prompt": format_prompt(data.tokenizer, p, b.instruction, b.separator),
                    "answer": a,
                }
            )
            for b in (next(batches) for _ in range(steps))
            for p, a in zip(b.problems, b.answers, strict=True)
        ]
    path.write_text("".join(line + "\n" for line in lines))
    return len(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="3 steps of a smaller batch")
    parser.add_argument(
        "--peer-prompts", type=Path, metavar="FILE", help="write the peer benchmark's prompts"
    )
    parser.add_argument(
        "--arms", default="grpo,trl", help="the arms to time (grpo alone for the peer benchmark)"
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for both arms")
    args = parser.parse_args()
    overrides = list(args.overrides)
    steps = args.steps
    if args.quick:
        steps, overrides = 3, ["batch_size=16", "group_size=4", *overrides]
    if args.peer_prompts:
        count = write_peer_prompts(args.peer_prompts, steps, overrides)
        print(json.dumps({"peer_prompts": str(args.peer_prompts), "prompts": count}))
        return
    torch.set_num_threads(torch.get_num_threads())
    result: dict[str, object] = {"steps_averaged": steps - 1, "overrides": overrides}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in args.arms.split(","):
            result[arm] = arm_times(arm, steps, Path(tmp) / arm, overrides)
    if "trl" in result and "grpo" in result:
        trl, grpo = result["trl"], result["grpo"]
        result["trl_vs_grpo"] = {p: trl[p] / grpo[p] for p in ("generate", "update", "step")}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
