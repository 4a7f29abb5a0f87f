"""``python -m tandem.plan [--config-name NAME] [--devices COUNTxKIND] [overrides]``.

Composes the config as ``tandem.train`` does (``conf/``, the same overrides), checks it as a run
would (its keys and values, its model folders), prints every device's bytes by phase and term,
the fixes where it does not fit, the seconds of a training step by phase and the hours of
``trainer.max_steps`` (``tandem.plan.time``), and last one JSON line (``peak_gib``, ``fits``,
``devices``, ``terms``, ``fixes``, ``step_s``, ``run_h``, ``phase_s``, ...). Exit status 0
whether the run fits or not (it is a report); 2, with one message and no traceback, for a
config that does not compose or cannot be planned, or devices the plan does not know or the run
does not use.

``--devices 2xa100``: two A100 80 GB (``2xh100``, ``1xh200``: the kinds of
``tandem.plan.devices``), their memory and their roofs; ``--devices 2x80``: two devices of 80
GiB, memory only (no time plan for a GPU config: name the kind). Without it: this machine's
GPUs (timed where the plan knows their kind), or its CPU for a CPU config (timed by a short
probe); a GPU config on a machine without CUDA needs it. ``--response-tokens N`` plans the
trainer's passes at a mean response length of N instead of every row at its longest.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from omegaconf import DictConfig

from tandem.errors import ConfigError
from tandem.plan import GiB, Plan, make_plan
from tandem.plan.devices import NAMED, Device, local_gpu, named
from tandem.plan.report import summary, table, time_table
from tandem.plan.time import make_time_plan

CONF = Path(__file__).resolve().parents[2] / "conf"


def parse_devices(text: str, accelerator: str) -> tuple[tuple[str, int], ...]:
    """``COUNTxGIB`` (``2x80``) or ``COUNTxKIND`` (``2xa100``) -> ``(name, bytes)`` per device
    (``cpu`` for a CPU config)."""
    count, size, kind = _devices_arg(text)
    if kind is not None and accelerator != "gpu":
        raise ConfigError(
            f"--devices ({text!r}) names GPUs, but the config trains on the CPU "
            "(trainer.accelerator): add a GPU trainer (trainer=gpu, trainer=fsdp_gpu) or give "
            "COUNTxGIB."
        )
    if accelerator != "gpu":
        return (("cpu", size),)
    return tuple((f"cuda:{i}", size) for i in range(count))


def device_kind(text: str | None, accelerator: str) -> Device | None:
    """The kind of device the time plan puts the run on: the one ``--devices`` names, else this
    machine's GPU where the plan knows it; None: the CPU (a CPU config) or unknown."""
    if text is not None:
        return _devices_arg(text)[2]
    return local_gpu() if accelerator == "gpu" else None


