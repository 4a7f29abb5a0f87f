"""The bytes every device holds in each phase of a training step, as formulas of the settings.

Phases (what is alive at the worst moment of each):

- ``rollout``: weights and optimizer state (gradients are freed after every optimizer step;
  ``offload=between_phases`` keeps the optimizer state on the host, and the shards too where
  vLLM samples),
  the senior as the engine reads it (gathered whole or by layer under FSDP2), the junior, both
  models' KV caches for the prompt groups generated at once (every position reserved at the
  prefill; ``generation.kv_cache_gib``, or 90% of the memory free when the rollout starts) and
  the larger of a prefill chunk and one decode step's logits and draw;
- ``old_logprobs`` / ``ref_logprobs``: one no-grad forward of the largest micro-batch through
  the senior (the old log-probs) or the junior (a KL term's reference), where the trainer
  recomputes them;
- ``update``: weights, optimizer state, gradients (a sharded senior's unsharded and whole in
  the reduce dtype while they accumulate over a mini-batch's micro-batches, reduced once at its
  last: ``tandem.modules.sharding.gradient_sync``), one micro-batch's saved activations (and
  its attention mask, where rows are not laid out) and what the backward holds beside them
  (an LM-head chunk and its gradient, or the head's weight gradients);
- ``step``: AdamW's step (a float32 temporary of every parameter on a GPU, of the largest
  tensor on the CPU).

In a CPU run the rollout's own tensors (``_host_tensors``: its tokens, authors and log-probs,
then the update's ids, masks and old log-probs) are in the same memory and counted in every
phase they live through: a batch of a million rows holds gigabytes of them beside the caches.

The formulas of the forwards, backwards and rollouts are in ``tandem.plan.activations``, with
what was measured of each; ``benchmarks/plan_memory.py`` holds them to real training steps.

With ``module.backend.name=vllm`` the torch engine's rollout terms give way to vLLM's engine:
``gpu_memory_utilization`` of the senior's device, held in the rollout, and in every phase where
it does not sleep through the update (``_vllm_engine``).

On GPUs the host is planned too (``host_plan``): what each process loads there before its
models move to their devices (the senior in float32, the junior), the runtime, and the shards,
gradients and optimizer state an offload layout keeps there in each phase. ``fits`` includes it
where the host's size is known (this machine's, or ``--host-gib``).

Not counted: validation rollouts (fewer rows than training ones), the allocator's
fragmentation (``MARGIN`` of each device is kept for it).

What this file leaves out: reading the config (``tandem.plan.settings``), fixes and reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.plan import activations as act
from tandem.plan.settings import Settings
from tandem.plan.shape import DTYPE_BYTES

GiB = 2**30
# kept free on every device: the caching allocator's fragmentation, and what no formula sees
MARGIN = 0.05
# a CUDA context, cuBLAS workspaces and NCCL buffers: per process, on every device it uses
RUNTIME_BYTES = GiB
# a training process's own host memory: Python, torch with its CUDA libraries, transformers,
# Lightning (about 2.5 GiB resident measured on CUDA machines; rounded up)
HOST_RUNTIME_BYTES = 3 * GiB
PHASES = ("rollout", "old_logprobs", "ref_logprobs", "update", "step")


@dataclass(frozen=True)
class DevicePlan:
    """One device's bytes: ``phases[phase][term]``, each phase's terms alive at once."""

    name: str
    capacity: int
    phases: dict[str, dict[str, int]]

    def total(self, phase: str) -> int:
        return sum(self.phases.get(phase, {}).values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)

    @property
    def peak(self) -> int:
        return self.total(self.peak_phase) if self.phases else 0

    @property
    def usable(self) -> int:
        return int(self.capacity * (1 - MARGIN))

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable


@dataclass(frozen=True)
class Fix:
    """Overrides that change the plan, and the peak (bytes, of the fullest device) they give."""

    overrides: tuple[str, ...]
    peak: int
    fits: bool
    note: str = ""


@dataclass(frozen=True)
class Plan:
    """The memory plan of a run: every device's phases and terms, the problems of its layout,
    and, where it does not fit, the overrides that would make it fit."""

    settings: Settings
    devices: tuple[DevicePlan, ...]
    host: DevicePlan | None = None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    fixes: tuple[Fix, ...] = ()
    together: Fix | None = None

    @property
    def peak(self) -> int:
        """The fullest device's peak, in bytes."""
        return max(d.peak for d in self.devices)

    @property
    def fits(self) -> bool:
        """Every device fits, and the host where its size is known (capacity 0: unknown)."""
        host = self.host is None or not self.host.capacity or self.host.fits
        return not self.problems and host and all(d.fits for d in self.devices)

    def phase_bytes(self, device: int = 0) -> dict[str, int]:
        """Each phase's predicted bytes on one device: what a measurement compares against."""
        d = self.devices[device]
        return {phase: d.total(phase) for phase in d.phases}


