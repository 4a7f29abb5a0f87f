"""``python -m tandem.plan [--config-name NAME] [--devices COUNTxKIND] [overrides]``.

Composes the config as ``tandem.train`` does (``conf/``, the same overrides), prints every
device's bytes by phase and term, the fixes where it does not fit, the seconds of a training
step by phase and the hours of ``trainer.max_steps`` (``tandem.plan.time``), and last one JSON
line (``peak_gib``, ``fits``, ``devices``, ``terms``, ``fixes``, ``step_s``, ``run_h``,
``phase_s``, ...). Exit status 0 whether the run fits or not (it is a report); 2 for a config
that does not compose or cannot be planned, or devices the plan does not know.

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

from tandem.errors import ConfigError
from tandem.plan import GiB, make_plan
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
    if not match or int(match.group(1)) < 1:
        raise ConfigError(
            f"--devices ({text!r}) must be COUNTxKIND or COUNTxGIB: e.g. 2xa100 for two A100 "
            f"80 GB (kinds: {', '.join(NAMED)}), or 2x80 for two 80 GiB devices."
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
        accelerator = str(cfg.trainer.get("accelerator", "cpu"))
        accelerator = "gpu" if accelerator in ("gpu", "cuda", "auto") else "cpu"
        devices = None
        if args.devices is not None:
            devices = parse_devices(args.devices, accelerator)
        elif accelerator == "gpu":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError(
                    "the config trains on GPUs and this machine has no CUDA: give the devices "
                    "to plan for, e.g. --devices 2x80."
                )
        if args.host_gib is not None and not args.host_gib > 0:
            raise ConfigError(f"--host-gib ({args.host_gib:g}) must be a size in GiB above 0.")
        host = None if args.host_gib is None else int(args.host_gib * GiB)
        plan = make_plan(cfg, devices=devices, host_bytes=host)
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


def _compose(name: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose(config_name=name, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(str(err).split("\nConfig search path:")[0].strip()) from err


if __name__ == "__main__":
    sys.exit(main())
