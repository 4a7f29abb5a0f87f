"""The trainer's seconds: the old and reference log-probs, the update, the optimizer step, the
weight sync into vLLM and the moves of an offloaded senior.

- ``old_logprobs`` / ``ref_logprobs``: a no-grad packed forward of every micro-batch;
- ``update``: each micro-batch's forward and backward, ``num_iterations`` times, and the layers'
  forward again under activation checkpointing (``recompute``); FSDP2 gathers the senior for
  each forward and backward and reduce-scatters the gradients once a mini-batch (they are
  accumulated unreduced over its micro-batches), DDP all-reduces them once a mini-batch: the
  part the computation does not hide is ``collectives``;
- ``step``: AdamW with its clipping, per optimizer step, on the device, or on the host under
  FSDP2's CPU offload (``adamw_host``);
- ``weight_sync``: the senior's weights into vLLM, every ``sync_every`` steps;
- ``offload``: moves over the host link. FSDP2's CPU offload (``offload: fsdp``) copies the
  float32 shards in for every forward and backward (hidden behind a micro-batch's computation
  where it is long enough) and the gradients out once per mini-batch; the between-phases
  offload (verl's) moves the shards and AdamW's state in before the rollout and out after the
  step.

Micro-batches are packed as ``TandemGRPO.update`` packs them, every row at its longest.

What this file leaves out: the rollout (``tandem.plan.time_rollout``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tandem.plan import work as w
from tandem.plan.devices import HOST_BW, HOST_OP_S, LINK_SHARE, Device
from tandem.plan.settings import Settings
from tandem.plan.shape import DTYPE_BYTES, ModelShape
from tandem.plan.time_rollout import collective, gather_senior
from tandem.plan.time_settings import TimeSettings


@dataclass(frozen=True)
class Pack:
    """One micro-batch: ``rows`` rows, ``read`` tokens its forward reads (a shared prompt once),
    ``slots`` its rows laid out for attention, ``pairs`` the (query, key) pairs attention scores
    in each layer, ``head`` positions through the LM head; ``last`` ends its mini-batch."""

    rows: int
    read: int
    slots: int
    pairs: float
    head: int
    last: bool


def micro_batches(s: Settings, t: TimeSettings) -> list[Pack]:
    """Every micro-batch of one pass over the rows, as ``TandemGRPO.update`` packs them: the
    rows split into ``mini_batches`` slices, each packed first-fit under the token budget (rows
    of equal length fill each pack in order, the rows of a prompt together)."""
    response = t.response_tokens or s.max_new_tokens
    p, g = s.prompt_tokens, max(1, s.group_size)
    row = p + response
    budget = s.max_tokens_per_micro_batch
    share = s.senior.rows_attention
    rows, out = list(range(s.rows_per_rank)), []
    size = math.ceil(len(rows) / s.mini_batches)
    for start in range(0, len(rows), size):
        mini = rows[start : start + size]
        per = len(mini) if budget is None else max(1, budget // row)
        for k in range(0, len(mini), per):
            part = mini[k : k + per]
            prompts = len({r // g for r in part}) if share else len(part)
            read = len(part) * response + prompts * p
            slots = len(part) * row
            pairs = len(part) * w.causal_pairs(row) if share else float(slots) ** 2
            last = k + per >= len(mini)
            out.append(Pack(len(part), read, slots, pairs, len(part) * response, last))
    return out


def packed_pass(
    m: ModelShape, pack: Pack, cb: int, chunk: int, kind: str, temps: int, tempered: int
) -> list[w.Work]:
    """One packed log-prob pass of ``kind`` (``logprobs``: no gradients; ``train``: forward and
    backward) over a micro-batch: the layers, the LM head's chunks, their vocabulary passes."""
    grad = kind == "train"
    items = w.layers(m, pack.read, pack.pairs, cb, grad=grad)
    for size in w.chunks(pack.head, chunk):
        items.append(w.head_gemm(m, size, cb, grad=grad))
        items.append(w.vocab_work(w.head_passes(temps, tempered, grad, cb), size, m.vocab))
    if grad:
        items.append(w.embedding_backward(m))
    layer, root = w.OPS[kind]
    ops = layer * m.layers + root + w.CHUNK_OPS[kind] * len(w.chunks(pack.head, chunk))
    items.append(w.Work(ops=ops + w.MICRO_OPS[kind]))
    return items


def logprob_passes(
    s: Settings, t: TimeSettings, d: Device, m: ModelShape, cb: int, packs: list[Pack]
) -> dict[str, float]:
    """No-grad packed forwards of every micro-batch (the old or the reference log-probs)."""
    temps, tempered = t.temperatures, 1 if t.tempered else 0
    compute, exposed, gather = 0.0, 0.0, 0.0
    for pack in packs:
        items = packed_pass(m, pack, cb, s.logprob_chunk_tokens, "logprobs", temps, tempered)
        dev, host = d.total(items)
        compute += dev
        exposed += d.exposed(host, dev)
        if m is s.senior:
            gather += d.hidden(gather_senior(s, d, 1), dev)
    return {"forward": compute, "dispatch": exposed, "gather": gather}


