"""What a training start does in its run folder before any model loads.

The launching process (not the ranks a distributed strategy starts) locks the folder for the
run's life, removes what a killed run left half-written, picks the checkpoint to resume from
(the newest that verifies), compares the config with the previous start's and records this one:
``starts/start-<n>.yaml`` (the full config), ``run_info.json`` (commit, step, time, changes) and
``.hydra/`` (Hydra's own record, written here, after the lock, so that a refused start cannot
overwrite the record of the run that holds the folder).

What this file leaves out: building and fitting the run (``tandem.train``).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tandem.provenance import record_start
from tandem.runs import RunRefused
from tandem.runs.checkpoints import (
    STEP,
    clean_temporaries,
    newest_verified,
    read_checkpoint,
    step_checkpoints,
    verify,
)
from tandem.runs.lock import LOCK, OWNER, is_alive, is_launcher, read_owner
from tandem.runs.resume import (
    CHOICES,
    STARTS,
    changes,
    check_resume,
    check_step_unit,
    previous_config,
    save_start_config,
    start_config,
)

log = logging.getLogger(__name__)

# the run's Aim run, by hash and repository (written by tandem.runs.report.link_aim_run)
AIM_RUN = "aim_run.json"


def begin(cfg: DictConfig, **record: Any) -> str | None:
    """Prepare and record this start; returns the checkpoint to resume from (None: afresh).
    ``record``: more to write into this start's entry of ``run_info.json`` (its memory plan).

    Raises ``RunRefused`` for a start that would betray the folder: no checkpoint verifies, a
    fresh start over an earlier start's checkpoints, or a resume that changes what the
    checkpoint means (see ``tandem.runs.resume``).
    """
    check_run_keys(cfg)
    out = Path(cfg.output_dir)
    ckpt_dir = out / "checkpoints"
    if not is_launcher():
        return resolve_ckpt(cfg.ckpt_path, ckpt_dir)
    clean_temporaries(ckpt_dir, out)
    ckpt = resolve_ckpt(cfg.ckpt_path, ckpt_dir)
    if ckpt is None and cfg.ckpt_path is None and step_checkpoints(ckpt_dir):
        raise RunRefused(
            f"ckpt_path=null but run_name={cfg.run_name} already holds checkpoints of an earlier "
            f"start ({ckpt_dir}): a fresh start would mix two runs in one folder. Resume it with "
            f"ckpt_path=last, or give this run another run_name."
        )
    state = read_checkpoint(ckpt) if ckpt is not None else {}
    module = cfg.get("module") or {}
    per_batch = int(module.get("num_iterations", 1)) * int(module.get("mini_batches", 1))
    if ckpt is not None:
        check_step_unit(state, per_batch, ckpt)
    number, previous = previous_config(out)
    config = start_config(cfg)
    diff = changes(previous, config) if previous is not None else {}
    if ckpt is not None and previous is not None:
        check_resume(diff, cfg.resume_changes)
    saved = save_start_config(out, number + 1, config)
    write_hydra_record(cfg, out)
    record_start(
        out,
        int(state.get("global_step", 0)),
        config=str(saved.relative_to(out)),
        changes={k: list(v) for k, v in diff.items()},
        **record,
    )
    return ckpt


def check_run_keys(cfg: DictConfig) -> None:
    """The keys of this package, checked before anything loads."""
    keep, allow = cfg.get("keep_checkpoints", 2), cfg.get("resume_changes", "refuse")
    if not (isinstance(keep, int) and not isinstance(keep, bool) and keep >= 1):
        raise RunRefused(
            f"keep_checkpoints ({keep!r}) must be an integer >= 1: how many of the newest step "
            f"checkpoints to keep. Set keep_checkpoints=2."
        )
    if allow not in CHOICES:
        raise RunRefused(
            f"resume_changes ({allow!r}) must be one of {list(CHOICES)}: whether a resume may "
            f"change keys that alter what the checkpoint means. Set resume_changes=refuse."
        )


def resolve_ckpt(ckpt_path: str | None, ckpt_dir: Path) -> str | None:
    """``last`` -> the newest step checkpoint that verifies (None, to start afresh, when there
    is none yet); a path -> itself, refused if it is missing or fails its checksum."""
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        found = newest_verified(ckpt_dir)
        legacy = ckpt_dir / "last.ckpt"
        if found is None and legacy.is_file() and not legacy.is_symlink():
            # a run shorter than checkpoint_every_n_steps leaves its end in last.ckpt alone
            problem = verify(legacy)
            if problem is None:
                log.info("resuming from %s", legacy)
                return str(legacy)
            if Path(f"{legacy}.sha256").is_file():
                raise RunRefused(f"ckpt_path=last: {problem}. Give another checkpoint.")
            raise RunRefused(
                f"ckpt_path=last: {legacy} was written without a checksum (by an older tandem), "
                f"so it cannot be verified. Pass ckpt_path={legacy} to resume from it anyway."
            )
        if found is None:
            log.warning("ckpt_path=last but %s holds no checkpoint: starting afresh", ckpt_dir)
            return None
        log.info("resuming from %s", found)
        return str(found)
    problem = verify(ckpt_path)
    if problem is not None and not Path(ckpt_path).is_file():
        raise RunRefused(f"ckpt_path={ckpt_path}: {problem}. Give an existing checkpoint file.")
    if problem is not None and Path(f"{ckpt_path}.sha256").is_file():
        raise RunRefused(f"ckpt_path={ckpt_path}: {problem}. Give another checkpoint.")
    if problem is not None:
        log.warning("ckpt_path=%s cannot be verified: %s; using it as given", ckpt_path, problem)
    return str(ckpt_path)


def write_hydra_record(cfg: DictConfig, out: Path) -> None:
    """Hydra's ``.hydra/`` record of this start (``hydra.output_subdir`` is null in the config,
    so that Hydra does not write it before the lock is held); nothing outside a Hydra app."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    folder = out / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, folder / "config.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": hydra_cfg}), folder / "hydra.yaml")
    OmegaConf.save(hydra_cfg.overrides.task, folder / "overrides.yaml")


