"""The LightningDataModule: prompts in, ``PromptBatch`` out, resumable to the exact batch.

Training draws ``batch_size`` prompts per step from an endless stream of seeded shuffles (one
permutation per epoch over the train split). Batch ``i`` of the stream is a pure function of
(seed, i), so resuming needs only the number of batches already consumed, which the data module
saves in the checkpoint. Under DDP the global batch is split across ranks (rank r takes prompts
r, r + world, ...), so ``batch_size`` is the global number of prompts per step.

What this file leaves out: sampling the rollouts (each prompt is repeated ``group_size`` times by
the engine's caller, not here) and the sources themselves (``tandem.data.sources``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from tandem.data.prompts import INSTRUCTION, format_prompt, junior_prompt_ids
from tandem.errors import ConfigError
from tandem.registry import DATASETS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptBatch:
    """Prompts of one step, as text and as token ids.

    ``prompt_ids[i]`` is the chat-formatted, tokenized ``problems[i]``; ``answers[i]`` its gold.
    """

    problems: list[str]
    answers: list[str]
    prompt_ids: list[list[int]]
    # position in the training stream (-1 for validation batches)
    index: int = -1
    # how ``prompt_ids`` were formatted: a junior of another family gets the same prompts in
    # its own chat format (``prompt_ids_for``)
    instruction: str = INSTRUCTION
    separator: str = "\n"

    def __len__(self) -> int:
        return len(self.problems)

    def prompt_ids_for(self, tokenizer: Any) -> list[list[int]] | None:
        """The problems formatted with a junior's tokenizer's own chat template, as these were
        (None if it has none: ``junior_prompt_ids``)."""
        return junior_prompt_ids(tokenizer, self.problems, self.instruction, self.separator)

    def repeat(self, group_size: int) -> PromptBatch:
        """Each prompt ``group_size`` times in a row: rows of a group stay adjacent."""
        return PromptBatch(
            *(
                [x for x in items for _ in range(group_size)]
                for items in (self.problems, self.answers, self.prompt_ids)
            ),
            index=self.index,
            instruction=self.instruction,
            separator=self.separator,
        )


def prompt_token_cap(
    max_prompt_tokens: int | None, context: int | None, max_new_tokens: int
) -> int | None:
    """The most prompt tokens a run allows (None: no cap, for a model that names no context).

    ``max_prompt_tokens`` is the user's cap (``data.max_prompt_tokens``); None means the model's
    ``context`` less the room the responses need (``generation.max_new_tokens``).
    """
    if context is None:
        return max_prompt_tokens
    room = context - max_new_tokens
    if max_prompt_tokens is None:
        if room < 1:
            raise ConfigError(
                f"generation.max_new_tokens ({max_new_tokens}) leaves no room for a prompt in the "
                f"model's context ({context} tokens). Lower generation.max_new_tokens."
            )
        return room
    if max_prompt_tokens > room:
        raise ConfigError(
            f"data.max_prompt_tokens ({max_prompt_tokens}) plus generation.max_new_tokens "
            f"({max_new_tokens}) exceed the model's context ({context} tokens). Set "
            f"data.max_prompt_tokens to at most {room}, or null for exactly that."
        )
    return max_prompt_tokens


def fitting_prompts(
    tokenizer: Any, texts: list[str], cap: int | None
) -> tuple[list[int], list[list[int]]]:
    """The indices and token ids of the ``texts`` of at most ``cap`` tokens (all for None).

    A text longer in characters than ``cap`` times the longest token in the vocabulary cannot fit
    and is dropped untokenized: tokenizing a megabyte-long prompt can itself take minutes. (Each
    token covers at most as many characters as its vocabulary entry has: one per byte in
    byte-level BPE, one per character in SentencePiece.)
    """
    if cap is None:
        return list(range(len(texts))), tokenizer(texts, add_special_tokens=False)["input_ids"]
    longest = max(map(len, tokenizer.get_vocab()))
    short = [i for i, t in enumerate(texts) if len(t) <= cap * longest]
    if not short:
        return [], []
    ids = tokenizer([texts[i] for i in short], add_special_tokens=False)["input_ids"]
    kept = [(i, x) for i, x in zip(short, ids, strict=True) if len(x) <= cap]
    return [i for i, _ in kept], [x for _, x in kept]


class _StepStream(IterableDataset):
    """Endless batches of row indices: batch i is a function of (seed, i) only."""

    def __init__(
        self, n_rows: int, batch_size: int, seed: int, start: int, rank: int, world: int
    ) -> None:
        self.n_rows, self.batch_size, self.seed = n_rows, batch_size, seed
        self.start, self.rank, self.world = start, rank, world

    def batch_indices(self, i: int) -> list[int]:
        first = i * self.batch_size
        out = []
        for pos in range(first, first + self.batch_size):
            epoch, offset = divmod(pos, self.n_rows)
            out.append(int(self._permutation(epoch)[offset]))
        return out[self.rank :: self.world]

    def _permutation(self, epoch: int) -> torch.Tensor:
        if getattr(self, "_epoch", None) != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm, self._epoch = torch.randperm(self.n_rows, generator=g), epoch
        return self._perm

    def __iter__(self) -> Iterator[list[int]]:
        i = self.start
        while True:
            yield self.batch_indices(i)
            i += 1


class _Batches(IterableDataset):
    def __init__(self, data: PromptDataModule, stream: _StepStream) -> None:
        self.data, self.stream = data, stream

    def __iter__(self) -> Iterator[PromptBatch]:
        for i, indices in enumerate(self.stream, start=self.stream.start):
            yield self.data._batch("train", indices, i)


class PromptDataModule(L.LightningDataModule):
    """Tokenized prompts for training and validation.

    Args:
        source: the registry name and arguments of a dataset source (``name`` plus kwargs).
        tokenizer: a tokenizer with a chat template (the senior's).
        batch_size: prompts per training step, over all processes.
        val_size: validation prompts used (None: all).
        val_batch_size: prompts per validation batch on each process.
        seed: decides the order of training prompts.
        instruction: appended to each problem; asks for the answer format the reward reads.
        separator: between the problem and the instruction.
        max_prompt_tokens: prompts longer than this (chat-formatted, in tokens) are dropped at
            load time, counted and reported, so no prompt can outgrow the model's context
            (None: no cap). See ``prompt_token_cap``.
    """

    def __init__(
        self,
        source: dict[str, Any],
        tokenizer: Any,
        batch_size: int,
        val_size: int | None = None,
        val_batch_size: int = 32,
        seed: int = 0,
        instruction: str = INSTRUCTION,
        separator: str = "\n",
        max_prompt_tokens: int | None = None,
    ) -> None:
        super().__init__()
        source = dict(source)
        self.source = DATASETS.build(source.pop("name"), **source)
        self.tokenizer, self.batch_size, self.seed = tokenizer, batch_size, seed
        self.val_size, self.val_batch_size = val_size, val_batch_size
        self.instruction, self.separator = instruction, separator
        self.max_prompt_tokens = max_prompt_tokens
        self.consumed = 0  # training batches handed out so far: the resume position
        self.splits: dict[str, dict[str, list]] = {}
        self.dropped: dict[str, int] = {}  # prompts over max_prompt_tokens, per split

    def setup(self, stage: str | None = None) -> None:
        loaded = False
        for split in ("train", "validation"):
            if split in self.splits:
                continue
            loaded = True
            try:
                rows, report = self.source.load(split)
            except (KeyError, ValueError) as err:  # a split the source lacks, a holdout too big
                raise ConfigError(f"data ({split} split): {err}") from None
            log.info("data %s", report)
            if split == "validation" and self.val_size is not None:
                rows = rows.select(range(min(self.val_size, len(rows))))
            problems, answers = list(rows["problem"]), list(rows["answer"])
            texts = [
                format_prompt(self.tokenizer, p, self.instruction, self.separator) for p in problems
            ]
            keep, ids = fitting_prompts(self.tokenizer, texts, self.max_prompt_tokens)
            self.dropped[split] = len(texts) - len(keep)
            self._report_dropped(split, len(texts))
            self.splits[split] = {
                "problems": [problems[i] for i in keep],
                "answers": [answers[i] for i in keep],
                "ids": ids,
            }
            if split == "train" and len(keep) < self.batch_size:
                raise ConfigError(
                    f"batch_size / group_size ({self.batch_size} prompts a step) is more than "
                    f"the {len(keep)} training prompts the data holds: one step would hold "
                    "every prompt and repeat them. Lower batch_size, or give the run more data."
                )
        # once, when the splits load: a run validates the base first, then fits (two setups)
        if loaded and self.trainer is not None:
            for logger in self.trainer.loggers:
                logger.log_metrics(
                    {
                        "data/dropped_prompts": float(self.dropped["train"]),
                        "data/dropped_val_prompts": float(self.dropped["validation"]),
                    },
                    step=0,
                )

    def _report_dropped(self, split: str, total: int) -> None:
        dropped = self.dropped[split]
        if not dropped:
            return
        cap = self.max_prompt_tokens
        if dropped == total:
            raise ConfigError(
                f"every {split} prompt ({total}) is longer than data.max_prompt_tokens ({cap} "
                f"tokens, chat template included): no {split} prompt is left. Raise "
                "data.max_prompt_tokens (null: the model's context minus "
                "generation.max_new_tokens), or lower generation.max_new_tokens."
            )
        log.warning(
            "data %s: dropped %d of %d prompts longer than %d tokens (data.max_prompt_tokens); "
            "they are never fed to the model",
            split,
            dropped,
            total,
            cap,
        )

    def _batch(self, split: str, indices: list[int], index: int = -1) -> PromptBatch:
        s = self.splits[split]
        return PromptBatch(
            [s["problems"][i] for i in indices],
            [s["answers"][i] for i in indices],
            [s["ids"][i] for i in indices],
            index,
            self.instruction,
            self.separator,
        )

    def train_dataloader(self) -> DataLoader:
        rank, world = (
            (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        )
        stream = _StepStream(
            len(self.splits["train"]["problems"]),
            self.batch_size,
            self.seed,
            self.consumed,
            rank,
            world,
        )
        return DataLoader(_Batches(self, stream), batch_size=None, num_workers=0)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, idx: int) -> Any:
        # prompts stay lists of ids: the engine puts them on each model's own device
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # counted here, when the step takes the batch, not when the loader prefetches it
        if isinstance(batch, PromptBatch) and batch.index >= 0:
            self.consumed = batch.index + 1
        return batch

    def val_dataloader(self) -> DataLoader:
        n = len(self.splits["validation"]["problems"])
        rank, world = (
            (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        )
        # every rank the same number of problems, so the same number of batches: a sharded
        # senior's forward is a collective, and a rank with one batch more would wait forever
        used = n - n % world
        if used < n and rank == 0:
            log.info("validation: %d of %d problems, %d per process", used, n, used // world)
        mine = list(range(rank, used, world))
        chunks = [
            mine[i : i + self.val_batch_size] for i in range(0, len(mine), self.val_batch_size)
        ]
        return DataLoader(
            [self._batch("validation", c) for c in chunks],
            batch_size=None,
            num_workers=0,
            collate_fn=lambda b: b,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self.consumed, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(
                f"data seed ({self.seed}) differs from the checkpoint's ({state['seed']}); "
                "resuming would replay other prompts. Resume with the same data.seed."
            )
        self.consumed = int(state["consumed"])