def _devices_arg(text: str) -> tuple[int, int, Device | None]:
    """``(count, bytes each, the named kind or None)`` of ``--devices``."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+(?:\.\d+)?|[A-Za-z]\w*)\s*", text)
    zero = match is not None and match.group(2)[0].isdigit() and float(match.group(2)) <= 0
    if not match or int(match.group(1)) < 1 or zero:
        raise ConfigError(
            f"--devices ({text!r}) must be COUNTxKIND or COUNTxGIB with a count >= 1 and a size "
            f"> 0: e.g. 2xa100 for two A100 80 GB (kinds: {', '.join(NAMED)}), or 2x80 for two "
            "80 GiB devices."
        )
    count, size = int(match.group(1)), match.group(2)
    if size[0].isalpha():
        kind = named(size, text)
        return count, kind.memory, kind
    return count, int(float(size) * GiB), None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tandem.plan", description=__doc__)
    parser.add_argument("--config-name", "-cn", default="train")
    parser.add_argument("--devices", default=None, help="COUNTxKIND (2xa100) or COUNTxGIB (2x80)")
    parser.add_argument(
        "--host-gib",
        type=float,
        default=None,
        help="the GPU machine's host memory, GiB (default: this machine's, without --devices)",
    )
    parser.add_argument("--response-tokens", type=int, default=None, help="mean response length")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as tandem.train takes")
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = _compose(args.config_name, args.overrides)
        plan = _plan(cfg, args.devices, args.host_gib)
        accelerator = _accelerator(cfg)
        kind = device_kind(args.devices, accelerator)
        timed = None
        if kind is not None or accelerator != "gpu":
            timed = make_time_plan(cfg, plan, kind, args.response_tokens)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    print(table(plan))
    print()
    if timed is None:
        print(f"no time plan: name the GPUs' kind, e.g. --devices 2x{next(iter(NAMED))}.")
    else:
        print(time_table(timed))
    print(json.dumps(summary(plan, timed)))
    return 0


def _plan(cfg: DictConfig, devices_arg: str | None, host_gib: float | None = None) -> Plan:
    """The plan of a composed config, or ``ConfigError`` for a config or devices it cannot
    plan: the config's own problems and its model folders are checked first, as a run checks
    them, so that the formulas never meet a value they cannot take."""
    from tandem.config import check_before_imports
    from tandem.train import world_size

    # the arguments first: they need no library (the model folders' check loads transformers)
    accelerator = _accelerator(cfg)
    devices = None if devices_arg is None else parse_devices(devices_arg, accelerator)
    if host_gib is not None and not host_gib > 0:
        raise ConfigError(f"--host-gib ({host_gib:g}) must be a size in GiB above 0.")
    check_before_imports(cfg, world_size(cfg))
    from tandem.config_models import check_model_folder

    problems: list[str] = []
    for key in ("name_or_path", "junior_name_or_path"):
        value = cfg.model.get(key)
        if value is not None:
            check_model_folder(problems, f"model.{key}", value, tokenizer=False)
    if problems:
        raise ConfigError("\n".join(problems))
    if devices_arg is None and accelerator == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "the config trains on GPUs and this machine has no CUDA: give the devices "
                "to plan for, e.g. --devices 2x80."
            )
    host = None if host_gib is None else int(host_gib * GiB)
    plan = make_plan(cfg, devices=devices, host_bytes=host)
    idle = [d.name for d in plan.devices if not d.phases]
    if idle and devices_arg is not None:
        used = len(plan.devices) - len(idle)
        raise ConfigError(
            f"--devices {devices_arg} gives {len(plan.devices)} devices, but the run uses "
            f"{used} of them (trainer.devices={cfg.trainer.get('devices')}, the junior on "
            f"{cfg.model.get('junior_device') or 'the senior' + chr(39) + 's device'}), so "
            f"{', '.join(idle)} would hold nothing. Give --devices {used}x<GiB>, or use them: "
            "trainer.devices, or model.junior_device=cuda:<n> for the junior's own GPU."
        )
    return plan


def _accelerator(cfg: DictConfig) -> str:
    """``gpu`` or ``cpu``: what ``trainer.accelerator`` trains on."""
    accelerator = str(cfg.trainer.get("accelerator", "cpu"))
    return "gpu" if accelerator in ("gpu", "cuda", "auto") else "cpu"


def _compose(name: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name=name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(str(err).split("\nConfig search path:")[0].strip()) from err


def one_line(plan: Plan) -> str:
    """The plan in a line, as a run states it at its start when it fits (the table: this
    command, or the run's ``run_info.json``)."""
    fullest = max(plan.devices, key=lambda d: d.peak)
    verdict = "fits" if plan.fits else "does not fit"
    return (
        f"memory plan: peak {fullest.peak / GiB:,.2f} GiB of {fullest.usable / GiB:,.1f} usable "
        f"on {fullest.name} (its {fullest.peak_phase} phase): {verdict}"
    )


if __name__ == "__main__":
    from tandem.runs.leave import leave

    leave(main())  # within a second of the last line, not after the interpreter's teardown
