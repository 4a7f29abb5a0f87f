"""Eval sets: which problems, how many samples each, and how they are drawn.

An eval set is one ``conf/eval/<name>.yaml``: a dataset source (``tandem.data.sources``: the
tiny world's ``arithmetic`` task, or ``hf`` for a hub name or local JSON / JSONL / Parquet files)
and its split, the samples per problem ``n``, the ``ks`` of pass@k, and the sampling parameters.
Every source brings its rows to (problem, answer) and reports the rows it cannot use (missing or
empty answers) by count and example; the report travels into the results.

What this file leaves out: sampling and scoring (``tandem.evaluation.runner``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tandem.data.prompts import INSTRUCTION, junior_prompt_ids, prompt_ids
from tandem.data.sources import SourceReport
from tandem.engine import SamplingParams
from tandem.registry import DATASETS

log = logging.getLogger(__name__)

# tokens the authors' handoff evaluation keeps free below the context (budget = context -
# prompt - 8, eval/handoff.py)
CONTEXT_RESERVE = 8


@dataclass(frozen=True)
class EvalSet:
    """One eval set (the keys of ``conf/eval/<name>.yaml`` under its name).

    Attributes:
        name: the set's name in tables and files.
        source: registry name (``name``) and arguments of a dataset source.
        split: the source's split to evaluate on.
        limit: evaluate the first ``limit`` problems only (None: all).
        n: samples per problem.
        ks: the k of pass@k (each at most n).
        temperature, top_p, top_k, max_new_tokens: how samples are drawn.
        instruction: appended to each problem (asks for the ``\\boxed{}`` answer).
        separator: between the problem and the instruction.
        context_limit: the longest prompt + response; a row's budget is
            ``min(max_new_tokens, context_limit - prompt - 8)``, the authors' handoff budget
            (None: ``max_new_tokens``).
        handoff_n, handoff_ks: ``n`` and ``ks`` of the handoff pass (None: the solo pass's).
    """

    name: str
    source: dict[str, Any]
    split: str = "test"
    limit: int | None = None
    n: int = 1
    ks: tuple[int, ...] = (1,)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    instruction: str = INSTRUCTION
    separator: str = "\n"
    context_limit: int | None = None
    handoff_n: int | None = None
    handoff_ks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ks", tuple(int(k) for k in self.ks))
        if self.handoff_ks is not None:
            object.__setattr__(self, "handoff_ks", tuple(int(k) for k in self.handoff_ks))
        assert self.n >= 1, f"eval.{self.name}.n ({self.n}) must be at least 1"
        assert self.ks and max(self.ks) <= self.n, (
            f"eval.{self.name}.ks ({list(self.ks)}) must be non-empty and at most n ({self.n})"
        )

    def for_mode(self, mode: str) -> EvalSet:
        """The set as one pass sees it: the handoff pass may take its own ``n`` and ``ks``."""
        if mode != "handoff" or self.handoff_n is None:
            return self
        ks = self.handoff_ks if self.handoff_ks is not None else self.ks
        return dataclasses.replace(self, n=self.handoff_n, ks=ks, handoff_n=None, handoff_ks=None)

    def params(self, seed: int) -> SamplingParams:
        """Sampling parameters of one generate call (``n`` samples per prompt)."""
        limit = None if self.context_limit is None else self.context_limit - CONTEXT_RESERVE
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=seed,
            samples_per_prompt=self.n,
            context_limit=limit,
        )


@dataclass(frozen=True)
class Problems:
    """The problems of one set, as text and as chat-formatted prompt ids."""

    problems: list[str]
    answers: list[str]
    prompt_ids: list[list[int]]
    report: SourceReport = field(default_factory=lambda: SourceReport("?", 0))
    # how ``prompt_ids`` were formatted: a junior of another family gets the same prompts in
    # its own chat format (``prompt_ids_for``)
    instruction: str = INSTRUCTION
    separator: str = "\n"

    def __len__(self) -> int:
        return len(self.problems)

    def prompt_ids_for(self, tokenizer: Any, rows: Sequence[int]) -> list[list[int]] | None:
        """Problems ``rows`` formatted with a junior's tokenizer's own chat template, as these
        were (None if it has none: ``junior_prompt_ids``)."""
        problems = [self.problems[i] for i in rows]
        return junior_prompt_ids(tokenizer, problems, self.instruction, self.separator)


def build_sets(spec: dict[str, dict[str, Any]]) -> list[EvalSet]:
    """``EvalSet`` s from the composed ``eval`` mapping (set name -> keys)."""
    return [EvalSet(name=name, **dict(keys)) for name, keys in spec.items()]


def load_problems(eval_set: EvalSet, tokenizer: Any) -> Problems:
    """Load, clean and tokenize one set's problems (the report says what could not be used)."""
    spec = dict(eval_set.source)
    source = DATASETS.build(spec.pop("name"), **spec)
    rows, report = source.load(eval_set.split)
    if eval_set.limit is not None and eval_set.limit < len(rows):
        log.info(
            "eval set %s: %d problems (limit %d) of %s",
            eval_set.name,
            eval_set.limit,
            eval_set.limit,
            report,
        )
        rows = rows.select(range(eval_set.limit))
    else:
        log.info("eval set %s: %s", eval_set.name, report)
    problems, answers = list(rows["problem"]), list(rows["answer"])
    if not problems:
        raise ValueError(
            f"eval set {eval_set.name!r} has no usable problems ({report}). Check its source, "
            "split and column names."
        )
    ids = prompt_ids(tokenizer, problems, eval_set.instruction, eval_set.separator)
    return Problems(problems, answers, ids, report, eval_set.instruction, eval_set.separator)
