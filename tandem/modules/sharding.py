"""The senior sharded with FSDP2 (``fully_shard``) through Lightning's ``ModelParallelStrategy``.

``FSDP2Strategy`` is ``ModelParallelStrategy`` with the fully-sharded data parallel recipe as
config keys (mixed precision, CPU offload, resharding after forward) and two things a run here
needs that Lightning leaves to the user:

- ``shard(model)``: ``fully_shard`` on every decoder layer, then on the model itself. The
  LightningModule calls it from ``configure_model`` (the hook where ``ModelParallelStrategy``
  wants parallelism applied), so the module holds no distributed setting of its own.
- distributed checkpoints (a folder, one file per rank plus ``meta.pt``) written under a
  temporary name, given a checksum file, and renamed into place, as ``AtomicCheckpointIO`` does
  for single files (the strategy writes folders itself, bypassing the ``CheckpointIO``).

``offload`` places the senior's float32 shards and AdamW state: ``none`` on the device;
``fsdp`` FSDP2's ``CPUOffloadPolicy`` (shards, gradients and optimizer state on the host, the
optimizer step run there by the host's CPU); ``between_phases`` as verl offloads its actor
(``fsdp_workers.py``): shards and optimizer state wait on the host between phases, and move to
the device for the phases that read them (``place``: the rollout and the log-prob passes read
the shards; the update and its optimizer steps read both), so that the step runs on the device.

``gradient_sync(model, last)`` holds a sharded senior's gradients unreduced on its device
through a mini-batch's micro-batches and reduces (and, offloaded, copies to the host) once, in
the last one's backward.

``gathered(model, rollout_gather)`` readies a sharded model to generate for the length of a
``with`` block: ``whole`` keeps its full parameters (all-gathered once per rollout, not once per
token); ``per_layer`` leaves each decoder layer to FSDP2's own hooks (gathered for its forward,
freed after it: one all-gather per layer per token) and yields the ``Lockstep`` the engine then
keeps, so that every rank makes as many forwards. ``full_state_dict(model)`` gathers the whole
state dict (a collective: every rank calls it) for export and weight syncs.

The junior is never sharded: ``JuniorCallback`` holds it outside the module, whole on each rank.

What this file leaves out: which checkpoint a start resumes from (``tandem.runs``).
"""

from __future__ import annotations

import os
import shutil
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from tandem.engine.base import Lockstep
from tandem.modules.models import DTYPES
from tandem.plan.time_settings import offload_mode
from tandem.runs.checkpoints import write_folder_checksums
from tandem.runs.faults import fault_point

# what each sharded model was configured with, for ``gathered`` to restore
_RESHARD: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()

# how the torch engine's rollouts read a sharded senior (``gathered``)
ROLLOUT_GATHERS = ("whole", "per_layer")