def plan_memory(
    s: Settings, devices: Sequence[tuple[str, int]], host_bytes: int | None = None
) -> Plan:
    """Every device's bytes under ``s``, and the host's on GPUs.

    Args:
        s: the run's settings.
        devices: ``(name, bytes)`` of each device of one machine: the GPUs in order, or the
            host (``cpu``) for a CPU run.
        host_bytes: the host memory of a GPU machine (None: unknown, its figures are shown but
            not checked).
    """
    problems, notes = [], []
    gpu = s.accelerator == "gpu"
    ranks = s.local_ranks
    if gpu and ranks > len(devices):
        problems.append(
            f"the trainer starts {ranks} processes on each machine, one per GPU, but "
            f"{len(devices)} device(s) were given. Give as many devices, or set trainer.devices."
        )
    group = max(act.kv_group_bytes(s, shared_device(s, len(devices))).values())
    if s.kv_cache_gib is not None and s.kv_cache_gib * GiB < group:
        problems.append(
            f"generation.kv_cache_gib ({s.kv_cache_gib:g}) holds less than one prompt's "
            f"{s.group_size} rows of KV cache ({group / GiB:.3g} GiB): the engine refuses it. "
            f"Raise it to at least {group / GiB:.3g}."
        )
    totals: list[dict[str, dict[str, int]]] = [{} for _ in devices]
    shared = shared_device(s, len(devices))
    per_rank = rank_terms(s, _kv_free(s, devices, shared), shared)
    for rank in range(ranks):
        home = min(rank, len(devices) - 1) if gpu else 0
        away = _junior_index(s, home, len(devices), problems, notes)
        for phase, terms in per_rank.items():
            for (where, term), value in terms.items():
                index = away if where == "junior" else home
                if index is None:
                    continue
                bucket = totals[index].setdefault(phase, {})
                bucket[term] = bucket.get(term, 0) + value
        if gpu:
            for index in {home, away} - {None}:
                for phase in per_rank:
                    bucket = totals[index].setdefault(phase, {})
                    bucket["runtime"] = bucket.get("runtime", 0) + RUNTIME_BYTES
    if s.backend == "vllm":
        _vllm_engine(s, devices, totals, problems, notes)
    plans = tuple(
        DevicePlan(
            name, capacity, {p: {k: v for k, v in t.items() if v} for p, t in phases.items()}
        )
        for (name, capacity), phases in zip(devices, totals, strict=True)
    )
    host = host_plan(s, list(per_rank), host_bytes) if gpu else None
    return Plan(s, plans, host, tuple(dict.fromkeys(problems)), tuple(dict.fromkeys(notes)))


def host_plan(s: Settings, phases: list[str], capacity: int | None) -> DevicePlan:
    """The host of a GPU machine: every process's runtime in every phase; before training
    (``load``) each process's senior in float32 and its junior, read there from their files
    before they move to their devices; in each phase the shards, gradients and optimizer state
    its offload layout keeps there."""
    ranks = s.local_ranks
    runtime = {"host_runtime": ranks * HOST_RUNTIME_BYTES}
    load = {
        **runtime,
        "senior_load": ranks * s.senior.params * 4,
        "junior_load": ranks * s.junior.params * s.junior_bytes,
    }
    out = {"load": load}
    shard = math.ceil(s.senior.params / s.shards) * s.weight_bytes
    for phase in phases:
        terms = dict(runtime)
        device = _resident(s, phase)
        if s.offloaded != "none":
            if not device[("senior", "senior_weights")]:
                terms["senior_weights"] = ranks * shard
            if not device[("senior", "optimizer_state")]:
                terms["optimizer_state"] = ranks * shard * s.optimizer_states
        if s.offloaded == "fsdp" and phase in ("update", "step"):
            # reduced gradients land on the host (FSDP2's CPUOffloadPolicy)
            terms["gradients"] = ranks * shard
        out[phase] = terms
    return DevicePlan("host", capacity or 0, out)


