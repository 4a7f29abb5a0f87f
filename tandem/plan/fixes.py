"""The overrides that would make a plan fit, each with the peak it gives.

Each family of fixes (a micro-batch token budget, a KV-cache budget, activation checkpointing,
gathering the senior by layer, sharding it with FSDP2 over more devices, offloading its shards)
offers options from the least restrictive (fastest) to the most. Alone, a family gives its first
option that fits, or else the least restrictive one that lowers the peak as far as it can.
Together: the set of families of least cost (``COST``, roughly their price in step time) that
fits with each at its most restrictive option, on the devices given where some set fits there,
else with more; each option then loosened as far as the others allow. Where no set fits, the
families that bring the peak lowest, added one at a time.

What this file leaves out: the bytes (``tandem.plan.memory``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

from tandem.plan.activations import kv_group_bytes, kv_prompts
from tandem.plan.memory import Fix, GiB, Plan, plan_memory, shared_device
from tandem.plan.settings import Settings

Devices = tuple[tuple[str, int], ...]
State = tuple[Settings, Devices]
# most processes per machine a fix proposes
MAX_DEVICES = 8
KV_BUDGETS_GIB = (128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1, 0.5, 0.25)


@dataclass(frozen=True)
class Option:
    """One way to fix: its overrides and what it does to the settings and devices."""

    family: str
    overrides: tuple[str, ...]
    apply: Callable[[State], State]
    note: str = ""


def _junior_home(state: State, limit: int) -> list[Option]:
    s, devices = state
    where = str(s.junior_device or "")
    if ":" not in where or int(where.rsplit(":", 1)[-1]) < len(devices):
        return []
    return [
        Option(
            "junior",
            ("model.junior_device=null",),
            lambda st: (replace(st[0], junior_device=None), st[1]),
            "the junior on each process's own device",
        )
    ]


def _micro_budget(state: State, limit: int) -> list[Option]:
    s, _ = state
    options = []
    for k in range(22, 8, -1):
        budget = 2**k
        if budget >= s.micro_tokens:
            continue
        options.append(
            Option(
                "micro",
                (f"module.max_tokens_per_micro_batch={budget}",),
                lambda st, b=budget: (replace(st[0], max_tokens_per_micro_batch=b), st[1]),
            )
        )
        if budget <= s.row_tokens:  # one row per micro-batch: no smaller budget helps
            break
    return options


def _kv_budget(state: State, limit: int) -> list[Option]:
    s, _ = state
    shared = shared_device(s)
    group = max(kv_group_bytes(s, shared).values())
    options = []
    for gib in KV_BUDGETS_GIB:
        if gib * GiB >= group * s.prompts_per_rank:
            continue
        if gib * GiB < group:  # not even one prompt group: the engine refuses it
            break
        rows = kv_prompts(replace(s, kv_cache_gib=gib), shared) * s.group_size
        options.append(
            Option(
                "kv",
                (f"generation.kv_cache_gib={gib:g}",),
                lambda st, g=gib: (replace(st[0], kv_cache_gib=g), st[1]),
                f"{rows} rows at a time",
            )
        )
    return options


def _fsdp_flag(field: str, value: object, family: str) -> Callable[[State, int], list]:
    """Options setting ``trainer.strategy.<field>`` (a key of FSDP2Strategy) to ``value``."""

    def options(state: State, limit: int) -> list[Option]:
        s, _ = state
        if s.strategy != "fsdp2" or getattr(s, field) == value:
            return []
        if field == "offload" and s.accelerator != "gpu":
            return []
        text = str(value).lower() if isinstance(value, bool) else value
        return [
            Option(
                family,
                (f"trainer.strategy.{field}={text}",),
                lambda st: (replace(st[0], **{field: value}), st[1]),
            )
        ]

    return options


def _offloads(state: State, limit: int) -> list[Option]:
    """``trainer.strategy.offload``: verl's layout first (shards and optimizer state on the host
    between phases, the step on the device), then FSDP2's (on the host for good, the step run
    by the host's CPU: the least device memory and the slowest step)."""
    return [
        option
        for value in ("between_phases", "fsdp")
        for option in _fsdp_flag("offload", value, "offload")(state, limit)
    ]


def _sharded(state: State, limit: int) -> list[Option]:
    """FSDP2 (trainer=fsdp_gpu) over the devices given, then over more of the same size, up to
    ``limit`` processes a machine."""
    s, devices = state
    if s.accelerator != "gpu":
        return []
    prompts = s.batch_size // max(1, s.group_size)
    start = s.local_ranks
    if s.strategy == "fsdp2":  # more processes than now
        counts = range(start + 1, limit + 1)
    else:  # every device given, or more
        counts = range(len(devices), limit + 1)
    counts = [n for n in counts if prompts % n == 0]
    size = devices[0][1]
    options = []
    for n in counts:
        overrides = (f"trainer.devices={n}",)
        if s.strategy != "fsdp2":
            overrides = ("trainer=fsdp_gpu", *overrides)
            if s.junior_device is not None:
                overrides = (*overrides, "model.junior_device=null")
        note = f"needs {n} devices of {size / GiB:g} GiB" if n > len(devices) else ""
        if n == 1:
            note = "FSDP2 on one device: bfloat16 compute, and activation checkpointing as a key"
        options.append(Option("fsdp", overrides, lambda st, n=n: _to_fsdp(st, n), note))
    return options