class FSDP2Strategy(ModelParallelStrategy):
    """Fully sharded data parallel (FSDP2) over every process, as config keys.

    Args:
        layers: class names of the modules sharded one by one (None: the model's own
            ``_no_split_modules``, e.g. ``Qwen3DecoderLayer``).
        param_dtype: dtype parameters are gathered and computed in (None: as stored). Keep
            ``trainer.precision: 32-true`` with it: FSDP2 casts, and the master weights, the
            gradients' reduction and AdamW stay in ``reduce_dtype`` / float32.
        reduce_dtype: dtype gradients are reduced in (None: ``param_dtype``).
        offload: where the senior's float32 shards and optimizer state live. ``none``: on the
            device. ``fsdp``: FSDP2's ``CPUOffloadPolicy``, on the host for good, gradients
            copied there, the optimizer step run by the host's CPU (the least device memory,
            the slowest step). ``between_phases``: on the host between phases, moved to the
            device for the phases that read them and back after the update (verl's
            ``param_offload`` and ``optimizer_offload``; ``place``). GPUs only.
        cpu_offload: the older spelling of ``offload``: true is ``fsdp``, false any other
            layout (None: not given; a contradiction of ``offload`` is refused).
        reshard_after_forward: free each layer's gathered parameters after its forward (less
            memory) rather than keep them for backward (one all-gather fewer per layer).
        activation_checkpointing: keep only each layer's input from the forward pass and
            recompute the rest in backward (about a third more compute for far less activation
            memory on long rollouts), through the model's own ``gradient_checkpointing_enable``.
        rollout_gather: how the torch engine's rollouts read the senior: ``whole`` (gathered
            once per rollout: fastest, but each rank briefly holds the whole senior beside its
            shards and AdamW state) or ``per_layer`` (each decoder layer gathered for its
            forward and freed: far less memory, one all-gather per layer per token, the ranks
            stepping together until the last one's rows finish). The vLLM backend samples from
            its own copy either way.
        save_distributed_checkpoint: each rank writes its shards (a checkpoint is a folder) or
            rank 0 gathers everything into one file.
        process_group_backend: ``gloo``, ``nccl``, ... (None: Lightning's choice per device).
        timeout: how long a collective waits before the run fails.

    Data parallel over all processes, no tensor parallelism (``ModelParallelStrategy`` offers
    it; the data module and the engine assume every rank is a data shard).
    """

    def __init__(
        self,
        layers: list[str] | None = None,
        param_dtype: str | None = None,
        reduce_dtype: str | None = None,
        offload: str = "none",
        cpu_offload: bool | None = None,
        reshard_after_forward: bool = True,
        activation_checkpointing: bool = False,
        rollout_gather: str = "whole",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        if rollout_gather not in ROLLOUT_GATHERS:
            raise ValueError(
                f"strategy.rollout_gather ({rollout_gather!r}) must be one of {ROLLOUT_GATHERS}: "
                "how rollouts read the sharded senior. Set trainer.strategy.rollout_gather="
                "per_layer where the whole senior does not fit beside its shards, else whole."
            )
        offload = offload_mode({"offload": offload, "cpu_offload": cpu_offload})
        for key, value in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
            if value is not None and value not in DTYPES:
                raise ValueError(
                    f"strategy.{key} ({value!r}) must be one of {sorted(DTYPES)} or null: the "
                    f"dtype FSDP2 casts to. Set trainer.strategy.{key}=bfloat16 on GPUs."
                )
        # data parallel size is set once the world size is known (setup_environment)
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.layers, self.offload = layers, offload
        # where place() last put the shards and the optimizer state (True: the device; None
        # until its first call), and every move it made as (what, "device" | "host")
        self.placed: dict[str, bool] | None = None
        self.moves: list[tuple[str, str]] = []
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        self.reshard_after_forward = reshard_after_forward
        self.activation_checkpointing = activation_checkpointing
        self.rollout_gather = rollout_gather

    def setup_environment(self) -> None:
        # every process is one shard of one data parallel group (the parent's "auto" would
        # make it the number of nodes, with tensor parallelism inside each node)
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def model_to_device(self) -> None:
        # fully_shard has placed every parameter and buffer already; with FSDP2's offload the
        # shards must stay in host memory, where moving the whole module would undo it
        if self.offload != "fsdp":
            super().model_to_device()

    @property
    def lower_precision(self) -> bool:
        """Whether forward passes run below float32 (so the engine's log-probs differ)."""
        return self.param_dtype not in (None, "float32")

    def shard(self, model: nn.Module) -> nn.Module:
        """``fully_shard`` ``model``'s layers and then ``model`` over this strategy's mesh."""
        return shard(
            model,
            self.device_mesh["data_parallel"],
            layers=self.layers,
            param_dtype=self.param_dtype,
            reduce_dtype=self.reduce_dtype,
            cpu_offload=self.offload == "fsdp",
            reshard_after_forward=self.reshard_after_forward,
            activation_checkpointing=self.activation_checkpointing,
        )

    def place(self, model: nn.Module, shards: bool, optimizer_state: bool = False) -> None:
        """``offload=between_phases``: ``model``'s float32 shards and the optimizer's state on
        the device (True) or the host (False) for the phase that follows; a no-op otherwise.

        Shards move through ``nn.Module.to``, which FSDP2 follows (its sharded parameters are
        re-registered, the optimizer keeps the same parameter objects); optimizer state tensor
        by tensor. Gradients are never moved: the update frees them after each step.
        """
        if self.offload != "between_phases":
            return
        if self.placed is None:
            # the shards start on the device; so does an optimizer state a resume has loaded
            # (a fresh one is empty, made where the parameters are at the first step)
            held = any(state for opt in self.optimizers for state in opt.state.values())
            self.placed = {"shards": True, "optimizer_state": held}
        # on a CPU-only machine the device is the host: the moves are no-ops, but recorded
        if shards != self.placed["shards"]:
            model.to(self.root_device if shards else torch.device("cpu"))
            self._moved("shards", shards)
        if optimizer_state != self.placed["optimizer_state"]:
            device = self.root_device if optimizer_state else torch.device("cpu")
            for optimizer in self.optimizers:
                for state in optimizer.state.values():
                    for key, value in state.items():
                        # AdamW's step counter stays where the optimizer keeps it
                        if torch.is_tensor(value) and value.dim():
                            state[key] = value.to(device, non_blocking=True)
            if not optimizer_state and self.root_device.type == "cuda":
                # copies to the host land in pinned memory asynchronously: a checkpoint may
                # read them next, so they must have landed
                torch.cuda.synchronize(self.root_device)
            self._moved("optimizer_state", optimizer_state)

    def _moved(self, what: str, to_device: bool) -> None:
        self.placed[what] = to_device
        self.moves.append((what, "device" if to_device else "host"))

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | os.PathLike, storage_options: Any = None
    ) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(str(filepath)))
        # one temporary name for all ranks: the launcher's process id
        tmp = path.with_name(f"{path.name}.tmp-{self.broadcast(os.getpid())}")
        step = int(checkpoint.get("global_step", -1))
        super().save_checkpoint(checkpoint, tmp, storage_options)
        self.barrier()
        if self.global_rank == 0:
            write_folder_checksums(tmp, path.name)
            fault_point("checkpoint", step)
            _replace_folder(tmp, path)
        self.barrier()