def _vllm_engine(s: Settings, devices, totals, problems: list[str], notes: list[str]) -> None:
    """vLLM's engine beside the trainer, one per process on its device: it takes
    ``gpu_memory_utilization`` of the device when it starts; the pair engine
    (``tandem.engine.vllm_pair``) holds both models' weights in it, and the rest is KV cache,
    each position holding both models' keys and values. In sleep mode (the backend's default
    on GPUs) it holds that share in the rollout only: it sleeps through the trainer's phases,
    its weights and CUDA graphs backed up in host memory, its KV cache dropped."""
    if s.accelerator != "gpu":
        notes.append(
            "module.backend.name=vllm on the CPU: its KV cache is the backend's kv_cache_gib "
            "of host memory, not planned here."
        )
        return
    weight = 2 if s.vllm_dtype in ("bfloat16", "float16") else 4
    weights = (s.senior.params + s.junior.params) * weight
    per_row = (s.senior.kv_bytes[s.vllm_dtype] + s.junior.kv_bytes[s.vllm_dtype]) * s.row_tokens
    for rank in range(min(s.local_ranks, len(devices))):
        name, capacity = devices[rank]
        reserved = int(s.vllm_utilization * capacity)
        for phase, bucket in totals[rank].items():
            if phase == "rollout" or not s.vllm_sleep:
                bucket["vllm_engine"] = bucket.get("vllm_engine", 0) + reserved
        rows = max(0, reserved - weights) // per_row
        if rows < 1:
            problems.append(
                f"vLLM on {name} takes {s.vllm_utilization:g} of it ({reserved / GiB:.1f} GiB), "
                f"which holds both models' weights ({weights / GiB:.1f} GiB) but not one row of "
                f"{s.row_tokens} positions ({per_row / GiB:.2f} GiB of KV). Raise "
                "module.backend.engine_args.gpu_memory_utilization."
            )
        else:
            notes.append(
                f"vLLM on {name}: {reserved / GiB:.1f} GiB (gpu_memory_utilization="
                f"{s.vllm_utilization:g}) for both models' weights ({weights / GiB:.1f} GiB) and "
                f"the KV of {min(rows, s.rows_per_rank)} of this process's {s.rows_per_rank} "
                f"rows at once ({per_row / GiB:.2f} GiB a row); vLLM queues the rest."
            )
    if s.vllm_sleep:
        notes.append(
            f"vLLM sleeps while the trainer updates: its share of the device is free after the "
            f"rollout, and both models' weights ({weights / GiB:.1f} GiB) and its CUDA graphs "
            "wait in each process's host memory (module.backend.sleep=false keeps them on the "
            "device)."
        )


def _junior_index(
    s: Settings, home: int, count: int, problems: list[str], notes: list[str]
) -> int | None:
    """The device of the junior of the process on device ``home`` (None: host memory, not
    planned); a device not among those given is named, and the junior planned at ``home``."""
    where = s.junior_device
    if s.accelerator != "gpu" or where in (None, "cuda", "gpu"):
        return home
    if str(where) == "cpu":
        notes.append("model.junior_device=cpu: the junior is in host memory, not planned here.")
        return None
    index = int(str(where).rsplit(":", 1)[-1]) if ":" in str(where) else home
    if index >= count:
        problems.append(
            f"model.junior_device ({where}) is not among the {count} device(s) given: the "
            "junior is planned on the senior's device. Give the device, or set "
            "model.junior_device=null."
        )
        return home
    if s.local_ranks > 1:
        notes.append(
            f"model.junior_device={where}: every one of the {s.local_ranks} processes puts its "
            f"junior there."
        )
    return index


def rank_terms(
    s: Settings, kv_free: dict[str, int] | None = None, shared: bool | None = None
) -> dict[str, dict[tuple[str, str], int]]:
    """One process's bytes by phase, each term keyed ``(senior|junior, term)``: on the device of
    the senior, or of the junior.

    Args:
        s: the run's settings.
        kv_free: with ``generation.kv_cache_gib`` null, the bytes free on the senior's device
            (and the junior's, apart) when the rollout starts, which bound the engine's KV
            caches; None: every prompt group at once.
        shared: whether the junior sits on the senior's device (None: as ``shared_device``
            reads the config).
    """
    shared = shared_device(s) if shared is None else shared
    t, chunk = s.micro_tokens, s.logprob_chunk_tokens
    # the vLLM backend's engine is planned apart (_vllm_engine), not the torch engine's rollout
    rollout = _rollout(s, kv_free, shared) if s.backend != "vllm" else {}
    phases = {"rollout": {**_held(s, "rollout"), **_compute(s, "rollout"), **rollout}}
    if s.old_pass:
        cb, resid = s.compute_bytes, act.residual_bytes(s)
        forward = act.no_grad_forward(
            s.senior, t, s.head_positions, chunk, cb, resid, s.read_positions
        )
        phases["old_logprobs"] = {
            **_held(s, "old_logprobs"),
            **_compute(s, "old_logprobs"),
            ("senior", "forward_senior"): forward,
        }
    if s.junior_reference:
        cb = act.junior_compute_bytes(s)
        forward = act.no_grad_forward(
            s.junior, t, s.head_positions, chunk, cb, s.junior_bytes, s.read_positions
        )
        phases["ref_logprobs"] = {
            **_held(s, "ref_logprobs"),
            **_compute(s, "old_logprobs"),
            ("junior", "forward_junior"): forward,
        }
    acts, mask = act.activation_bytes(s)
    phases["update"] = {
        **_held(s, "update"),
        **_gradients(s, "update"),
        **_compute(s, "update"),
        ("senior", "activations"): acts,
        ("senior", "attention_mask"): mask,
        ("senior", "backward"): act.backward_bytes(s),
    }
    phases["step"] = {
        **_held(s, "step"),
        **_gradients(s, "step"),
        **_compute(s, "step"),
        ("senior", "step_temp"): act.step_temp(s, s.offloaded == "fsdp"),
    }
    for phase, terms in _host_tensors(s).items():
        if phase in phases:  # the no-grad passes are there only when configured
            phases[phase].update(terms)
    return phases


