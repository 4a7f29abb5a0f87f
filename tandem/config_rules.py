"""Settings a run would accept and train nothing with, refused from the config alone.

GRPO learns from the differences between a prompt's rollouts, on the tokens the senior wrote.
A greedy draw (``generation.temperature=0``, refused in ``tandem.config``, or ``top_k=1``) makes
every rollout of a solo group the same; a coin that never picks the senior (``sampler.p=0``)
leaves it no token to learn on; either way every step's loss is 0. A batch that asks for more
prompts than the data holds, and data with no validation split to measure on, are refused here
too, where the config shows them (the tiny world's sizes, a data source's splits); a hub
dataset's size is only known once it loads (``tandem.data.datamodule``).

This file imports only the standard library and ``tandem.signatures`` (and reads data files
with ``tandem.data.checks`` when asked to count their rows).

What this file leaves out: the keys (``tandem.config_keys``) and ranges (``tandem.config``).
"""

from __future__ import annotations

from typing import Any

from tandem.signatures import constant

# samplers whose coin, at p=0, never gives the senior the pen; the step schedules only when they
# do not alternate and the junior (or the coin) writes first
COIN_EVERYWHERE = ("word", "token")
COIN_WHEN_NOT_ALTERNATING = ("sentence", "step")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_learning(problems: list[str], c: dict) -> None:
    """Refuse settings under which no step could learn: ``top_k=1`` and a coin that never
    picks the senior (unless the junior-imitation term learns from the junior's tokens)."""
    generation = c.get("generation") if isinstance(c.get("generation"), dict) else {}
    if generation.get("top_k") == 1 and _int(generation.get("top_k")):
        problems.append(
            "generation.top_k (1) keeps only the likeliest token, which is greedy: every rollout "
            "of a prompt would be the same, so each group's advantages would be 0 and GRPO would "
            "learn nothing. Set generation.top_k=0 (no truncation) or > 1; greedy is for "
            "evaluation."
        )
    module = c.get("module") if isinstance(c.get("module"), dict) else {}
    loss = module.get("loss") if isinstance(module.get("loss"), dict) else {}
    imitation = loss.get("lambda_jun", 0.0)
    if isinstance(imitation, int | float) and imitation > 0:
        return  # the imitation term learns from the junior's tokens
    sampler = c.get("sampler") if isinstance(c.get("sampler"), dict) else {}
    name, p = sampler.get("name"), sampler.get("p", 0.5)
    never = name in COIN_EVERYWHERE or (
        name in COIN_WHEN_NOT_ALTERNATING
        and sampler.get("alternate", True) is False
        and sampler.get("first", "senior") in ("junior", "coin")
    )
    if never and p == 0 and isinstance(p, int | float) and not isinstance(p, bool):
        problems.append(
            f"sampler.p (0) never gives the senior the pen under the {name} sampler: every "
            "rollout would be the junior's alone, the loss (over the senior's tokens) 0 at every "
            "step, and nothing would be learned. Set sampler.p > 0 (the paper's 0.5); a junior "
            "alone is for evaluation (validation.sampler)."
        )


def check_data_size(problems: list[str], c: dict) -> None:
    """The data the config names must have a validation split and at least one batch of
    training prompts, where the config shows how many there are."""
    data = c.get("data") if isinstance(c.get("data"), dict) else {}
    b, g = c.get("batch_size"), c.get("group_size")
    prompts = b // g if _int(b) and _int(g) and b > 0 and g > 0 and b % g == 0 else None
    if data.get("name") == "arithmetic":
        sizes = data.get("sizes") or constant("tandem.data.arithmetic", "SIZES") or {}
        if isinstance(sizes, dict):
            for split in ("train", "validation"):
                if not _int(sizes.get(split)) or sizes[split] < 1:
                    problems.append(
                        f"data.sizes.{split} ({sizes.get(split)!r}) must be a number of rows "
                        f">= 1: the run trains on train and measures on validation. Set "
                        f"data.sizes.{split}, or leave data.sizes unset for the defaults."
                    )
            too_many(problems, prompts, sizes.get("train"), "data.sizes.train")
    elif data.get("name") == "hf":
        splits = data.get("splits") or {"train": "train"}
        holdout = data.get("holdout", 0)
        if isinstance(splits, dict) and "validation" not in splits and holdout == 0:
            problems.append(
                f"data has no validation split (data.splits maps only {sorted(splits)}) and "
                "data.holdout is 0: the run measures the senior on held-out problems. Set "
                "data.holdout=N to hold N training rows out, or map the source's own with "
                "data.splits.validation=<its split name>."
            )


def too_many(problems: list[str], prompts: int | None, rows: Any, where: str) -> None:
    """Refuse a step that asks for more prompts than the training split has rows."""
    if prompts is None or not _int(rows) or prompts <= rows:
        return
    problems.append(
        f"batch_size / group_size ({prompts} prompts a step) is more than the {rows} training "
        f"prompts ({where}): one step would hold every prompt and repeat them. Set batch_size to "
        f"at most group_size x {rows}, or give the run more data."
    )


def check_hf_rows(problems: list[str], data: dict, prompts: int | None) -> None:
    """An ``hf`` source of local ``.jsonl`` files: its held-out rows must leave training rows,
    and those at least one step's prompts (the files are counted, not loaded)."""
    from tandem.data.checks import training_rows

    rows = training_rows(data)
    if rows is None:
        return
    holdout = data.get("holdout", 0)
    if _int(holdout) and 0 < rows <= holdout:
        problems.append(
            f"data.holdout ({holdout}) would hold out every one of the {rows} rows of "
            "data.data_files and leave none to train on. Set data.holdout below that, or give "
            "more rows."
        )
        return
    too_many(problems, prompts, rows - (holdout if _int(holdout) else 0), "data.data_files")