def undo_start(folder: str | Path) -> None:
    """Take back what a start that is refused after its records were written left behind (a
    data problem found as the data loads, arguments a constructor refuses): a study must not
    list it as an unfinished run.

    A first start of which nothing came (no step checkpoint, no export) leaves nothing of its
    folder but the lock it still holds (which the caller's ``discard_unused`` removes with the
    folder), and its Aim run is deleted; a later start leaves only its own start record.
    """
    out = Path(folder)
    number, _ = previous_config(out)
    if number == 0:
        return
    if number > 1 or step_checkpoints(out / "checkpoints") or (out / "senior").exists():
        (out / STARTS / f"start-{number}.yaml").unlink(missing_ok=True)
        forget_last_start(out)
        return
    _delete_aim_run(out)
    for entry in out.iterdir():
        if entry.name not in (LOCK, OWNER):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def forget_last_start(out: Path) -> None:
    """Drop the newest entry of ``run_info.json`` (``tandem.provenance.record_start``'s)."""
    path = out / "run_info.json"
    try:
        info = json.loads(path.read_text())
        info["starts"].pop()
    except (OSError, ValueError, KeyError, IndexError):
        return
    path.write_text(json.dumps(info, indent=2) + "\n")


def _delete_aim_run(out: Path) -> None:
    """Delete the Aim run a refused first start made (``aim_run.json`` names it), if any."""
    try:
        record = json.loads((out / AIM_RUN).read_text())
    except (OSError, ValueError):
        return
    try:
        from aim import Repo

        Repo.from_path(record["repo"]).delete_run(record["hash"])
    except Exception as err:  # Aim's errors have no common base; the run is only left behind
        log.warning("could not delete the Aim run %s of a refused start: %s", record, err)


def interrupted_beside(folder: str | Path) -> tuple[str, int] | None:
    """The newest other run in ``folder``'s parent that was stopped before it finished (a step
    checkpoint, no exported senior, no process holding it): its name and newest checkpoint's
    step; None when there is none."""
    out = Path(folder).absolute()
    found = []
    for other in out.parent.iterdir() if out.parent.is_dir() else ():
        if other == out or not (other / STARTS).is_dir() or (other / "senior").exists():
            continue
        owner = read_owner(other)
        if owner is not None and is_alive(owner):
            continue  # running now
        steps = [int(STEP.match(p.name)[1]) for p in step_checkpoints(other / "checkpoints")]
        if steps:  # stopped before its first checkpoint: nothing to resume from
            found.append((other.stat().st_mtime, other.name, max(steps)))
    if not found:
        return None
    _, name, step = max(found)
    return name, step