# the rollout's own tensors in a CPU run's memory (on GPUs they are small beside the KV caches
# and not planned): per response token the token and its author (int64 each) and up to four
# float32 log-probs (each model's raw one, and each at the loss's temperature), held once as
# the passes write them and again while ``generate`` joins the passes into one ``Rollouts``
ROLLOUT_BYTES_PER_TOKEN = 8 + 8 + 4 * 4
ROLLOUT_COPIES = 2
# and from the update's start to the step's end: each row's prompt and response ids and mask
# (int64 each, per position) and, per response token, the loss's old and reference log-probs
# (float32) and the two author masks (bool)
UPDATE_BYTES_PER_POSITION = 8 + 8
UPDATE_BYTES_PER_TOKEN = 4 + 4 + 1 + 1


def _host_tensors(s: Settings) -> dict[str, dict[tuple[str, str], int]]:
    """What a CPU run's rollout and update hold in its memory beside the models and caches,
    by phase (nothing for a GPU run)."""
    if s.accelerator == "gpu":
        return {}
    rows, new = s.rows_per_rank, s.max_new_tokens
    rollout = rows * new * ROLLOUT_BYTES_PER_TOKEN
    inputs = rows * (s.row_tokens * UPDATE_BYTES_PER_POSITION + new * UPDATE_BYTES_PER_TOKEN)
    during = {("senior", "rollout_tensors"): rollout, ("senior", "update_inputs"): inputs}
    return {
        "rollout": {("senior", "rollout_tensors"): ROLLOUT_COPIES * rollout},
        "old_logprobs": during,
        "ref_logprobs": during,
        "update": during,
        "step": during,
    }


def _held(s: Settings, phase: str) -> dict[tuple[str, str], int]:
    """Alive through ``phase``: the master weights and the optimizer state where the offload
    layout keeps them on the device, and the junior."""
    return {**_resident(s, phase), ("junior", "junior_weights"): s.junior.params * s.junior_bytes}


def shared_device(s: Settings, count: int | None = None) -> bool:
    """Whether the junior sits on its senior's device: on the CPU always; on GPUs unless
    ``model.junior_device`` names another of the ``count`` devices given (one not given is
    planned on the senior's) or the host."""
    where = None if s.junior_device is None else str(s.junior_device)
    if s.accelerator != "gpu" or where in (None, "cuda", "gpu"):
        return True
    if where == "cpu" or ":" not in where:
        return where != "cpu"
    index = int(where.rsplit(":", 1)[-1])
    return index == 0 or (count is not None and index >= count)


