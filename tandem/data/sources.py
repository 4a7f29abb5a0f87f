"""Dataset sources: every set of problems becomes rows of (problem, answer).

- ``arithmetic``: the embedded tiny world's synthetic task (no download);
- ``hf``: anything ``datasets.load_dataset`` reads: a hub name (``agentica-org/DeepScaleR-
  Preview-Dataset``, ``HuggingFaceH4/MATH-500``, ...) or local JSON, JSONL, Parquet or CSV files
  (``path: json`` with ``data_files``), with configurable column names.

Rows that cannot be used (missing or empty problem or answer) are reported by count and with an
example, never dropped silently: ``load`` returns the clean rows and a ``SourceReport``.

What this file leaves out: chat formatting and tokenization (``tandem.data.datamodule``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import datasets
from datasets.exceptions import DatasetGenerationError

from tandem.data.arithmetic import Difficulty, make_splits
from tandem.errors import ConfigError
from tandem.registry import DATASETS

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class SourceReport:
    """What a load kept and what it could not use."""

    split: str
    kept: int
    unusable: int = 0
    example: dict[str, Any] | None = None
    reasons: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        if not self.unusable:
            return f"{self.split}: {self.kept} rows"
        return (
            f"{self.split}: kept {self.kept} rows, {self.unusable} unusable {self.reasons}; "
            f"for example {self.example}"
        )


def clean_rows(
    ds: datasets.Dataset, problem_column: str, answer_column: str, split: str
) -> tuple[datasets.Dataset, SourceReport]:
    """Rename to (problem, answer), drop unusable rows, and report them."""
    missing = [c for c in (problem_column, answer_column) if c not in ds.column_names]
    if missing:
        raise KeyError(
            f"{split} split has no column(s) {missing}; its columns are {ds.column_names}. "
            "Set problem_column / answer_column to the right names."
        )
    reasons: dict[str, int] = {}
    example = None
    keep = []
    for i, (problem, answer) in enumerate(zip(ds[problem_column], ds[answer_column], strict=True)):
        why = _unusable(problem, "problem") or _unusable(answer, "answer")
        if why:
            reasons[why] = reasons.get(why, 0) + 1
            example = example or {"row": i, problem_column: problem, answer_column: answer}
        else:
            keep.append(i)
    kept = ds.select(keep) if len(keep) < len(ds) else ds
    columns = {
        "problem": [str(v).strip() for v in kept[problem_column]],
        "answer": [str(v).strip() for v in kept[answer_column]],
    }
    for name, values in columns.items():
        if name in kept.column_names:
            kept = kept.remove_columns(name)
        kept = kept.add_column(name, values)
    report = SourceReport(split, len(kept), len(ds) - len(keep), example, reasons)
    if report.unusable:
        log.warning("unusable rows: %s", report)
    return kept, report


def _unusable(value: Any, what: str) -> str | None:
    if value is None:
        return f"missing {what}"
    if isinstance(value, float) and value != value:  # NaN from pandas-made files
        return f"missing {what}"
    if not str(value).strip():
        return f"empty {what}"
    return None


@DATASETS.register("arithmetic")
class ArithmeticSource:
    """The tiny world's task.

    Args:
        seed: decides every problem.
        sizes: rows per split (train, validation, test).
        difficulty: keyword arguments of ``tandem.data.arithmetic.Difficulty``.
    """

    def __init__(
        self,
        seed: int = 0,
        sizes: dict[str, int] | None = None,
        difficulty: dict[str, Any] | None = None,
    ) -> None:
        self.seed = seed
        self.sizes = dict(sizes) if sizes else None
        self.difficulty = Difficulty(**_tupled(difficulty or {}))
        self._splits: datasets.DatasetDict | None = None

    def load(self, split: str) -> tuple[datasets.Dataset, SourceReport]:
        if self._splits is None:
            self._splits = make_splits(self.seed, self.sizes, self.difficulty)
        if split not in self._splits:
            raise KeyError(f"arithmetic has splits {list(self._splits)}, not {split!r}.")
        return clean_rows(self._splits[split], "prompt", "answer", split)


@DATASETS.register("hf")
class HFSource:
    """Any dataset ``datasets.load_dataset`` can read, by hub name or from local files.

    Args:
        path: a hub name, a local folder, or a builder (``json``, ``parquet``, ``csv``).
        splits: our split name -> the source's split name (e.g. ``{"train": "train"}``).
        data_files: for builders, the files (a path, a list, or split -> paths).
        name: the dataset's configuration name, if it has several.
        problem_column: the column holding the problem text.
        answer_column: the column holding the gold answer.
        holdout: for sets with only a train split: the last ``holdout`` rows of ``train``
            become ``validation`` and are removed from ``train``, so the two never overlap.
    """

    def __init__(
        self,
        path: str,
        splits: dict[str, str] | None = None,
        data_files: Any = None,
        name: str | None = None,
        problem_column: str = "problem",
        answer_column: str = "answer",
        holdout: int = 0,
    ) -> None:
        self.path, self.name, self.data_files = path, name, data_files
        self.splits = dict(splits or {"train": "train"})
        self.problem_column, self.answer_column = problem_column, answer_column
        self.holdout = holdout
        if holdout < 0:
            raise ValueError(f"holdout ({holdout}) must be >= 0 rows.")
        if holdout and "validation" in self.splits:
            raise ValueError(
                f"dataset {path!r} sets both holdout ({holdout}) and a validation split "
                f"({self.splits['validation']!r}); keep one of them."
            )

    def load(self, split: str) -> tuple[datasets.Dataset, SourceReport]:
        if self.holdout and split in ("train", "validation"):
            ds = self._read("train")
            if len(ds) <= self.holdout:
                raise ValueError(
                    f"holdout ({self.holdout}) leaves no training rows of {len(ds)}; lower it."
                )
            cut = len(ds) - self.holdout
            ds = ds.select(range(cut) if split == "train" else range(cut, len(ds)))
            return clean_rows(ds, self.problem_column, self.answer_column, split)
        return clean_rows(self._read(split), self.problem_column, self.answer_column, split)

    def _read(self, split: str) -> datasets.Dataset:
        if split not in self.splits:
            raise KeyError(
                f"dataset {self.path!r} maps splits {self.splits}; add {split!r} under "
                f"`splits` to use it."
            )
        try:
            return datasets.load_dataset(
                self.path, self.name, data_files=self.data_files, split=self.splits[split]
            )
        except DatasetGenerationError as err:
            # its own message says only "An error occurred"; what went wrong is the cause
            files = f" (data_files {self.data_files})" if self.data_files else ""
            raise ConfigError(
                f"dataset {self.path!r}{files} could not be read: {err.__cause__ or err}. "
                "Check that the files are in the format the builder expects (JSON, JSONL, CSV, "
                "Parquet)."
            ) from err


def _tupled(kwargs: dict[str, Any]) -> dict[str, Any]:
    # Hydra hands lists; Difficulty is frozen and hashable, so it wants tuples
    return {k: tuple(v) if isinstance(v, list | tuple) else v for k, v in kwargs.items()}
