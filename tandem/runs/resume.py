"""What a restart may change: the config of every start is kept, and a resume is compared with
the start before it.

Some keys only steer how the rest of the run goes (the learning rate, how long, how often to
validate or save, where metrics go): a resume honours a change to them. Every other key decides
what the saved steps *mean* (the model, the data and its order, the batch and group sizes, the
seed, the sampler, the reward, the loss): continuing under a change to one of them yields a run
that no single config describes, so the resume is refused, naming each change, unless
``resume_changes=allow``.

A changed learning rate or weight decay is written over the checkpoint's optimizer and
scheduler state before Lightning restores them (``honour_optimizer_config``, called from
``TandemGRPO.on_load_checkpoint``); otherwise the restored state would silently keep the old.

What this file leaves out: where the start records go (``tandem.provenance``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from tandem.runs import RunRefused

if TYPE_CHECKING:  # a start compares configs before torch loads
    import torch

log = logging.getLogger(__name__)

STARTS = "starts"
# keys that name this start, not the run: never compared
PER_START = ("ckpt_path", "output_dir", "run_name", "resume_changes")
# a change to these (or to anything under them) is honoured on resume
HONOURED = (
    "module.optimizer.lr",
    "module.optimizer.weight_decay",
    "module.scheduler",
    "module.max_grad_norm",
    # how an update is split and chunked: the same gradient either way
    "module.max_tokens_per_micro_batch",
    "module.logprob_chunk_tokens",
    # how a rollout is split to fit its memory: the same rollouts either way
    "generation.kv_cache_gib",
    "module.rollouts_to_log",
    "module.rollout_log_every",
    "trainer.max_steps",
    "trainer.max_time",
    "trainer.log_every_n_steps",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "logger",
    "experiment_name",
    "threads",
    "checkpoint_every_n_steps",
    "keep_checkpoints",
    "validation.every_n_steps",
    "validation.size",
    "validation.at_start_and_end",
    "reward.workers",
)
CHOICES = ("refuse", "allow")
# a checkpoint's record of what its global_step counts (``TandemGRPO.on_save_checkpoint``)
STEP_RECORD = "tandem_steps"
# an interpolation of another key of the config (not a resolver's, such as ${now:...})
POINTER = re.compile(r"\$\{[\w.]+\}")


def start_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config of a start, less the keys that only name the start.

    A value that only points at another key (``module.sampler: ${sampler}``) stays the pointer:
    a change is then reported once, at the key that was changed.
    """
    c = _keep_pointers(
        OmegaConf.to_container(cfg, resolve=True), OmegaConf.to_container(cfg, resolve=False)
    )
    return {k: v for k, v in c.items() if k not in PER_START}


def _keep_pointers(resolved: Any, raw: Any) -> Any:
    if isinstance(raw, str) and POINTER.fullmatch(raw):
        return raw
    if isinstance(resolved, dict) and isinstance(raw, dict):
        return {k: _keep_pointers(v, raw.get(k)) for k, v in resolved.items()}
    return resolved


def previous_config(folder: str | Path) -> tuple[int, dict[str, Any] | None]:
    """``(number of starts recorded, config of the latest)``; ``(0, None)`` for a new folder."""
    saved = sorted(
        (Path(folder) / STARTS).glob("start-*.yaml"), key=lambda p: int(p.stem.split("-")[1])
    )
    if not saved:
        return 0, None
    return len(saved), OmegaConf.to_container(OmegaConf.load(saved[-1]))


def changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (old, new)}`` for every key whose value differs (``<absent>`` if none)."""
    a, b = _flatten(old), _flatten(new)
    return {
        k: (a.get(k, "<absent>"), b.get(k, "<absent>"))
        for k in sorted(a.keys() | b.keys())
        if a.get(k, "<absent>") != b.get(k, "<absent>")
    }


def check_resume(diff: dict[str, tuple[Any, Any]], allow: str) -> None:
    """Refuse (``RunRefused``) changes a resume cannot honour unless ``allow == "allow"``;
    log every change either way."""
    breaking = {k: v for k, v in diff.items() if not honoured(k)}
    if breaking and allow != "allow":
        listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in breaking.items())
        raise RunRefused(
            f"resume with a changed config that alters what the checkpoint means: {listed}. "
            f"Resume with the run's values, start a new run_name, or set "
            f"resume_changes=allow to continue anyway."
        )
    for k, (old, new) in diff.items():
        how = "honoured" if honoured(k) else "allowed by resume_changes=allow"
        log.warning("resume changes %s: %r -> %r (%s)", k, old, new, how)


def check_step_unit(state: dict[str, Any], steps_per_batch: int, path: str) -> None:
    """Refuse a checkpoint whose ``global_step`` counts optimizer steps (written before a
    training step meant one batch of rollouts) where a batch makes more than one: its step,
    its loops' counters and its schedule would all be read in the wrong unit."""
    if STEP_RECORD in state or steps_per_batch == 1:
        return  # one optimizer step a batch: both units count the same
    raise RunRefused(
        f"ckpt_path={path} was written when a training step meant one optimizer step; this run "
        f"makes {steps_per_batch} a batch of rollouts (module.num_iterations x "
        f"module.mini_batches) and counts batches, so its step {state.get('global_step')} "
        "would be read in the wrong unit. Start it afresh under another run_name (or resume "
        "it with the tandem release that wrote it)."
    )


def honoured(key: str) -> bool:
    """Whether a resume can honour a change to ``key``."""
    return any(key == h or key.startswith(h + ".") for h in HONOURED)


def save_start_config(folder: str | Path, number: int, config: dict[str, Any]) -> Path:
    """Write ``<folder>/starts/start-<number>.yaml``; returns its path."""
    path = Path(folder) / STARTS / f"start-{number}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.create(config), path)
    return path


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def honour_optimizer_config(
    checkpoint: dict[str, Any],
    make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
    make_scheduler: Callable[[torch.optim.Optimizer], Any] | None,
    restored: Iterable[Any] = (),
) -> None:
    """Rewrite a checkpoint's optimizer and scheduler state, before Lightning restores it, to
    the configured lr and weight decay at the checkpoint's step. ``restored``: optimizers a
    strategy has already loaded (a distributed checkpoint holds their state in its shards, not
    in ``optimizer_states``); their parameter groups are rewritten in place.

    The configured optimizer and scheduler are built on a stand-in parameter and stepped as
    often as the checkpoint's scheduler was, so the restored lr is the one the scheduler itself
    computes there, whatever the scheduler, and an unchanged config restores the same numbers.
    """
    saved = checkpoint.get("lr_schedulers") or []
    step = int(saved[0]["last_epoch"]) if saved else 0
    fresh = _stepped(make_optimizer, make_scheduler, step).param_groups[0]
    for sched in saved:
        sched["base_lrs"] = [fresh.get("initial_lr", fresh["lr"])] * len(sched["base_lrs"])
        if "_last_lr" in sched:
            sched["_last_lr"] = [fresh["lr"]] * len(sched["_last_lr"])
    groups = [g for opt in checkpoint.get("optimizer_states") or [] for g in opt["param_groups"]]
    groups += [g for opt in restored for g in opt.param_groups]
    for group in groups:
        group.update({k: fresh[k] for k in ("lr", "initial_lr", "weight_decay") if k in fresh})


def _stepped(
    make_optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
    make_scheduler: Callable[[torch.optim.Optimizer], Any] | None,
    steps: int,
) -> torch.optim.Optimizer:
    """A configured optimizer over a stand-in parameter, its scheduler stepped ``steps`` times."""
    import torch

    opt = make_optimizer([torch.nn.Parameter(torch.zeros(1))])
    if make_scheduler is not None:
        sched = make_scheduler(opt)
        for _ in range(steps):
            opt.step()  # no gradient, so no change; the scheduler expects a step first
            sched.step()
    return opt
