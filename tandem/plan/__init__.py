"""A memory plan before anything loads: every byte each device holds in every phase of a
training step, from the models' ``config.json`` and the composed config alone.

``python -m tandem.plan --config-name reproduce_paper --devices 2x80`` prints the plan;
``check_plan(cfg, world_size)`` is what a run calls at its start: it returns the plan, or raises
``PlanError`` (a ``ConfigError``: ``tandem.train`` refuses the start with exit status 2) naming
the fullest device, its peak, and the overrides that would make the run fit.

Layout: ``shape`` (a model's sizes from its config, on the meta device), ``settings`` (the keys
that decide memory), ``memory`` (the formulas, phase by phase), ``fixes`` (what would fit),
``report`` (the tables and the JSON line). Beside the bytes, the seconds of a step
(``tandem.plan.time``): ``time_settings`` (the keys that decide time), ``work`` (FLOPs, bytes and
dispatched ops of each pass), ``devices`` and ``probe`` (the named GPUs' roofs, this CPU's
measured ones), ``time_rollout`` and ``time_trainer`` (the phases).

Imports stay light (no Lightning, no model code until a shape is read), so a plan takes seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from omegaconf import DictConfig

from tandem.errors import ConfigError
from tandem.plan.fixes import find_fixes
from tandem.plan.memory import MARGIN, DevicePlan, Fix, GiB, Plan, plan_memory
from tandem.plan.settings import Settings
from tandem.plan.shape import ModelShape, model_shape

__all__ = [
    "MARGIN",
    "DevicePlan",
    "Fix",
    "GiB",
    "ModelShape",
    "Plan",
    "PlanError",
    "Settings",
    "check_plan",
    "local_devices",
    "make_plan",
    "model_shape",
    "plan_memory",
]


class PlanError(ConfigError):
    """A run whose plan does not fit its devices; ``plan`` holds every figure."""

    def __init__(self, message: str, plan: Plan) -> None:
        super().__init__(message)
        self.plan = plan


def local_devices(accelerator: str) -> tuple[tuple[str, int], ...]:
    """This machine's devices as ``(name, bytes)``: the GPUs' total memory, or the host's."""
    import torch

    if accelerator == "gpu" and torch.cuda.is_available():
        count = torch.cuda.device_count()
        return tuple(
            (f"cuda:{i}", torch.cuda.get_device_properties(i).total_memory) for i in range(count)
        )
    import psutil

    return (("cpu", psutil.virtual_memory().total),)


def make_plan(
    cfg: DictConfig,
    world_size: int | None = None,
    devices: Sequence[tuple[str, int]] | None = None,
    fixes: bool = True,
    host_bytes: int | None = None,
) -> Plan:
    """The plan of a composed training config.

    Args:
        cfg: the config, as ``tandem.train`` composes it.
        world_size: processes in all (None: ``trainer.devices`` x ``trainer.num_nodes``, with
            ``devices: auto`` as many as the devices given).
        devices: ``(name, bytes)`` of one machine's devices (None: this machine's).
        fixes: for a plan that does not fit, also find the overrides that would.
        host_bytes: a GPU machine's host memory (None: this machine's when ``devices`` is
            None, else unknown: the host's figures are shown, not checked).
    """
    if world_size is None:
        world_size = _world_size(cfg, None if devices is None else len(devices))
    s = Settings.from_config(cfg, world_size)
    if devices is None:
        devices = local_devices(s.accelerator)
        if host_bytes is None and s.accelerator == "gpu":
            import psutil

            host_bytes = psutil.virtual_memory().total
    plan = plan_memory(s, tuple(devices), host_bytes)
    if fixes and (plan.problems or not all(d.fits for d in plan.devices)):
        alone, together = find_fixes(s, devices)
        plan = replace(plan, fixes=alone, together=together)
    return plan


def check_plan(
    cfg: DictConfig,
    world_size: int,
    devices: Sequence[tuple[str, int]] | None = None,
    host_bytes: int | None = None,
) -> Plan:
    """The plan of a run about to start on this machine's devices (or ``devices``, with
    ``host_bytes`` of host memory); raises ``PlanError`` when it does not fit, with the figures
    and the overrides that would fit."""
    from tandem.plan.report import refusal

    plan = make_plan(cfg, world_size, devices, host_bytes=host_bytes)
    host_fits = plan.host is None or not plan.host.capacity or plan.host.fits
    if plan.problems and host_fits and all(d.fits for d in plan.devices):
        # every device holds its peak: what is refused is a setting of the layout (a KV budget
        # smaller than one prompt's group, a device not given), which the problems name
        raise PlanError(" ".join(plan.problems), plan)
    if not plan.fits:
        raise PlanError(refusal(plan), plan)
    return plan


def _world_size(cfg: DictConfig, given: int | None) -> int:
    trainer: Any = cfg.get("trainer") or {}
    devices = trainer.get("devices", 1)
    nodes = int(trainer.get("num_nodes", 1) or 1)
    if isinstance(devices, int) and devices > 0:
        return devices * nodes
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return len(devices) * nodes
    gpu = trainer.get("accelerator") in ("gpu", "cuda", "auto")
    return (given if given and gpu else 1) * nodes
