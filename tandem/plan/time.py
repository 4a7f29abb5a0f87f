"""The seconds of one training step, phase by phase, beside the memory plan.

``make_time_plan(cfg, memory_plan, device)`` plans one process's step (every process does as
much at once) on a named device (``tandem.plan.devices``: A100, H100, H200) or this machine's
CPU (measured by ``probe_cpu``). Each phase's passes (``tandem.plan.work``: FLOPs, bytes,
exponentials and dispatched ops from the models' shapes) are put against the device's roofs:

- ``rollout``: the torch engine's prefill, decode steps, draws and dispatch, or the vLLM pair
  engine's (``tandem.plan.time_rollout``);
- ``old_logprobs``, ``ref_logprobs``, ``update``, ``step``, ``weight_sync``, ``offload``: the
  trainer's (``tandem.plan.time_trainer``).

Every term is seconds per training step (a batch of rollouts); ``step_s`` is their sum and
``run_h`` the hours of ``trainer.max_steps`` steps (validation, checkpoints and the reward
aside). Every row is at its longest (``generation.max_new_tokens``), a bound, as in the memory
plan; ``response_tokens`` plans the trainer's passes at a mean response length instead (the
decode still runs to the longest row).

``benchmarks/plan_time.py`` holds the formulas to real training steps on this CPU.

What this file leaves out: the memory (``tandem.plan.memory``) and the table
(``tandem.plan.report``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from omegaconf import DictConfig

from tandem.plan.activations import junior_compute_bytes, kv_per_token
from tandem.plan.devices import Device
from tandem.plan.memory import Plan
from tandem.plan.probe import probe_cpu
from tandem.plan.settings import Settings
from tandem.plan.time_rollout import torch_rollout, vllm_rollout
from tandem.plan.time_settings import TimeSettings
from tandem.plan.time_trainer import (
    Pack,
    logprob_passes,
    micro_batches,
    offload,
    optimizer,
    update,
    weight_sync,
)

PHASES = ("rollout", "old_logprobs", "ref_logprobs", "update", "step", "weight_sync", "offload")


@dataclass(frozen=True)
class TimePlan:
    """Seconds of one training step, ``phases[phase][term]``, on ``count`` x ``device``."""

    device: Device
    count: int
    phases: dict[str, dict[str, float]]
    max_steps: int
    notes: tuple[str, ...] = field(default=())

    def phase_s(self, phase: str) -> float:
        """Seconds of one phase of a step."""
        return sum(self.phases.get(phase, {}).values())

    @property
    def step_s(self) -> float:
        """Seconds of one training step."""
        return sum(self.phase_s(p) for p in self.phases)

    @property
    def run_h(self) -> float:
        """Hours of ``trainer.max_steps`` training steps."""
        return self.step_s * self.max_steps / 3600


def plan_time(
    s: Settings,
    t: TimeSettings,
    device: Device,
    count: int = 1,
    prompts_per_pass: int | None = None,
    packs: list[Pack] | None = None,
) -> TimePlan:
    """The time plan of one process's training step.

    Args:
        s: the memory plan's settings.
        t: the rest (``TimeSettings``).
        device: the kind of device each process trains on.
        count: devices of that kind on one machine.
        prompts_per_pass: prompt groups the torch engine generates at once (the KV budget's;
            None: every prompt of the process at once).
        packs: the micro-batches of one pass over the rows (None: as ``micro_batches`` packs
            rows at their longest; a measurement gives those it saw).
    """
    notes: list[str] = []
    phases: dict[str, dict[str, float]] = {}
    if s.junior_reads and s.junior.vocab != s.senior.vocab and s.backend != "vllm":
        notes.append(
            "the junior has a vocabulary of its own: the cross-vocabulary engine's rollout is "
            "planned as the same-vocabulary engine's (one token a step for each model)."
        )
    if s.backend == "vllm":
        phases["rollout"] = vllm_rollout(s, t, device, notes)
    else:
        phases["rollout"] = torch_rollout(s, t, device, prompts_per_pass or s.prompts_per_rank)
    packs = micro_batches(s, t) if packs is None else packs
    if s.old_pass:
        phases["old_logprobs"] = logprob_passes(s, t, device, s.senior, s.compute_bytes, packs)
    if s.junior_reference:
        cb = junior_compute_bytes(s)
        phases["ref_logprobs"] = logprob_passes(s, t, device, s.junior, cb, packs)
    phases["update"] = update(s, t, device, packs)
    phases["step"] = optimizer(s, t, device, notes)
    if s.backend == "vllm":
        phases["weight_sync"] = weight_sync(s, t, device)
    phases["offload"] = offload(s, t, device, packs)
    kept = {p: {k: v for k, v in terms.items() if v > 0} for p, terms in phases.items()}
    kept = {p: terms for p, terms in kept.items() if terms}
    return TimePlan(device, count, kept, t.max_steps, tuple(dict.fromkeys(notes)))


def make_time_plan(
    cfg: DictConfig,
    memory: Plan,
    device: Device | None = None,
    response_tokens: int | None = None,
) -> TimePlan:
    """The time plan of a composed training config, beside its memory plan.

    Args:
        cfg: the config, as ``tandem.train`` composes it.
        memory: its memory plan (the settings, the devices, and the prompt groups the torch
            engine's KV budget holds at once).
        device: the kind of device (None: this machine's CPU, probed at the config's threads).
        response_tokens: plan the trainer's passes at this mean response length.
    """
    s = memory.settings
    t = TimeSettings.from_config(cfg, s.accelerator == "gpu")
    if response_tokens is not None:
        t = replace(t, response_tokens=min(response_tokens, s.max_new_tokens))
    device = device if device is not None else probe_cpu(t.threads)
    return plan_time(s, t, device, len(memory.devices), prompts_per_pass(memory))


def prompts_per_pass(memory: Plan) -> int | None:
    """Prompt groups the torch engine reads at once, from the memory plan's KV cache term (a
    pass's rows reserve every position: ``kv_rows_bytes``); None where it has none."""
    s = memory.settings
    senior_bpt, _ = kv_per_token(s)
    held = memory.devices[0].phases.get("rollout", {}).get("kv_cache_senior")
    if not held or not senior_bpt:
        return None
    # on a CPU every process's caches are in the one device's term
    sharing = 1 if s.accelerator == "gpu" else s.local_ranks
    return max(1, round(held / sharing / (senior_bpt * s.group_size * s.row_tokens)))