def update(s: Settings, t: TimeSettings, d: Device, packs: list[Pack]) -> dict[str, float]:
    """Every micro-batch's forward and backward, ``num_iterations`` times; the layers'
    forward again under activation checkpointing; the collectives the computation does not
    hide: FSDP2 gathers the senior for each forward and backward and reduce-scatters the
    gradients once a mini-batch, DDP all-reduces them once a mini-batch."""
    m, cb, tempered = s.senior, s.compute_bytes, 1 if t.tempered else 0
    out = {"forward_backward": 0.0, "recompute": 0.0, "dispatch": 0.0, "collectives": 0.0}
    for pack in packs:
        items = packed_pass(m, pack, cb, s.logprob_chunk_tokens, "train", 1, tempered)
        dev, host = d.total(items)
        again = 0.0
        if s.activation_checkpointing:
            redo = [*w.layers(m, pack.read, pack.pairs, cb), w.Work(ops=w.RECOMPUTE_OPS * m.layers)]
            again, more = d.total(redo)
            host += more
        comm = 2 * gather_senior(s, d, 1) + (reduce_gradients(s, d) if pack.last else 0.0)
        out["forward_backward"] += dev
        out["recompute"] += again
        out["dispatch"] += d.exposed(host, dev + again)
        out["collectives"] += d.hidden(comm, dev + again)
    return {k: v * t.num_iterations for k, v in out.items()}


def reduce_gradients(s: Settings, d: Device) -> float:
    """A mini-batch's gradients reduced across processes: FSDP2's reduce-scatter (in
    ``reduce_dtype``), DDP's all-reduce (float32: twice the bytes of a reduce-scatter)."""
    if s.world == 1 or s.strategy == "single":
        return 0.0
    if s.strategy == "fsdp2":
        dtype = s.reduce_dtype or s.param_dtype or "float32"
        return collective(s, d, s.senior.params * DTYPE_BYTES[dtype], s.senior.layers)
    return 2 * collective(s, d, s.senior.params * 4, 1)


def optimizer(s: Settings, t: TimeSettings, d: Device, notes: list[str]) -> dict[str, float]:
    """AdamW and clipping per optimizer step, on the device, or on the host under FSDP2's CPU
    offload (at ``HOST_BW``, an assumption the notes name)."""
    steps = t.num_iterations * s.mini_batches
    work = w.adamw(s.senior, s.shards)
    if t.offload == "fsdp" and d.gpu:
        seconds = sum(x.bytes / HOST_BW + x.ops * HOST_OP_S for x in work)
        notes.append(
            f"FSDP2's CPU offload steps AdamW on the host: {HOST_BW / 1e9:g} GB/s of host "
            "memory assumed (about a quarter of a DGX socket's peak), not measured."
        )
        return {"adamw_host": steps * seconds}
    return {"adamw": steps * d.overlapped(work)}


def weight_sync(s: Settings, t: TimeSettings, d: Device) -> dict[str, float]:
    """The senior's weights into vLLM every ``sync_every`` steps: gathered whole where sharded,
    cast to vLLM's dtype and copied into its model a tensor at a time."""
    cb = DTYPE_BYTES[s.vllm_dtype]
    params = s.senior.params
    gather = collective(s, d, params * cb, len(w.tensor_sizes(s.senior))) if s.shards > 1 else 0
    copy = params * (4 + 2 * cb) / d.bandwidth(0)
    ops = len(w.tensor_sizes(s.senior)) * 10 * d.op_s  # gather, cast, vLLM's loader's copies
    # under FSDP2's CPU offload the shards come in from the host
    offloaded = d.gpu and t.offload == "fsdp"
    host = params / s.shards * 4 / (d.host_link * LINK_SHARE) if offloaded else 0.0
    return {"sync": (gather + copy + ops + host) / max(1, t.sync_every)}


def offload(s: Settings, t: TimeSettings, d: Device, packs: list[Pack]) -> dict[str, float]:
    """Moves over the host link (GPUs only: on a CPU there is no link). FSDP2's CPU offload:
    the float32 shards in for every forward and backward (of the update, of the old log-probs,
    of the rollout: once, or at every forward when gathered by layer), each hidden behind its
    micro-batch's computation where that is long enough, and the gradients out once per
    mini-batch. The between-phases offload: the shards and AdamW's state in before the rollout,
    out after the step (the shards out and in once more around the vLLM pair's rollout)."""
    if not d.gpu or t.offload == "none":
        return {}
    link = d.host_link * LINK_SHARE
    shard = s.senior.params / s.shards * 4 / link  # seconds to move one process's shards
    if t.offload == "between_phases":
        # the vLLM pair's rollout holds no shard: out after the weight sync, in for the passes
        trips = 2 if s.backend == "vllm" else 1
        return {"moves": 2 * shard * (trips + s.optimizer_states)}
    cb, tempered, chunk = s.compute_bytes, 1 if t.tempered else 0, s.logprob_chunk_tokens
    exposed = 0.0
    for pack in packs:
        train = d.total(packed_pass(s.senior, pack, cb, chunk, "train", 1, tempered))[0]
        exposed += t.num_iterations * (d.hidden(2 * shard, train) + (shard if pack.last else 0))
        if s.old_pass:
            items = packed_pass(s.senior, pack, cb, chunk, "logprobs", t.temperatures, tempered)
            exposed += d.hidden(shard, d.total(items)[0])
    # the torch engine reads the senior's shards once (gathered whole) or at every forward;
    # vLLM's weight sync reads them from the host (``weight_sync``)
    forwards = 1 if s.rollout_gather == "whole" else s.max_new_tokens
    return {"moves": exposed + (0 if s.backend == "vllm" else forwards * shard)}
