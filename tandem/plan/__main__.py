"""``python -m tandem.plan [--config-name NAME] [--devices COUNTxGIB] [overrides]``.

Composes the config as ``tandem.train`` does (``conf/``, the same overrides), prints every
device's bytes by phase and term, the fixes where it does not fit, and last one JSON line
(``peak_gib``, ``fits``, ``devices``, ``terms``, ``fixes``, ...). Exit status 0 whether the run
fits or not (it is a report); 2 for a config that does not compose or cannot be planned.

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

from tandem.errors import ConfigError
from tandem.plan import GiB, make_plan
from tandem.plan.report import summary, table

CONF = Path(__file__).resolve().parents[2] / "conf"


def parse_devices(text: str, accelerator: str) -> tuple[tuple[str, int], ...]:
    """``COUNTxGIB`` (``2x80``) -> ``(name, bytes)`` per device (``cpu`` for a CPU config)."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+(?:\.\d+)?)\s*", text)
    if not match or int(match.group(1)) < 1:
        raise ConfigError(
            f"--devices ({text!r}) must be COUNTxGIB, e.g. 2x80 for two 80 GiB devices."
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
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    print(table(plan))
    print(json.dumps(summary(plan)))
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
