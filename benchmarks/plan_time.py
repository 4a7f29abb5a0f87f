"""The time plan measured: ``tandem.plan.time``'s seconds per phase against real training steps.

Run: ``python benchmarks/plan_time.py [--steps 3] [--sizes tiny=16x64,...] [overrides]``.

Each model (the tiny world's; the Qwen3-shaped random model with Qwen3's 151,936-wide vocabulary
that ``benchmarks/plan_memory.py`` builds) trains ``--steps`` Tandem RL steps on the CPU through
``tandem.train.run`` at each size ``rows x response tokens`` (``batch_size x
generation.max_new_tokens``), one torch thread, each run in a fresh process. Every row runs to
its full length (no EOS) and the old log-probs come from the trainer's own pass, so that every
phase the plan knows runs.

What is measured, per phase and step: this process's CPU seconds inside it (what the load of
other processes on a shared machine does not add; its wall seconds beside them). Phases:
``rollout`` (``TandemGRPO.rollout``), ``old_logprobs`` (``TandemGRPO.old_and_ref``), ``update``
(every micro-batch's ``accumulate``: forward, loss, backward) and ``step`` (every
``optimizer_step``: clipping, AdamW, freeing the gradients). The first step (which builds the
engine and AdamW's state) is left out; each phase's median over the others is kept.

What it is compared with: the plan's seconds of each phase on this CPU as ``probe_cpu``
measures it in the same process just before the run (``planned``: the config's plan, every
prompt at the cap; ``at_shape``: the same formulas at the shapes the run had, the mean prompt
length and every micro-batch as it was packed). Target: ``at_shape / measured`` within
0.65-1.35 for every phase and size.

Prints one JSON object: the probe's figures, per model and size the measured and predicted
seconds per phase with their ratio and the plan's terms, and the worst ratio over all.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONF = str(ROOT / "conf")
# rows x response tokens, as benchmarks/plan_memory.py runs them
SIZES = {"tiny": ((16, 64), (32, 160), (64, 384)), "qwen151k": ((8, 64), (16, 128), (32, 256))}
PROMPT_CAP = 80
PHASES = {
    "rollout": ("TandemGRPO", "rollout"),
    "old_logprobs": ("TandemGRPO", "old_and_ref"),
    "update": ("module", "accumulate"),
    "step": ("TandemGRPO", "optimizer_step"),
}
TOLERANCE = 0.35


def timed(owner: Any, name: str, phase: str, calls: list[dict], shape: Any = None) -> None:
    """Wrap ``owner.name`` so that each call appends ``{phase, cpu, wall}`` (seconds) to
    ``calls``; ``shape(args, result)`` adds what the call's shapes were (after the clock)."""
    real = getattr(owner, name)

    def measured(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        result = real(*args, **kwargs)
        record = {"phase": phase, "cpu": time.process_time() - cpu}
        record["wall"] = time.perf_counter() - wall
        calls.append({**record, **(shape(args, result) if shape else {})})
        return result

    setattr(owner, name, measured)


def worker(model: str, rows: int, tokens: int, steps: int, out: Path, extra: list[str]) -> None:
    """One training run in this process, then the plan's prediction; writes ``result.json``."""
    import torch
    from hydra import compose, initialize_config_dir

    import tandem.modules.grpo as grpo
    import tandem.modules.logprobs as logprobs
    import tandem.train
    from tandem.plan.probe import probe_cpu

    torch.set_num_threads(1)
    device = probe_cpu(1)
    calls: list[dict] = []

    def rollout_shape(args: Any, result: Any) -> dict:
        return {"prompt": float(result.prompt_lengths.float().mean())}

    def pack_shape(args: Any, result: Any) -> dict:
        batch, parts = args[1], args[3]
        share = logprobs.lays_out_rows(args[0])
        packs = []
        for rows_, _ in parts:
            mask = batch.mask[rows_]
            packed = logprobs.pack(batch.ids[rows_], mask, batch.start, share)
            lengths = mask.sum(1).tolist()
            packs.append(
                {
                    "rows": len(lengths),
                    "read": packed.tokens,
                    "slots": sum(lengths),
                    "pairs": sum(n * (n + 1) / 2 for n in lengths),
                    "head": int(mask[:, batch.start :].sum()),
                }
            )
        return {"packs": packs}

    for phase, (owner, name) in PHASES.items():
        target = grpo if owner == "module" else grpo.TandemGRPO
        shape = {"rollout": rollout_shape, "update": pack_shape}.get(phase)
        timed(target, name, phase, calls, shape)
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("train", overrides=_overrides(model, rows, tokens, steps, out, extra))
    tandem.train.run(cfg)
    result = _compare(cfg, calls, device)
    (out / "result.json").write_text(json.dumps(result))


def _overrides(model: str, rows: int, tokens: int, steps: int, out: Path, extra: list[str]):
    return [
        f"model.name_or_path={model}",
        f"output_dir={out / 'run'}",
        f"trainer.max_steps={steps}",
        "+data.sizes={train:256,validation:8}",
        f"batch_size={rows}",
        "group_size=4",
        f"generation.max_new_tokens={tokens}",
        # every row to its full length: the plan's rows are at their longest
        "++generation.eos_token_ids=[]",
        f"data.max_prompt_tokens={PROMPT_CAP}",
        "module.old_logprobs=trainer",
        "validation.every_n_steps=100000",
        "validation.at_start_and_end=false",
        "module.max_tokens_per_micro_batch=1024",
        "checkpoint_every_n_steps=100000",
        "logger=csv",
        "trainer.enable_progress_bar=false",
        "threads=1",
        *extra,
    ]


def _compare(cfg: Any, calls: list[dict], device: Any) -> dict:
    """Per phase: the median CPU seconds a step after the first, and the plan's."""
    from tandem.plan import make_plan
    from tandem.plan.time import make_time_plan, plan_time
    from tandem.plan.time_settings import TimeSettings
    from tandem.plan.time_trainer import Pack

    step = 0
    for call in calls:
        if call["phase"] == "rollout":
            step += 1
        call["step"] = step
    later = [c for c in calls if c["step"] > 1]
    measured, wall = {}, {}
    for phase in PHASES:
        mine = [c for c in later if c["phase"] == phase]
        for clock, out in (("cpu", measured), ("wall", wall)):
            per_step = [sum(c[clock] for c in mine if c["step"] == n) for n in range(2, step + 1)]
            out[phase] = statistics.median(per_step)
    memory = make_plan(cfg, 1, devices=(("cpu", 64 * 2**30),), fixes=False)
    planned = make_time_plan(cfg, memory, device)
    s = memory.settings
    prompt = statistics.mean(c["prompt"] for c in later if c["phase"] == "rollout")
    shaped = replace(s, prompt_tokens=round(prompt))
    t = TimeSettings.from_config(cfg, gpu=False)
    last = next(c for c in reversed(later) if c["phase"] == "update")
    packs = [Pack(**p, last=k == len(last["packs"]) - 1) for k, p in enumerate(last["packs"])]
    at_shape = plan_time(shaped, t, device, 1, None, packs=packs)
    return {
        "measured_s": measured,
        "measured_wall_s": wall,
        "planned_s": {p: planned.phase_s(p) for p in PHASES},
        "at_shape_s": {p: at_shape.phase_s(p) for p in PHASES},
        "terms": {p: at_shape.phases.get(p, {}) for p in PHASES},
        "shape": {"prompt_mean": round(prompt, 1), "packs": len(packs)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sizes", default=None, help="MODEL=ROWSxTOKENS,... (tiny, qwen151k)")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.worker:
        model, rows, tokens, out = args.worker
        return worker(model, int(rows), int(tokens), args.steps, Path(out), overrides)
    sizes: dict[str, list[tuple[int, int]]] = {k: list(v) for k, v in SIZES.items()}
    if args.sizes:
        sizes = {}
        for item in args.sizes.split(","):
            name, size = item.split("=")
            rows, tokens = size.split("x")
            sizes.setdefault(name, []).append((int(rows), int(tokens)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    report: dict[str, Any] = {"steps": args.steps, "overrides": overrides, "load_1m": []}
    report["load_1m"].append(round(os.getloadavg()[0], 2))
    worst = 1.0
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from plan_memory import build_qwen

        qwen = Path(tmp) / "qwen151k"
        build_qwen(qwen)
        paths = {"tiny": "tiny", "qwen151k": str(qwen)}
        for name, shapes in sizes.items():
            for rows, tokens in shapes:
                out = Path(tmp) / f"{name}-{rows}x{tokens}"
                out.mkdir()
                command = [sys.executable, __file__, "--steps", str(args.steps), "--worker"]
                command += [paths[name], str(rows), str(tokens), str(out), *overrides]
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"{name} {rows}x{tokens} failed:\n{done.stderr[-4000:]}")
                run = _summary(json.loads((out / "result.json").read_text()))
                report.setdefault(name, {})[f"{rows}x{tokens}"] = run
                for phase in run["phases"].values():
                    ratio = phase["at_shape_ratio"]
                    worst = ratio if abs(ratio - 1) > abs(worst - 1) else worst
                print(json.dumps({name: {f"{rows}x{tokens}": run}}), file=sys.stderr)
    report["load_1m"].append(round(os.getloadavg()[0], 2))
    report["worst_at_shape_ratio"] = worst
    report["within_35_percent"] = abs(worst - 1) <= TOLERANCE
    print(json.dumps(report, indent=2))


def _summary(result: dict) -> dict:
    out: dict[str, Any] = {"shape": result["shape"], "phases": {}}
    for phase, measured in result["measured_s"].items():
        planned, shaped = result["planned_s"][phase], result["at_shape_s"][phase]
        out["phases"][phase] = {
            "measured_s": round(measured, 4),
            "measured_wall_s": round(result["measured_wall_s"][phase], 4),
            "planned_s": round(planned, 4),
            "at_shape_s": round(shaped, 4),
            "at_shape_ratio": round(shaped / measured, 3) if measured else None,
            "terms_s": {t: round(v, 4) for t, v in result["terms"][phase].items()},
        }
    return out


if __name__ == "__main__":
    main()
