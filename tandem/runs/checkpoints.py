"""Checkpoints that cannot betray a resume: atomic writes, checksums, the newest that verifies.

Every checkpoint goes through ``AtomicCheckpointIO`` (``tandem.runs.atomic``): it is written to
``<name>.tmp-<pid>``, hashed as it is written, flushed to disk, and renamed into place only after
its checksum file (``<name>.sha256``, the format ``sha256sum -c`` reads) is. So a file under its
final name is whole, and a file that no longer matches its checksum (truncated, overwritten) is
named and skipped: ``newest_verified`` falls back to the checkpoint before it. A sharded run's
distributed checkpoint is a folder, written the same way by
``tandem.modules.sharding.FSDP2Strategy``; its checksum file lists every file in it. Which step
checkpoints are written and kept is ``tandem.runs.steps``. This file imports neither torch nor
Lightning but to read a checkpoint's contents, so that a start checks its folder before they load.

What this file leaves out: which checkpoint a start asks for (``tandem.train``) and the signal
handling itself (``tandem.runs.signals``).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from tandem.runs import RunRefused

log = logging.getLogger(__name__)

STEP = re.compile(r"^step-(\d+)\.ckpt$")
# what marks a sharded run's checkpoint folder: Lightning's ``_METADATA_FILENAME`` (named here
# so that a start reads its checkpoints without importing Lightning; tests/runs/test_checkpoints
# compares the two)
METADATA = "meta.pt"
TEMPORARY = re.compile(r"\.(tmp|old)-\d+$")


def out_of_space(err: BaseException | None) -> OSError | None:
    """The "no space left on device" error behind ``err`` (itself or what it was raised from
    or while handling), or None."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return err
        err = err.__cause__ or err.__context__
    return None


def disk_full_message(folder: Path, needed: int | None, ckpt_dir: Path | None = None) -> str:
    """One line: where the disk filled, how much a write needs, what is on disk, what to do.
    ``ckpt_dir``: the run's checkpoint folder (None: ``folder`` is it). Measure after what the
    failed write left is removed, or the free space it still holds is counted as used."""
    ckpt_dir = Path(folder) if ckpt_dir is None else Path(ckpt_dir)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    need = f"a checkpoint needs about {needed / 2**20:,.0f} MiB" if needed else "it needs more"
    saved = sorted(step_checkpoints(ckpt_dir), key=lambda p: int(STEP.match(p.name)[1]))
    if saved:
        names = ", ".join(p.name for p in saved)
        held = f"The step checkpoints written before are whole ({names}): free some space"
        resume = "resume with ckpt_path=last"
    else:
        held = "No step checkpoint had been written yet: free some space"
        resume = "start again (ckpt_path=last starts afresh in the same folder)"
    return (
        f"no space left on the device of {folder}: {free / 2**20:,.0f} MiB free, {need}. "
        f"{held} (or lower keep_checkpoints: the oldest then go before a new one is written) "
        f"and {resume}."
    )


def verify(path: str | Path) -> str | None:
    """Why ``path`` cannot be trusted (missing, no checksum, checksum mismatch), or None.

    A distributed checkpoint is a folder: its checksum file lists every file in it, and a
    file missing, added or changed fails it."""
    path = Path(path)
    sidecar = path.with_name(path.name + ".sha256")
    if not path.exists():
        return f"{path} does not exist"
    if not sidecar.is_file():
        return f"{path} has no checksum file {sidecar.name}"
    expected = _read_checksums(sidecar)
    if path.is_dir():
        actual = {f"{path.name}/{name}": digest for name, digest in _folder_digests(path)}
    else:
        actual = {path.name: sha256_file(path)}
    if actual != expected:
        return f"{path} does not match its checksum {sidecar.name} (truncated or corrupted)"
    return None


def is_distributed_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a sharded run's checkpoint folder (shards plus ``meta.pt``)."""
    return (Path(path) / METADATA).is_file()


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint's dictionary, tensors memory-mapped; for a distributed checkpoint, the part
    outside the shards (step, loops, callbacks, hyperparameters)."""
    import torch

    file = Path(path) / METADATA if Path(path).is_dir() else Path(path)
    return torch.load(file, map_location="cpu", weights_only=False, mmap=True)


def write_folder_checksums(folder: str | Path, name: str) -> Path:
    """Write ``<name>.sha256`` beside ``folder`` (``sha256sum -c`` format, run from the parent),
    naming each file as ``<name>/<file>``: the checksum of the folder once renamed to ``name``.
    Returns the checksum file."""
    folder = Path(folder)
    for file in folder.rglob("*"):
        if file.is_file():
            with file.open("rb") as f:
                os.fsync(f.fileno())
    lines = "".join(f"{d}  {name}/{rel}\n" for rel, d in _folder_digests(folder))
    sidecar = folder.with_name(f"{name}.sha256")
    _replace(sidecar, lines)
    return sidecar


def _folder_digests(folder: Path) -> list[tuple[str, str]]:
    return [
        (p.relative_to(folder).as_posix(), sha256_file(p))
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    ]


def _read_checksums(sidecar: Path) -> dict[str, str]:
    """``{file name: digest}`` from a ``sha256sum`` file."""
    entries = {}
    for line in sidecar.read_text().splitlines():
        digest, _, name = line.partition("  ")
        entries[name] = digest
    return entries


def newest_verified(ckpt_dir: str | Path) -> Path | None:
    """The step checkpoint with the highest step whose checksum verifies; None when the folder
    holds no step checkpoint at all. Every newer one that fails is named in a warning. Raises
    ``RunRefused`` when checkpoints exist but none verifies: starting afresh would overwrite
    them."""
    found = sorted(step_checkpoints(ckpt_dir), key=lambda p: -int(STEP.match(p.name)[1]))
    problems = []
    for path in found:
        problem = verify(path)
        if problem is None:
            for p in problems:
                log.warning("skipping checkpoint: %s; using the one before it", p)
            return path
        problems.append(problem)
    if problems:
        raise RunRefused(
            f"ckpt_path=last: no checkpoint in {ckpt_dir} verifies ({'; '.join(problems)}). "
            f"Pass ckpt_path=<file> to resume from one anyway, or use another run_name to "
            f"start afresh."
        )
    return None


def step_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """The ``step-<N>.ckpt`` files (or distributed checkpoint folders) of a run (not
    ``last.ckpt``, a link to the newest)."""
    folder = Path(ckpt_dir)
    return [p for p in folder.glob("step-*.ckpt") if STEP.match(p.name)] if folder.is_dir() else []


def clean_temporaries(*folders: str | Path) -> list[Path]:
    """Remove what a killed writer left (``*.tmp-<pid>``, ``*.old-<pid>``) directly in
    ``folders``; returns what was removed. Only the holder of the run's lock may call it."""
    removed = []
    for folder in map(Path, folders):
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if TEMPORARY.search(path.name):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
                removed.append(path)
    if removed:
        log.warning("removed what an interrupted run left: %s", ", ".join(map(str, removed)))
    return removed


def sha256_file(path: str | Path, chunk: int = 1 << 24) -> str:
    """Hex sha256 of a file, read in chunks (checkpoints can be larger than memory)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(folder: Path) -> None:
    # the rename itself reaches the disk only when the folder's entry does
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