def shard(
    model: nn.Module,
    mesh: Any,
    *,
    layers: list[str] | None = None,
    param_dtype: str | None = None,
    reduce_dtype: str | None = None,
    cpu_offload: bool = False,
    reshard_after_forward: bool = True,
    activation_checkpointing: bool = False,
) -> nn.Module:
    """Apply ``fully_shard`` to each module of a class in ``layers``, then to ``model``
    (activation checkpointing first, so that recomputation gathers through FSDP's hooks)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    names = set(layers or getattr(model, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if type(m).__name__ in names]
    if not units:
        raise ValueError(
            f"strategy.layers ({sorted(names)}) matches no module of {type(model).__name__}: "
            "FSDP2 would gather the whole model at once. Name its decoder layer class, e.g. "
            "trainer.strategy.layers=[Qwen3DecoderLayer]."
        )
    if activation_checkpointing:
        checkpoint_layers(model)
    options: dict[str, Any] = {"mesh": mesh}
    if param_dtype is not None or reduce_dtype is not None:
        options["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=DTYPES.get(param_dtype), reduce_dtype=DTYPES.get(reduce_dtype)
        )
    if cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    for unit in units:
        fully_shard(unit, reshard_after_forward=reshard_after_forward, **options)
    # the root's parameters (embeddings, final norm, head) are used first by backward: FSDP2
    # keeps them gathered after forward
    fully_shard(model, reshard_after_forward=False, **options)
    _RESHARD[model] = reshard_after_forward
    return model


def checkpoint_layers(model: nn.Module) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant: the recomputed
    forward runs FSDP2's hooks as the first one did), through transformers' own switch
    (``activation_checkpointing_enable`` from transformers 5.x on, the older name before)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    enable = enable or model.gradient_checkpointing_enable
    enable({"use_reentrant": False})


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` is an FSDP2 module (its parameters are ``DTensor`` shards)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Whether the backwards of the block reduce a sharded ``model``'s gradients (and, under
    FSDP2's offload, copy them to the host): off, each parameter's gradient accumulates
    unsharded on its device in the reduce dtype (FSDP2's ``set_requires_gradient_sync``, FSDP1's
    ``no_sync``). A model that is not sharded passes through."""
    if not is_sharded(model):
        yield
        return
    model.set_requires_gradient_sync(enabled)
    try:
        yield
    finally:
        # every other backward (and the next mini-batch's last) reduces as FSDP2 does
        model.set_requires_gradient_sync(True)


@contextmanager
def gathered(model: nn.Module, rollout_gather: str = "whole") -> Iterator[Lockstep | None]:
    """Ready a sharded ``model`` to generate for the block, resharded on exit.

    ``whole``: hold its full parameters, one all-gather per FSDP unit on entry and none per
    forward inside (generation calls forward once per token); yields ``None``.
    ``per_layer``: hold only the root's parameters (embeddings, final norm, head); each decoder
    layer is gathered by FSDP2's hooks for its forward and freed after it, whatever
    ``reshard_after_forward`` says for training. Every forward is then a collective, so it
    yields the ``Lockstep`` to generate with. A model that is not sharded passes through.
    """
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    per_layer = rollout_gather == "per_layer" and bool(units)
    # read off a parameter while it is still a shard (a DTensor): the root's is swapped below
    lockstep = _lockstep(next(model.parameters()).device_mesh) if per_layer else None
    for unit in units:
        unit.unshard()
        if per_layer and unit is not model:
            # FSDP2 allocates a unit's gathered buffers at its first all-gather and reuses them:
            # made in the engine's inference mode, training could never write them again. Once
            # here, outside it, one layer at a time, is one all-gather more per rollout
            unit.reshard()
        unit.set_reshard_after_forward(per_layer and unit is not model, recurse=False)
    try:
        yield lockstep
    finally:
        for unit in units:
            keep = _RESHARD.get(model, True) and unit is not model
            unit.set_reshard_after_forward(keep, recurse=False)
            unit.reshard()


def _lockstep(mesh: Any) -> Lockstep:
    """The all-reduce of a maximum over ``mesh``'s ranks, on the device its collectives use."""
    import torch.distributed as dist

    kind, group = mesh.device_type, mesh.get_group()
    # nccl reduces only tensors on this rank's accelerator, gloo host tensors
    device = torch.device("cpu")
    if kind != "cpu":
        device = torch.device(kind, torch.get_device_module(kind).current_device())

    def lockstep(value: int) -> int:
        flag = torch.tensor([value], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return int(flag.item())

    return lockstep


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s whole state dict on the CPU, on rank 0 (the other ranks get ``{}``).

    For a sharded model it is a collective: every rank must call it. A model that is not
    sharded gives its own state dict on every rank."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    # gathered one by one, tied parameters (embeddings and head) no longer share storage, so a
    # save would write both: keep the first name of each, as an unsharded model's save does
    tied = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    first = {name for name, _ in model.named_parameters()}
    return {k: v for k, v in state.items() if k in first or k not in tied}


def _replace_folder(tmp: Path, path: Path) -> None:
    # a folder cannot be renamed over another: the old one steps aside first
    if path.exists():
        old = path.with_name(f"{path.name}.old-{os.getpid()}")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
