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

import dataclasses
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
from datasets.exceptions import DatasetGenerationError

from tandem.data.arithmetic import Difficulty, make_splits
from tandem.errors import ConfigError
from tandem.registry import DATASETS

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
_BOXED = re.compile(r"\\boxed\{([^{}]+)\}")


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
        holdout: for sets with only a train split: ``holdout`` rows of ``train`` become
            ``validation`` and are removed from ``train``, so the two never overlap.
        holdout_seed: draws the held-out rows at random with this seed, from the usable rows, as
            the authors' ``build_deepscaler.py`` does (pandas' ``sample(n, random_state)``, so
            the same rows); None: the last ``holdout`` rows.
        root: a folder holding local copies of hub datasets, one folder per hub name (as
            ``huggingface-cli download NAME --repo-type dataset --local-dir ROOT/NAME`` leaves
            them): ``path`` is then read from ``root/path``. None: ``path`` as given.
        answer_in_box: the answer column holds a worked solution: its first ``\\boxed{}``
            is the answer (as the authors build AIME 2024 from ``math-ai/aime24``).
        drop_answers: answers whose rows are left out (reported), as the authors drop answers
            their verifier cannot grade from AMC 2024-25.
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
        holdout_seed: int | None = None,
        root: str | None = None,
        answer_in_box: bool = False,
        drop_answers: list[str] | None = None,
    ) -> None:
        if root is not None:
            path = str(Path(root).expanduser() / path)
        self.answer_in_box, self.drop_answers = answer_in_box, set(drop_answers or ())
        self.path, self.name, self.data_files = path, name, data_files
        self.splits = dict(splits or {"train": "train"})
        self.problem_column, self.answer_column = problem_column, answer_column
        self.holdout, self.holdout_seed = holdout, holdout_seed
        if holdout < 0:
            raise ValueError(f"holdout ({holdout}) must be >= 0 rows.")
        if holdout and "validation" in self.splits:
            raise ValueError(
                f"dataset {path!r} sets both holdout ({holdout}) and a validation split "
                f"({self.splits['validation']!r}); keep one of them."
            )

    def load(self, split: str) -> tuple[datasets.Dataset, SourceReport]:
        if self.holdout and split in ("train", "validation"):
            return self._held_out(split)
        return self._clean(self._read(split), split)

    def _clean(self, ds: datasets.Dataset, split: str) -> tuple[datasets.Dataset, SourceReport]:
        """``clean_rows``, after taking boxed answers out of solutions and dropping answers."""
        if self.answer_in_box:
            column = self.answer_column
            ds = ds.map(lambda row: {column: _boxed(row[column])})
        ds, report = clean_rows(ds, self.problem_column, self.answer_column, split)
        if self.drop_answers:
            keep = [i for i, a in enumerate(ds["answer"]) if a not in self.drop_answers]
            dropped = len(ds) - len(keep)
            ds = ds.select(keep)
            reasons = {**report.reasons, "answer in drop_answers": dropped}
            report = dataclasses.replace(
                report, kept=len(ds), unusable=report.unusable + dropped, reasons=reasons
            )
        return ds, report

    def _held_out(self, split: str) -> tuple[datasets.Dataset, SourceReport]:
        """``train`` less the held-out rows, or the held-out rows as ``validation``."""
        ds, report = self._clean(self._read("train"), split)
        if len(ds) <= self.holdout:
            raise ValueError(
                f"holdout ({self.holdout}) leaves no training rows of {len(ds)}; lower it."
            )
        if self.holdout_seed is None:
            held = list(range(len(ds) - self.holdout, len(ds)))
        else:
            import pandas as pd  # a dependency of datasets

            rows = pd.RangeIndex(len(ds)).to_series()
            held = rows.sample(n=self.holdout, random_state=self.holdout_seed).tolist()
        if split == "train":
            taken = set(held)
            held = [i for i in range(len(ds)) if i not in taken]
        kept = ds.select(held)
        return kept, dataclasses.replace(report, kept=len(kept))

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


def _boxed(solution: Any) -> str | None:
    """The first brace-free ``\\boxed{...}`` of ``solution`` (None: there is none), by the
    authors' own pattern for AIME 2024."""
    found = _BOXED.search(str(solution)) if solution is not None else None
    return found.group(1) if found else None


@DATASETS.register("concat")
class ConcatSource:
    """Several sources read one after another as one set (AMC 2023-25 from its three parts).

    Args:
        parts: the sources, each a registry name (``name``) and its arguments.
    """

    def __init__(self, parts: list[dict[str, Any]]) -> None:
        if not parts:
            raise ValueError("concat needs at least one part: parts=[{name: hf, ...}, ...].")
        self.parts = []
        for spec in parts:
            spec = dict(spec)
            self.parts.append(DATASETS.build(spec.pop("name"), **spec))

    def load(self, split: str) -> tuple[datasets.Dataset, SourceReport]:
        loaded = [part.load(split) for part in self.parts]
        ds = datasets.concatenate_datasets(
            [d.select_columns(["problem", "answer"]) for d, _ in loaded]
        )
        reasons: dict[str, int] = {}
        for _, report in loaded:
            for why, count in report.reasons.items():
                reasons[why] = reasons.get(why, 0) + count
        example = next((r.example for _, r in loaded if r.example), None)
        unusable = sum(r.unusable for _, r in loaded)
        return ds, SourceReport(split, len(ds), unusable, example, reasons)


def _tupled(kwargs: dict[str, Any]) -> dict[str, Any]:
    # Hydra hands lists; Difficulty is frozen and hashable, so it wants tuples
    return {k: tuple(v) if isinstance(v, list | tuple) else v for k, v in kwargs.items()}
