"""Small local copies of the paper's datasets, in each hub dataset's own layout and columns.

``write_paper_data(root)`` lays out what ``huggingface-cli download NAME --repo-type dataset
--local-dir ROOT/NAME`` would leave for DeepScaleR and the five eval sets' sources, each a
handful of the tiny world's problems spelt in that dataset's columns (AIME 2024's answer inside
its worked solution; AMC 2024 and 2025 with one answer each that the authors drop). So the
paper's configs run unchanged on this machine with ``datasets_dir=ROOT`` and the tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path

from tandem.data.arithmetic import make_splits

# hub name -> (file, the rows' columns as (problem, answer) -> row)
LAYOUT = {
    "agentica-org/DeepScaleR-Preview-Dataset": (
        "deepscaler.json",
        lambda p, a, s: {"problem": p, "answer": a, "solution": s},
    ),
    "math-ai/amc23": ("test.jsonl", lambda p, a, s: {"id": 0, "question": p, "answer": a}),
    "rawsh/2024_AMC12": (
        "train.jsonl",
        lambda p, a, s: {"exam": "2024 AMC 12A", "problem": p, "answer": a, "solution": s},
    ),
    "sonthenguyen/amc12-2025-non-figure": (
        "train.jsonl",
        lambda p, a, s: {"question": p, "answer": a},
    ),
    "math-ai/aime24": ("test.jsonl", lambda p, a, s: {"id": 0, "problem": p, "solution": s}),
    "math-ai/aime25": ("test.jsonl", lambda p, a, s: {"problem": p, "answer": a}),
    "MathArena/aime_2026": ("train.jsonl", lambda p, a, s: {"problem": p, "answer": a}),
    "math-ai/minervamath": ("test.jsonl", lambda p, a, s: {"question": p, "answer": a}),
}
# answers the authors' AMC build drops (conf/eval/amc23_25.yaml), one per part that has them
DROPPED = {"rawsh/2024_AMC12": "D", "sonthenguyen/amc12-2025-non-figure": "k"}


def write_paper_data(root: Path, train_rows: int = 48, eval_rows: int = 2) -> dict[str, int]:
    """Write the copies under ``root``; returns the rows each eval set should keep."""
    splits = make_splits(7, {"train": train_rows, "validation": 1, "test": 8 * eval_rows})
    test = splits["test"]
    for i, (name, (file, row)) in enumerate(LAYOUT.items()):
        if name.startswith("agentica"):
            rows = splits["train"]
        else:  # each source its own problems
            rows = test.select(range(i * eval_rows, (i + 1) * eval_rows))
        records = [row(r["prompt"], r["answer"], r["solution"]) for r in rows]
        if name in DROPPED:
            records.append(row("A problem with no gradable answer.", DROPPED[name], "none"))
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        if file.endswith(".jsonl"):
            text = "".join(json.dumps(r) + "\n" for r in records)
        else:  # DeepScaleR ships one JSON array
            text = json.dumps(records)
        (folder / file).write_text(text)
    return {
        "amc23_25": 3 * eval_rows,
        "aime24": eval_rows,
        "aime25": eval_rows,
        "aime26": eval_rows,
        "minerva": eval_rows,
    }
