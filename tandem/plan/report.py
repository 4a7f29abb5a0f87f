"""A plan as people read it (a table per device, and the time a step takes) and as programs
read it (one JSON object).

What this file leaves out: the figures themselves (``tandem.plan.memory``, ``tandem.plan.time``).
"""

from __future__ import annotations

from typing import Any

from tandem.plan.memory import MARGIN, DevicePlan, Fix, GiB, Plan
from tandem.plan.settings import Settings
from tandem.plan.time import TimePlan

PHASE_LABELS = {
    "load": "load",
    "rollout": "rollout",
    "old_logprobs": "old log-probs",
    "ref_logprobs": "ref log-probs",
    "update": "update",
    "step": "optim. step",
}
TERM_LABELS = {
    "senior_weights": "senior weights",
    "optimizer_state": "optimizer state",
    "gradients": "gradients",
    "accumulated_gradients": "gradients, accumulating",
    "ddp_buckets": "DDP gradient buckets",
    "compute_copy": "compute copy (autocast)",
    "gathered_senior": "gathered senior (FSDP2)",
    "junior_weights": "junior weights",
    "kv_cache_senior": "KV cache, senior",
    "kv_cache_junior": "KV cache, junior",
    "rollout_forward": "prefill or decode step",
    "rollout_forward_senior": "rollout forward, senior",
    "rollout_forward_junior": "rollout forward, junior",
    "forward_senior": "no-grad forward, senior",
    "forward_junior": "no-grad forward, junior",
    "activations": "activations",
    "attention_mask": "attention mask",
    "backward": "backward working set",
    "step_temp": "AdamW step temporaries",
    "runtime": "runtime (CUDA, NCCL)",
    "vllm_engine": "vLLM engine (both models, KV)",
    "host_runtime": "processes (Python, torch)",
    "senior_load": "senior read in float32",
    "junior_load": "junior read",
    "rollout_tensors": "rollout tensors",
    "update_inputs": "update inputs (ids, masks)",
}


OFFLOAD_WORDS = {
    "none": "",
    "fsdp": ", shards, gradients and optimizer state on the host (FSDP2's offload, step there)",
    "between_phases": ", shards and optimizer state on the host between phases (verl's offload)",
}


def gib(n: int) -> float:
    return round(n / GiB, 3)


def count(n: int) -> str:
    """4.02B, 1.84M: a parameter count in a few digits."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def describe(s: Settings) -> list[str]:
    """The settings the figures follow from, in a few lines."""
    sen, jun = s.senior, s.junior
    if s.strategy == "fsdp2":
        how = (
            f"FSDP2 over {s.world} processes, computing in {s.compute_dtype}"
            f"{', activation checkpointing' if s.activation_checkpointing else ''}"
            f", rollouts read the senior {s.rollout_gather.replace('_', ' ')}"
            f"{OFFLOAD_WORDS[s.offloaded]}"
        )
    else:
        kind = "one process" if s.strategy == "single" else f"DDP over {s.world} processes"
        how = f"{kind}, precision {s.precision} (computing in {s.compute_dtype})"
    budget = s.max_tokens_per_micro_batch
    rows = -(-s.rows_per_rank // s.mini_batches)
    kv = (
        "KV caches in 90% of the memory free when it starts (generation.kv_cache_gib null)"
        if s.kv_cache_gib is None
        else f"KV budget {s.kv_cache_gib:g} GiB"
    )
    if s.backend == "vllm":
        kv = f"sampled by vLLM in {s.vllm_utilization:g} of the device, {s.vllm_dtype}"
    where = s.junior_device or "each process's device"
    return [
        f"senior {sen.architecture} ({sen.name}): {count(sen.params)} parameters, float32 "
        f"master weights; junior {count(jun.params)} in {s.model_dtype} on {where}"
        f"{'' if s.junior_reads else ' (not reading along in training rollouts)'}",
        f"trainer: {how}",
        f"rollout: {s.rows_per_rank} rows a process x {s.row_tokens} positions "
        f"({s.prompt_tokens} prompt + {s.max_new_tokens} new), {kv}",
        f"update: micro-batches of up to {s.micro_tokens:,} tokens ({rows} rows a mini-batch, "
        f"{'no token budget' if budget is None else f'budget {budget:,}'}); LM head in chunks "
        f"of {s.logprob_chunk_tokens} tokens",
    ]


def table(plan: Plan) -> str:
    """Every device's terms (GiB) by phase, its peak, and the fixes when it does not fit."""
    lines = ["Memory plan (GiB)", *(f"  {line}" for line in describe(plan.settings)), ""]
    for d in (*plan.devices, *([plan.host] if plan.host is not None else [])):
        phases = list(d.phases)
        verdict = "fits" if d.fits else "DOES NOT FIT"
        size = f"{gib(d.capacity):g} GiB ({gib(d.usable):.1f} usable)"
        if not d.capacity:  # a host of unknown size
            size, verdict = "size not given", "not checked (give --host-gib)"
        lines.append(
            f"{d.name}: {size}, peak {gib(d.peak):,.1f} in {PHASE_LABELS[d.peak_phase]}: {verdict}"
        )
        terms = [t for t in TERM_LABELS if any(t in d.phases[p] for p in phases)]
        head = f"  {'':<28}" + "".join(f"{PHASE_LABELS[p]:>15}" for p in phases)
        lines.append(head)
        for term in terms:
            cells = "".join(_cell(d.phases[p].get(term)) for p in phases)
            lines.append(f"  {TERM_LABELS[term]:<28}{cells}")
        lines.append(f"  {'total':<28}" + "".join(_cell(d.total(p)) for p in phases))
        lines.append("")
    for line in plan.problems:
        lines.append(f"problem: {line}")
    for line in plan.notes:
        lines.append(f"note: {line}")
    lines.append(
        f"peak {gib(plan.peak):,.1f} GiB: {'fits' if plan.fits else 'does not fit'} "
        f"({MARGIN:.0%} of each device kept for fragmentation)"
    )
    if not plan.fits:
        lines.extend(_fix_lines(plan))
    return "\n".join(lines)