def _kv_free(
    s: Settings, devices: Sequence[tuple[str, int]], shared: bool
) -> dict[str, int] | None:
    """Bytes free to one process's KV caches when its rollout starts, on the senior's device
    and (apart) the junior's, as the engine reads them with ``kv_cache_gib`` null: the device
    less what every process sharing it holds then (weights, optimizer state, the gathered
    senior, the runtime); None where a budget is set."""
    if s.kv_cache_gib is not None:
        return None
    gpu = s.accelerator == "gpu"
    before = {**_held(s, "rollout"), **_compute(s, "rollout")}
    runtime = RUNTIME_BYTES if gpu else 0
    sharing = 1 if gpu else s.local_ranks
    on_senior = sum(v for (where, _), v in before.items() if shared or where == "senior")
    free = {"senior": (devices[0][1] - sharing * (on_senior + runtime)) // sharing}
    if not shared:
        away = _junior_index(s, 0, len(devices), [], [])
        if away is not None and away != 0:
            held = before.get(("junior", "junior_weights"), 0)
            users = s.local_ranks
            free["junior"] = (devices[away][1] - users * (held + runtime)) // users
    return free


def _resident(s: Settings, phase: str) -> dict[tuple[str, str], int]:
    """The senior's float32 master weights and optimizer state on its device in ``phase``:
    always (``offload=none``), never (``fsdp``), or where the phase reads them
    (``between_phases``: ``tandem.modules.grpo.TandemGRPO.place``)."""
    layout = s.offloaded
    shards = layout == "none" or (layout == "between_phases" and phase != "rollout")
    # the torch engine's rollout reads the shards; vLLM's reads its own copy
    shards |= layout == "between_phases" and phase == "rollout" and s.backend != "vllm"
    state = layout == "none" or (layout == "between_phases" and phase in ("update", "step"))
    shard = math.ceil(s.senior.params / s.shards) * s.weight_bytes
    return {
        ("senior", "senior_weights"): shard if shards else 0,
        ("senior", "optimizer_state"): shard * s.optimizer_states if state else 0,
    }


def _gradients(s: Settings, phase: str) -> dict[tuple[str, str], int]:
    """Gradients on the senior's device. A sharded senior's accumulate unsharded, whole and in
    the reduce dtype, over a mini-batch's micro-batches (reduced once, in the last backward:
    the update's peak holds them all); reduced, they are shards (on the host under
    ``offload=fsdp``)."""
    shard = math.ceil(s.senior.params / s.shards) * s.weight_bytes
    grads = 0 if s.offloaded == "fsdp" else shard
    accumulated = 0
    if s.strategy == "fsdp2" and s.accumulates and phase == "update":
        reduce = s.reduce_dtype or s.param_dtype or "float32"
        accumulated, grads = s.senior.params * DTYPE_BYTES[reduce], 0
    # DDP reduces through buckets that copy every gradient (gradient_as_bucket_view is off)
    buckets = s.senior.params * s.weight_bytes if s.strategy == "ddp" else 0
    return {
        ("senior", "gradients"): grads,
        ("senior", "accumulated_gradients"): accumulated,
        ("senior", "ddp_buckets"): buckets,
    }


def _compute(s: Settings, phase: str) -> dict[tuple[str, str], int]:
    """The senior's weights as its computation reads them, beside the master weights."""
    sen, cb = s.senior, s.compute_bytes
    if s.strategy == "fsdp2":
        # the root unit (embeddings, final norm) stays gathered; a layer, and the next prefetched
        unit = (sen.root_params + 2 * sen.layer_params) * cb
        if phase == "rollout":
            value = sen.params * cb if s.rollout_gather == "whole" else unit
        elif phase == "update":
            gathered = unit if s.reshard_after_forward else sen.params * cb
            # unsharded gradients before their reduce-scatter: the root's, one layer's (and its
            # float32 copy when gradients are reduced in float32)
            reduce = 4 if (s.reduce_dtype or s.param_dtype or "float32") == "float32" else cb
            extra = sen.layer_params * reduce if reduce != cb else 0
            value = gathered + (sen.root_params + sen.layer_params) * cb + extra
        elif phase == "old_logprobs":
            value = unit
        else:
            value = 0
        return {("senior", "gathered_senior"): value}
    if not s.autocast:
        return {}
    # under inference_mode (the engine) autocast casts each weight for its op and caches none;
    # with autograd on, it caches a cast of every weight until training_step ends
    rollout = phase == "rollout"
    value = max(sen.layer_params, sen.head_params) * cb if rollout else sen.params * cb
    return {("senior", "compute_copy"): value}


def _rollout(
    s: Settings, kv_free: dict[str, int] | None, shared: bool
) -> dict[tuple[str, str], int]:
    prompts = act.kv_prompts(s, shared, kv_free)
    senior_bpt, junior_bpt = act.kv_per_token(s)
    forward = act.rollout_forward(s, prompts, shared)
    out = {("senior", "kv_cache_senior"): act.kv_rows_bytes(s, senior_bpt, prompts)}
    if shared:
        out[("senior", "rollout_forward")] = forward["senior"]
    else:
        out[("senior", "rollout_forward_senior")] = forward["senior"]
        out[("junior", "rollout_forward_junior")] = forward["junior"]
    if s.junior_reads:
        out[("junior", "kv_cache_junior")] = act.kv_rows_bytes(s, junior_bpt, prompts)
    return out
