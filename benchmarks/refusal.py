"""How long a refused start takes, and how long a command lingers after its last line:
``python benchmarks/refusal.py [--repeat N]``.

Prints one JSON object. For each case of issue 35 (every bad input it names, each a config
error or a refusal that needs more than the config), the command's exit statuses, whether any
start printed a traceback or left a folder (or a start record) behind, the median, min and max
wall time over ``--repeat`` starts, its bound and whether the slowest start met it, and the most
seconds between the command's last line and its exit; then the same exit figure for a short
training run that finishes and for one a SIGTERM stops. The bounds: a config error (any key,
``+`` keys and component arguments included) under 1 s, a refusal that reads more than the
config (model folders, data files, a resume's checkpoint, a held folder) under 3 s, and every
exit within 1 s of the last line. The machine's load average is printed beside them.

What this file leaves out: correctness (``tests/test_train_config.py``, ``tests/runs/``,
``tests/test_plan.py`` check each message).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tandem" / "assets" / "tiny"
CONFIG, LATE, EXIT = 1.0, 3.0, 1.0
# a run small enough to make a resumable folder in seconds
SMALL = [
    "+data.sizes={train:64,validation:8}",
    "batch_size=16",
    "validation.size=8",
    "logger=csv",
    "trainer.max_steps=1",
    "checkpoint_every_n_steps=1",
    "trainer.enable_progress_bar=false",
]
HOLD = """
import sys, time
from tandem.runs.lock import RunLock
with RunLock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def cases(tmp: Path) -> dict[str, tuple[str, list[str], float]]:
    """name -> (command, arguments, bound in seconds); ``tmp`` holds the files they read."""
    d = tmp / "data"
    hf = ["data=deepscaler", "data.path=json", "data.root=null"]
    m = tmp / "models"
    return {
        # config errors: the config alone shows them
        "typo (Hydra)": ("train", ["sampler.pp=0.3"], CONFIG),
        "+ key of a component": ("train", ["+sampler.pp=0.3"], CONFIG),
        "+ key of generation": ("train", ["+generation.temprature=0.5"], CONFIG),
        "+ key of the optimizer": ("train", ["+module.optimizer.lrr=1"], CONFIG),
        "+ key of the trainer": ("train", ["+trainer.max_stesp=3"], CONFIG),
        "unknown sampler": ("train", ["sampler.name=wrod"], CONFIG),
        "a word for a key (junior=)": ("train", [f"junior={TINY}"], CONFIG),
        "range": ("train", ["generation.temperature=-1"], CONFIG),
        "greedy (temperature 0)": ("train", ["generation.temperature=0"], CONFIG),
        "greedy (top_k 1)": ("train", ["generation.top_k=1"], CONFIG),
        "senior never writes (p=0)": ("train", ["sampler.p=0"], CONFIG),
        "batch": ("train", ["batch_size=7"], CONFIG),
        "batch larger than the data": ("train", ["batch_size=100000000"], CONFIG),
        "devices=0": ("train", ["trainer.devices=0"], CONFIG),
        "own data, no validation (holdout=0)": (
            "train",
            [*hf, f"+data.data_files={d / 'rows.jsonl'}", "data.holdout=0"],
            CONFIG,
        ),
        "plan: batch_size=-4": ("plan", ["batch_size=-4"], CONFIG),
        "plan: --devices 1x0": ("plan", ["--devices", "1x0"], CONFIG),
        # refusals that read more than the config
        "a broken data line": ("train", [*hf, f"+data.data_files={d / 'broken.jsonl'}"], LATE),
        "own data of one row, holdout=1": (
            "train",
            [*hf, f"+data.data_files={d / 'one.jsonl'}", "data.holdout=1"],
            LATE,
        ),
        "empty config.json": ("train", [f"model.name_or_path={m / 'empty'}"], LATE),
        "config.json {}": ("train", [f"model.name_or_path={m / 'braces'}"], LATE),
        "ill-typed config.json": ("train", [f"model.name_or_path={m / 'typed'}"], LATE),
        "junior folder without a tokenizer": (
            "train",
            [f"model.junior_name_or_path={m / 'untokenized'}"],
            LATE,
        ),
        "held folder": ("train", [], LATE),
        "changed resume": ("train", [*SMALL, "seed=1", "ckpt_path=last"], LATE),
        "plan: --devices 2x80 trainer=gpu": ("plan", ["--devices", "2x80", "trainer=gpu"], LATE),
        "plan: --devices 3x80, the paper": (
            "plan",
            ["--config-name", "reproduce_paper", "--devices", "3x80"],
            LATE,
        ),
        "plan: missing config.json": ("plan", [f"model.name_or_path={m / 'missing'}"], LATE),
        "plan: empty config.json": ("plan", [f"model.name_or_path={m / 'empty'}"], LATE),
        "plan: config.json {}": ("plan", [f"model.name_or_path={m / 'braces'}"], LATE),
        "plan: ill-typed config.json": ("plan", [f"model.name_or_path={m / 'typed'}"], LATE),
    }