def _cell(value: int | None) -> str:
    return f"{'-':>15}" if not value else f"{value / GiB:>15,.2f}"


def _fix_text(fix: Fix) -> str:
    note = f" ({fix.note})" if fix.note else ""
    verdict = "fits" if fix.fits else "still does not fit"
    return f"{' '.join(fix.overrides)}{note}: peak {gib(fix.peak):,.1f} GiB, {verdict}"


def _fix_lines(plan: Plan) -> list[str]:
    lines = []
    if plan.fixes:
        lines.append("each alone:")
        lines.extend(f"  {_fix_text(f)}" for f in plan.fixes)
    if plan.together is not None:
        lines.append(f"together: {_fix_text(plan.together)}")
    return lines


def summary(plan: Plan, timed: TimePlan | None = None) -> dict[str, Any]:
    """The plan as one JSON-ready mapping (GiB figures; with ``timed``, seconds too)."""
    fullest = max(plan.devices, key=lambda d: d.peak)
    s = plan.settings
    return {
        **_time_json(timed),
        "peak_gib": gib(plan.peak),
        "fits": plan.fits,
        "devices": [
            {
                "name": d.name,
                "capacity_gib": gib(d.capacity),
                "usable_gib": gib(d.usable),
                "peak_gib": gib(d.peak),
                "peak_phase": d.peak_phase,
                "fits": d.fits,
                "phases": {
                    p: {t: gib(v) for t, v in terms.items()} for p, terms in d.phases.items()
                },
            }
            for d in plan.devices
        ],
        # the fullest device's terms in its peak phase
        "terms": {t: gib(v) for t, v in fullest.phases[fullest.peak_phase].items()},
        "senior_params": s.senior.params,
        "junior_params": s.junior.params,
        "world_size": s.world,
        "host": None if plan.host is None else _host_json(plan.host),
        "micro_batch_tokens": s.micro_tokens,
        "rollout_positions": s.row_tokens,
        "problems": list(plan.problems),
        "notes": list(plan.notes),
        "fixes": [_fix_json(f) for f in plan.fixes],
        "together": None if plan.together is None else _fix_json(plan.together),
    }


def _host_json(host: DevicePlan) -> dict[str, Any]:
    return {
        "capacity_gib": gib(host.capacity) if host.capacity else None,
        "peak_gib": gib(host.peak),
        "peak_phase": host.peak_phase,
        "fits": host.fits if host.capacity else None,
        "phases": {p: {t: gib(v) for t, v in terms.items()} for p, terms in host.phases.items()},
    }


def _fix_json(fix: Fix) -> dict[str, Any]:
    return {
        "overrides": list(fix.overrides),
        "peak_gib": gib(fix.peak),
        "fits": fix.fits,
        "note": fix.note,
    }


