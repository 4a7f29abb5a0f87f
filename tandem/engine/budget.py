"""How many prompt groups one pass of the torch engine generates: the KV-cache budget.

``generate`` reserves each row's KV cache for the whole rollout before decoding (the prompt and
every response token, ``tandem.engine.cache``): at the paper's scale, 128 rows of 4,024 positions
of Qwen3-4B (144 KiB a position in bfloat16) hold 70.7 GiB per model. ``SamplingParams
.kv_cache_gib`` bounds what one call's caches hold; the call then generates its prompts a few
whole groups (the G rows of a prompt) at a time, and the passes' rollouts are joined into one.

The bound is per device: the models on one device share it (senior and junior together, where
they sit together), and a junior on a device of its own gets the same bound there. ``None``
bounds each device by 90% of the memory free on it when the call starts (CUDA: what the driver
reports free plus what torch's allocator holds unused; the CPU: the host's available memory; a
device of another kind: unbounded). A pass's need is ``tandem.engine.cache.kv_chunk_bytes`` with
each model's ``kv_bytes_per_token`` at the dtypes it caches in now (``cache_dtypes``: under
autocast, the keys float32 and the values bfloat16 over float32 weights).

Processes in lockstep (a senior sharded layer by layer) agree on the number of passes, since
every senior forward is a collective: each splits its own prompts into that many passes, empty
ones where it has fewer prompts than passes.

What this file leaves out: the passes themselves (``tandem.engine.generate``), activations and
logits (the memory plan's, ``tandem.plan``), and the cross-vocabulary engine, which generates in
one pass and only warns here (``warn_unsplit``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tandem.engine.base import Lockstep, SamplingParams
from tandem.engine.cache import cache_dtypes, kv_bytes_per_token, kv_chunk_bytes, kv_chunk_rows
from tandem.engine.reader import model_device

log = logging.getLogger(__name__)

GiB = 2**30
# The share of a device's free memory the caches may take when kv_cache_gib is None: the rest
# is for the step's logits and the prefill's activations.
FREE_SHARE = 0.9

_said: set[tuple[Any, ...]] = set()


def free_bytes(device: torch.device) -> int | None:
    """Bytes free on ``device`` now; ``None`` where this cannot tell (no bound there)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # blocks torch's allocator keeps cached are free to it, though not to the driver
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        import psutil

        return psutil.virtual_memory().available
    return None


@dataclass(frozen=True)
class _Device:
    """One device's share of a call: its bound and what a prompt group's rows need there."""

    device: torch.device
    budget: int | None  # bytes; None: unbounded
    per_token: int  # KV bytes per position of one row, every model on the device
    group: int  # bytes one prompt group's rows hold (kv_chunk_bytes)
    names: tuple[str, ...]  # the models on the device


def _devices(models: Sequence[Any], width: int, params: SamplingParams) -> list[_Device]:
    by_device: dict[torch.device, list[tuple[str, int]]] = {}
    for name, model in zip(("senior", "junior"), models, strict=False):
        per_token = kv_bytes_per_token(model.config, *cache_dtypes(model))
        by_device.setdefault(model_device(model), []).append((name, per_token))
    out = []
    for device, members in by_device.items():
        per_token = sum(b for _, b in members)
        if params.kv_cache_gib is not None:
            budget = int(params.kv_cache_gib * GiB)
        else:
            free = free_bytes(device)
            budget = None if free is None else int(FREE_SHARE * free)
        g, m = params.samples_per_prompt, params.max_new_tokens
        group = kv_chunk_bytes(per_token, 1, g, width, m)
        out.append(_Device(device, budget, per_token, group, tuple(n for n, _ in members)))
    return out


