"""Every generation as one JSON line, so that no analysis ever needs to generate again.

A record holds the row's set, mode (``solo`` or ``handoff``), problem and sample index, the
prompt ids, the response tokens with their authors and both models' log-probs, the text as
author spans (``[[author, text], ...]``, for rendering), the verdict, and, for solo rows that
went through teacher forcing, the per-token KL to the base and overlap with the junior.

What this file leaves out: computing any of it (``tandem.evaluation.runner``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from torch import Tensor

from tandem.engine import JUNIOR, SENIOR, Rollouts, StopReason
from tandem.rewards import Verdict

AUTHOR_NAMES = {SENIOR: "senior", JUNIOR: "junior"}
# Decimals kept for log-probs and per-token values (float32 carries about 7 digits).
_DECIMALS = 5


class RecordWriter:
    """Appends records to ``<folder>/<set>.jsonl``, one file per eval set."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._files: dict[str, TextIO] = {}

    def write(self, eval_set: str, records: list[dict[str, Any]]) -> None:
        if eval_set not in self._files:
            self._files[eval_set] = (self.folder / f"{eval_set}.jsonl").open("w")
        f = self._files[eval_set]
        for record in records:
            f.write(json.dumps(record) + "\n")
        f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def build_records(
    rollouts: Rollouts,
    verdicts: list[Verdict],
    context: dict[str, Any],
    tokenizer: Any,
    extra: dict[str, Tensor] | None = None,
) -> list[dict[str, Any]]:
    """One record per rollout row.

    Args:
        rollouts: the batch.
        verdicts: the reward's verdict per row.
        context: per-batch fields (``set``, ``mode``, ``n`` samples per prompt,
            ``problem_offset``, ``problems``, ``answers``, ``prompt_ids``) where
            ``problems[i]`` is the batch's i-th prompt.
        tokenizer: decodes the author spans.
        extra: ``[N, T]`` per-token values to store under their names (e.g. ``kl``); they
            replace a field of the same name (teacher-forced ``junior_logprobs`` in solo rows).
    """
    out = []
    junior_lp = rollouts.junior_logprobs
    for row in range(rollouts.num_rows):
        n = int(rollouts.lengths[row])
        i = int(rollouts.prompt_index[row])
        tokens = rollouts.tokens[row, :n].tolist()
        authors = rollouts.authors[row, :n].tolist()
        record = {
            "set": context["set"],
            "mode": context["mode"],
            "problem_index": context["problem_offset"] + i,
            "sample": row % context["n"],
            "problem": context["problems"][i],
            "answer": context["answers"][i],
            "prompt_ids": context["prompt_ids"][i],
            "text": rollouts.texts[row] if rollouts.texts is not None else None,
            "reward": verdicts[row].score,
            "reason": verdicts[row].reason,
            "stop_reason": StopReason(int(rollouts.stop_reasons[row])).name.lower(),
            "length": n,
            "tokens": tokens,
            "authors": authors,
            "spans": author_spans(tokens, authors, tokenizer),
            "senior_logprobs": _rounded(rollouts.senior_logprobs[row, :n]),
            "junior_logprobs": None if junior_lp is None else _rounded(junior_lp[row, :n]),
        }
        for name, values in (extra or {}).items():
            record[name] = _rounded(values[row, :n])
        out.append(record)
    return out


def author_spans(tokens: list[int], authors: list[int], tokenizer: Any) -> list[list[str]]:
    """``[[author, text], ...]``: maximal runs of one author's tokens, decoded."""
    spans: list[list[str]] = []
    start = 0
    for j in range(1, len(tokens) + 1):
        if j == len(tokens) or authors[j] != authors[start]:
            text = tokenizer.decode(tokens[start:j], skip_special_tokens=True)
            spans.append([AUTHOR_NAMES.get(authors[start], "pad"), text])
            start = j
    return spans


def read_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of one ``.jsonl`` file, in order."""
    with Path(path).open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _rounded(values: Tensor) -> list[float]:
    return [round(float(v), _DECIMALS) for v in values.tolist()]