def _to_fsdp(state: State, n: int) -> State:
    s, devices = state
    if s.strategy != "fsdp2":  # conf/trainer/fsdp_gpu.yaml
        s = replace(
            s,
            strategy="fsdp2",
            precision="32-true",
            param_dtype="bfloat16",
            reduce_dtype="float32",
            offload="none",
            activation_checkpointing=False,
            rollout_gather="whole",
            reshard_after_forward=True,
            junior_device=None,
        )
    s = replace(s, world=n * s.nodes)
    size = devices[0][1]
    more = tuple((f"cuda:{i}", size) for i in range(len(devices), n))
    return s, devices + more


# in order of preference: the cheapest in step time first
FAMILIES: dict[str, Callable[[State, int], list[Option]]] = {
    "junior": _junior_home,
    "micro": _micro_budget,
    "kv": _kv_budget,
    "checkpointing": _fsdp_flag("activation_checkpointing", True, "checkpointing"),
    "gather": _fsdp_flag("rollout_gather", "per_layer", "gather"),
    "fsdp": _sharded,
    "offload": _offloads,
}
# what each family costs in step time, roughly: a set of fixes is chosen by its sum
COST = {"junior": 0, "micro": 1, "kv": 2, "checkpointing": 3, "fsdp": 3, "gather": 5, "offload": 8}
# the order a set is applied in: the strategy before its flags, the budgets last
APPLY_ORDER = ("junior", "fsdp", "checkpointing", "gather", "offload", "micro", "kv")


def _best(options: list[Option], state: State) -> tuple[Option, Plan] | None:
    """The first option that fits, else the least restrictive of those lowering the peak most."""
    plans = [(o, plan_memory(*o.apply(state))) for o in options]
    for option, plan in plans:
        if plan.fits:
            return option, plan
    if not plans:
        return None
    low = min(p.peak for _, p in plans)
    return next((o, p) for o, p in plans if p.peak <= low * 1.01)


def _fix(options: list[Option], plan: Plan) -> Fix:
    notes = "; ".join(o.note for o in options if o.note)
    overrides = tuple(x for o in options for x in o.overrides)
    return Fix(overrides, plan.peak, plan.fits, notes)


def find_fixes(s: Settings, devices: Devices) -> tuple[tuple[Fix, ...], Fix | None]:
    """Each family's fix alone, and a set of fixes that together fit (or come closest): on the
    devices given where some set fits there, else with more devices."""
    base = (s, devices)
    peak = plan_memory(*base).peak
    alone = []
    for family in FAMILIES.values():
        found = _best(family(base, MAX_DEVICES), base)
        if found is not None and found[1].peak < peak:
            alone.append(_fix([found[0]], found[1]))
    together = None
    for limit in dict.fromkeys((len(devices), MAX_DEVICES)):
        chosen = _cheapest_set(base, limit)
        if chosen is not None:
            return tuple(alone), _together(base, chosen)
    chosen = _gather_fixes(base, MAX_DEVICES)
    if chosen:
        together = _together(base, _loosen(base, chosen, MAX_DEVICES))
    return tuple(alone), together


def _together(base: State, chosen: list[Option]) -> Fix:
    state = base
    for option in chosen:
        state = option.apply(state)
    return _fix(chosen, plan_memory(*state))


def _cheapest_set(base: State, limit: int) -> list[Option] | None:
    """The set of families of least cost that fits with each at its most restrictive option,
    each option then loosened as far as the others allow; None if no set fits."""
    names = sorted(COST)
    sets = (c for r in range(1, len(names) + 1) for c in itertools.combinations(names, r))
    for chosen_names in sorted(sets, key=lambda c: (sum(COST[n] for n in c), len(c))):
        state, chosen = base, []
        for name in APPLY_ORDER:
            if name not in chosen_names:
                continue
            options = FAMILIES[name](state, limit)
            if not options:  # does not apply here (a flag of FSDP2 without it, say)
                break
            chosen.append(options[-1])
            state = options[-1].apply(state)
        else:
            if plan_memory(*state).fits:
                return _loosen(base, chosen, limit)
    return None


def _gather_fixes(base: State, limit: int) -> list[Option]:
    """Families added one at a time: the first (in order of preference) that makes the plan
    fit, else the one that lowers the peak most; until it fits or nothing lowers it."""
    chosen: list[Option] = []
    state, plan = base, plan_memory(*base)
    while not plan.fits:
        used = {o.family for o in chosen}
        found = [f for f in (_best(fam(state, limit), state) for fam in FAMILIES.values()) if f]
        found = [(o, p) for o, p in found if o.family not in used and p.peak < plan.peak]
        if not found:
            break
        fitting = [(o, p) for o, p in found if p.fits]
        option, plan = fitting[0] if fitting else min(found, key=lambda f: f[1].peak)
        chosen.append(option)
        state = option.apply(state)
    return chosen


def _loosen(base: State, chosen: list[Option], limit: int) -> list[Option]:
    """Each chosen option replaced by its family's least restrictive one that still fits."""
    for k, option in enumerate(chosen):
        state = base
        for earlier in chosen[:k]:
            state = earlier.apply(state)
        for candidate in FAMILIES[option.family](state, limit):
            trial = candidate.apply(state)
            for later in chosen[k + 1 :]:
                trial = later.apply(trial)
            if plan_memory(*trial).fits:
                chosen[k] = candidate
                break
            if candidate.overrides == option.overrides:
                break
    return chosen