def prompt_spans(
    models: Sequence[Any],
    prompts: int,
    width: int,
    params: SamplingParams,
    lockstep: Lockstep | None = None,
) -> list[tuple[int, int]]:
    """The passes of one ``generate`` call: ``(first, stop)`` ranges of consecutive prompts.

    Args:
        models: the senior, then the junior where it reads along.
        prompts: prompts in the call (each ``params.samples_per_prompt`` rows).
        width: the left-padded prompts' width (each row reserves it plus
            ``params.max_new_tokens`` positions).
        params: ``kv_cache_gib`` is the bound (see the module).
        lockstep: processes in lockstep agree on the number of passes.

    Returns:
        Consecutive ranges covering ``range(prompts)``, of sizes differing by at most one;
        under lockstep some may be empty (a process with fewer prompts than passes).

    Raises:
        ValueError: not even one prompt group fits.
    """
    devices = _devices(models, width, params)
    fits = prompts
    for d in devices:
        if d.budget is None:
            continue
        groups = kv_chunk_rows(
            d.budget, d.per_token, params.samples_per_prompt, width, params.max_new_tokens
        )
        groups //= params.samples_per_prompt
        if groups < 1:
            raise ValueError(_too_small(d, width, params))
        fits = min(fits, groups)
    passes = -(-prompts // fits)
    if lockstep is not None:
        passes = lockstep(passes)
    if passes > 1:
        _say_split(prompts * params.samples_per_prompt, passes, devices)
    sizes = [prompts // passes + (i < prompts % passes) for i in range(passes)]
    return list(itertools.pairwise(itertools.accumulate(sizes, initial=0)))


def warn_unsplit(models: Sequence[Any], prompts: int, width: int, params: SamplingParams) -> None:
    """Warn (once per shape) where one pass over every prompt exceeds the KV budget: the
    cross-vocabulary engine (``tandem.engine.cross``) does not split its rows. Both models are
    counted at the senior's prompt width, an estimate (the junior reads its own tokens)."""
    g = params.samples_per_prompt
    for d in _devices(models, width, params):
        need = kv_chunk_bytes(d.per_token, prompts, g, width, params.max_new_tokens)
        key = ("cross", d.device, prompts, width, params.max_new_tokens, g)
        if d.budget is None or need <= d.budget or key in _said:
            continue
        _said.add(key)
        log.warning(
            "the cross-vocabulary engine generates all %d rows in one pass: their KV caches "
            "(about %.3g GiB on %s) exceed %s (%.3g GiB) and may run out of memory. Lower "
            "the rows per call (batch_size, group_size) or generation.max_new_tokens.",
            prompts * g,
            need / GiB,
            d.device,
            _budget_name(params, d),
            d.budget / GiB,
        )


def _say_split(rows: int, passes: int, devices: list[_Device]) -> None:
    """Say once per (rows, passes) that a call is split, with the bound that split it."""
    if (rows, passes) in _said:
        return
    _said.add((rows, passes))
    bounded = [d for d in devices if d.budget is not None]
    where = ", ".join(f"{d.budget / GiB:.3g} GiB on {d.device}" for d in bounded) or "lockstep"
    log.info(
        "KV cache budget (generation.kv_cache_gib): %d rows generated in %d passes of at most "
        "%d rows, under %s",
        rows,
        passes,
        -(-rows // passes),
        where,
    )


def _budget_name(params: SamplingParams, d: _Device) -> str:
    if params.kv_cache_gib is not None:
        return f"generation.kv_cache_gib ({params.kv_cache_gib:g})"
    return f"generation.kv_cache_gib (null: {FREE_SHARE:.0%} of the memory free on {d.device})"


def _too_small(d: _Device, width: int, params: SamplingParams) -> str:
    g, m = params.samples_per_prompt, params.max_new_tokens
    models = " and ".join(d.names)
    fix = (
        f"Raise generation.kv_cache_gib to at least {d.group / GiB:.3g}"
        if params.kv_cache_gib is not None
        else f"Free memory on {d.device}, or set generation.kv_cache_gib to at least "
        f"{d.group / GiB:.3g} where the device has it"
    )
    return (
        f"{_budget_name(params, d)} holds {d.budget / GiB:.3g} GiB of KV cache, but one "
        f"prompt's {g} rows of {width} prompt + {m} response positions (and the prompt's keys "
        f"once more while they are read) need {d.group / GiB:.3g} GiB on {d.device} for the "
        f"{models} ({d.per_token} bytes a position). {fix}, or lower generation.max_new_tokens, "
        "the samples per prompt (group_size) or the prompts' length (data.max_prompt_tokens)."
    )