def make_inputs(tmp: Path) -> None:
    """The data files and model folders the cases read."""
    data = tmp / "data"
    data.mkdir()
    row = json.dumps({"problem": "What is 1 + 1?", "answer": "2"})
    (data / "rows.jsonl").write_text(f"{row}\n" * 8)
    (data / "broken.jsonl").write_text(f"{row}\n{row[:-3]}\n{row}\n")
    (data / "one.jsonl").write_text(f"{row}\n")
    models = tmp / "models"
    for name in ("empty", "braces", "typed", "missing", "untokenized"):
        shutil.copytree(TINY, models / name, ignore=shutil.ignore_patterns("stage1"))
    (models / "empty" / "config.json").write_text("")
    (models / "braces" / "config.json").write_text("{}")
    spec = json.loads((TINY / "config.json").read_text())
    spec["hidden_size"] = "big"
    (models / "typed" / "config.json").write_text(json.dumps(spec))
    (models / "missing" / "config.json").unlink()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (models / "untokenized" / name).unlink()


def command(kind: str, folder: Path, args: list[str]) -> list[str]:
    if kind == "plan":
        return [sys.executable, "-m", "tandem.plan", *args]
    return [sys.executable, "-m", "tandem.train", f"hydra.run.dir={folder}", *args]


def timed(cmd: list[str], stop_after: str | None = None) -> dict:
    """Run ``cmd``; its exit status, wall seconds, output, and seconds from its last line to
    its exit. ``stop_after``: send SIGTERM once a line holds this text."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.perf_counter(), line))
            if stop_after and stop_after in line and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    reader = threading.Thread(target=read)
    reader.start()
    proc.wait()
    end = time.perf_counter()
    reader.join()
    last = lines[-1][0] if lines else t0
    return {
        "rc": proc.returncode,
        "seconds": end - t0,
        "after_last_line": end - last,
        "output": "".join(line for _, line in lines),
    }


def starts(folder: Path) -> int:
    return len(list((folder / "starts").glob("start-*.yaml"))) if folder.is_dir() else 0


def bench(name: str, kind: str, args: list[str], bound: float, repeat: int, tmp: Path) -> dict:
    folder = tmp / "runs" / "".join(c if c.isalnum() else "_" for c in name)
    holder = None
    if name == "held folder":
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        assert holder.stdout.readline().strip() == "held"
    if name == "changed resume":
        made = timed(command("train", folder, SMALL))
        assert made["rc"] == 0, made["output"][-2000:]
    before = starts(folder)
    existed = folder.exists()
    try:
        runs = [timed(command(kind, folder, args)) for _ in range(repeat)]
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    seconds = [r["seconds"] for r in runs]
    left = folder.exists() and (not existed or starts(folder) != before)
    return {
        "exit": sorted({r["rc"] for r in runs}),
        "traceback": any("Traceback" in r["output"] for r in runs),
        "folder_left": left,
        "message": runs[0]["output"].strip().splitlines()[-1][:160] if runs[0]["output"] else "",
        "median_s": round(statistics.median(seconds), 2),
        "min_s": round(min(seconds), 2),
        "max_s": round(max(seconds), 2),
        "bound_s": bound,
        "under_bound": max(seconds) < bound,
        "exit_after_last_line_s": round(max(r["after_last_line"] for r in runs), 2),
    }


def exits(tmp: Path) -> dict:
    """Seconds from the last line to the exit of a run that finishes and of one stopped."""
    done = timed(command("train", tmp / "runs" / "finished", SMALL))
    stopped = timed(
        command("train", tmp / "runs" / "stopped", [*SMALL, "trainer.max_steps=50"]),
        stop_after="step 1/50",
    )
    return {
        name: {"exit": r["rc"], "after_last_line_s": round(r["after_last_line"], 2)}
        for name, r in (("finished run", done), ("SIGTERM-stopped run", stopped))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        make_inputs(tmp)
        results = {
            case: bench(case, kind, a, bound, args.repeat, tmp)
            for case, (kind, a, bound) in cases(tmp).items()
        }
        runs = exits(tmp)
    print(
        json.dumps(
            {
                "python": sys.version.split()[0],
                "cpus": os.cpu_count(),
                "load_average_1min": {
                    "before": round(load_before, 2),
                    "after": round(os.getloadavg()[0], 2),
                },
                "repeat": args.repeat,
                "all_under_bound": all(r["under_bound"] for r in results.values()),
                "all_exit_within_1s": all(
                    r["exit_after_last_line_s"] < EXIT for r in results.values()
                )
                and all(r["after_last_line_s"] < EXIT for r in runs.values()),
                "refusals": results,
                "runs": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
