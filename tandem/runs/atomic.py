"""Writing a checkpoint whole or not at all, with its checksum beside it.

``AtomicCheckpointIO`` is the trainer's checkpoint plugin: each checkpoint is written to
``<name>.tmp-<pid>``, hashed as it is written, flushed to disk, and renamed into place only after
its checksum file (``<name>.sha256``, the format ``sha256sum -c`` reads) is, so that a file under
its final name is whole. A disk that fills during the write is one ``DiskFull`` line.

What this file leaves out: reading and verifying checkpoints (``tandem.runs.checkpoints``).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, BinaryIO

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from tandem.runs import DiskFull
from tandem.runs.checkpoints import _fsync_dir, _replace, disk_full_message, out_of_space
from tandem.runs.faults import fault_point


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` that writes whole files or nothing, each with its sha256."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None
    ) -> None:
        import torch

        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
        try:
            with tmp.open("wb") as f:
                writer = _HashingWriter(f)
                torch.save(checkpoint, writer)
                f.flush()
                os.fsync(f.fileno())
        except (OSError, RuntimeError) as err:  # torch's zip writer fails after the OSError
            tmp.unlink(missing_ok=True)
            if not out_of_space(err):
                raise
            raise DiskFull(disk_full_message(path.parent, _nbytes(checkpoint))) from None
        fault_point("checkpoint", int(checkpoint.get("global_step", -1)))
        _replace(path.with_name(path.name + ".sha256"), f"{writer.hexdigest()}  {path.name}\n")
        os.replace(tmp, path)
        _fsync_dir(path.parent)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        super().remove_checkpoint(path)
        Path(f"{path}.sha256").unlink(missing_ok=True)


def _nbytes(value: Any) -> int:
    """The bytes of the tensors in a checkpoint's nested dicts and lists."""
    if isinstance(value, torch.Tensor):
        return value.nelement() * value.element_size()
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


class _HashingWriter:
    """A write-only file that hashes what passes through (saves reading a checkpoint back)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._h = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self._h.update(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def hexdigest(self) -> str:
        return self._h.hexdigest()