def refusal(plan: Plan) -> str:
    """Why a run that does not fit is refused, and what would make it fit."""
    fullest = max(plan.devices, key=lambda d: d.peak)
    if fullest.fits and plan.host is not None and plan.host.capacity and not plan.host.fits:
        return _host_refusal(plan.host)
    top = sorted(fullest.phases[fullest.peak_phase].items(), key=lambda kv: -kv[1])[:4]
    terms = ", ".join(f"{TERM_LABELS[t]} {gib(v):,.1f}" for t, v in top)
    lines = [
        f"the run does not fit in memory: {fullest.name} needs {gib(fullest.peak):,.1f} GiB in "
        f"its {PHASE_LABELS[fullest.peak_phase]} phase, of {gib(fullest.usable):,.1f} usable "
        f"({gib(fullest.capacity):g} GiB less {MARGIN:.0%}); the largest terms (GiB): {terms}.",
        *plan.problems,
    ]
    if plan.together is not None and plan.together.fits:
        lines.append(f"Set {' '.join(plan.together.overrides)} (peak {gib(plan.together.peak)}).")
    lines.extend(_fix_lines(plan))
    lines.append("Every term: python -m tandem.plan with the same config and overrides.")
    return "\n".join(lines)


def _host_refusal(host: DevicePlan) -> str:
    top = sorted(host.phases[host.peak_phase].items(), key=lambda kv: -kv[1])[:4]
    terms = ", ".join(f"{TERM_LABELS.get(t, t)} {gib(v):,.1f}" for t, v in top)
    return (
        f"the run does not fit in memory: the host needs {gib(host.peak):,.1f} GiB in its "
        f"{PHASE_LABELS[host.peak_phase]} phase, of {gib(host.usable):,.1f} usable "
        f"({gib(host.capacity):g} GiB less {MARGIN:.0%}); the largest terms (GiB): {terms}. "
        "The host holds what each process reads before its models move to their devices, and "
        "what trainer.strategy.offload keeps there: between_phases keeps less than fsdp (no "
        "gradients), none keeps nothing but the processes. Use a machine with more host "
        "memory, fewer processes a machine, or offload less.\n"
        "Every term: python -m tandem.plan with the same config and overrides."
    )


TIME_PHASE_LABELS = {
    **PHASE_LABELS,
    "weight_sync": "weight sync",
    "offload": "offload moves",
}
TIME_TERM_LABELS = {
    "prefill": "prefill",
    "decode": "decode (device)",
    "sampling": "draws, log-probs",
    "dispatch": "eager dispatch",
    "gather": "FSDP2 gathers",
    "vllm_host": "vLLM host work",
    "vllm_wake": "vLLM wake",
    "vllm_sleep": "vLLM sleep",
    "forward": "forward",
    "forward_backward": "forward, backward",
    "recompute": "recomputation",
    "collectives": "collectives",
    "adamw": "AdamW, clipping",
    "adamw_host": "AdamW on the host",
    "sync": "weights into vLLM",
    "moves": "host link",
}


def time_table(timed: TimePlan) -> str:
    """Seconds of one training step by phase and term, and hours for ``trainer.max_steps``."""
    d = timed.device
    lines = [
        f"Time plan, computed ({timed.count} x {d.label}; {d.source}): seconds a training step"
    ]
    for phase, terms in timed.phases.items():
        parts = ", ".join(f"{TIME_TERM_LABELS.get(t, t)} {_seconds(v)}" for t, v in terms.items())
        lines.append(
            f"  {TIME_PHASE_LABELS.get(phase, phase):<16}{_seconds(timed.phase_s(phase)):>10}"
            f"   {parts}"
        )
    lines.append(
        f"  {'step':<16}{_seconds(timed.step_s):>10}   ({timed.step_s / 60:.2f} min); "
        f"{timed.max_steps} steps: {timed.run_h:,.1f} h"
    )
    lines.extend(f"note: {line}" for line in timed.notes)
    return "\n".join(lines)


def _seconds(value: float) -> str:
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def _time_json(timed: TimePlan | None) -> dict[str, Any]:
    """``step_s``, ``run_h`` and the seconds of each phase and term (null without a time plan)."""
    if timed is None:
        return {"step_s": None, "run_h": None, "phase_s": None, "time": None}
    return {
        "step_s": round(timed.step_s, 4),
        "run_h": round(timed.run_h, 3),
        "phase_s": {p: round(timed.phase_s(p), 4) for p in timed.phases},
        "time": {
            "device": timed.device.kind,
            "count": timed.count,
            "max_steps": timed.max_steps,
            "terms_s": {
                p: {t: round(v, 4) for t, v in terms.items()} for p, terms in timed.phases.items()
            },
            "notes": list(timed.notes),
        },
    }
