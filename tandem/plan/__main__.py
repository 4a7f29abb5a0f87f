"""``python -m tandem.plan [--config-name NAME] [--devices COUNTxGIB] [overrides]``.

Composes the config as ``tandem.train`` does (``conf/``, the same overrides), checks it as a run
would (its keys and values, its model folders), prints every device's bytes by phase and term,
the fixes where it does not fit, and last one JSON line (``peak_gib``, ``fits``, ``devices``,
``terms``, ``fixes``, ...). Exit status 0 whether the run fits or not (it is a report); 2, with
one message and no traceback, for a config that does not compose or cannot be planned, or
devices it does not use.

``--devices 2x80``: two devices of 80 GiB each (``1x141``: one H200). Without it: this
machine's GPUs, or its host memory for a CPU config; a GPU config on a machine without CUDA
needs it.
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
from tandem.plan.report import summary, table

CONF = Path(__file__).resolve().parents[2] / "conf"


def parse_devices(text: str, accelerator: str) -> tuple[tuple[str, int], ...]:
    """``COUNTxGIB`` (``2x80``) -> ``(name, bytes)`` per device (``cpu`` for a CPU config)."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+(?:\.\d+)?)\s*", text)
    if not match or int(match.group(1)) < 1 or float(match.group(2)) <= 0:
        raise ConfigError(
            f"--devices ({text!r}) must be COUNTxGIB with a count >= 1 and a size > 0, e.g. 2x80 "
            "for two 80 GiB devices."
        )
    count, size = int(match.group(1)), int(float(match.group(2)) * GiB)
    if accelerator != "gpu":
        return (("cpu", size),)
    return tuple((f"cuda:{i}", size) for i in range(count))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tandem.plan", description=__doc__)
    parser.add_argument("--config-name", "-cn", default="train")
    parser.add_argument("--devices", default=None, help="COUNTxGIB, e.g. 2x80")
    parser.add_argument(
        "--host-gib",
        type=float,
        default=None,
        help="the GPU machine's host memory, GiB (default: this machine's, without --devices)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as tandem.train takes")
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = _compose(args.config_name, args.overrides)
        plan = _plan(cfg, args.devices, args.host_gib)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    print(table(plan))
    print(json.dumps(summary(plan)))
    return 0


def _plan(cfg: DictConfig, devices_arg: str | None, host_gib: float | None = None) -> Plan:
    """The plan of a composed config, or ``ConfigError`` for a config or devices it cannot
    plan: the config's own problems and its model folders are checked first, as a run checks
    them, so that the formulas never meet a value they cannot take."""
    from tandem.config import check_before_imports
    from tandem.config_models import check_model_folder
    from tandem.train import world_size

    check_before_imports(cfg, world_size(cfg))
    problems: list[str] = []
    for key in ("name_or_path", "junior_name_or_path"):
        value = cfg.model.get(key)
        if value is not None:
            check_model_folder(problems, f"model.{key}", value, tokenizer=False)
    if problems:
        raise ConfigError("\n".join(problems))
    accelerator = str(cfg.trainer.get("accelerator", "cpu"))
    accelerator = "gpu" if accelerator in ("gpu", "cuda", "auto") else "cpu"
    devices = None
    if devices_arg is not None:
        devices = parse_devices(devices_arg, accelerator)
    elif accelerator == "gpu":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "the config trains on GPUs and this machine has no CUDA: give the devices "
                "to plan for, e.g. --devices 2x80."
            )
    if host_gib is not None and not host_gib > 0:
        raise ConfigError(f"--host-gib ({host_gib:g}) must be a size in GiB above 0.")
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
