"""The rollout's seconds: the torch engine's passes, or the vLLM pair engine's.

The torch engine (``tandem.engine``): each pass over some prompt groups (the KV budget's) reads
the prompts (a prefill per model), then decodes: at every step each model's forward over every
row (the senior's, and the junior's where it reads along), then the draws and log-probs over
the vocabulary (``sampling``). The host dispatches every eager op (``dispatch``): on a CPU all
of it adds; on a GPU, only what it takes beyond the device's work, which runs behind it. A
junior on its own GPU computes while the senior's does; one host thread dispatches both.
FSDP2 gathers the senior once for the rollout, or layer by layer at every forward (``gather``).

The vLLM pair engine (``tandem.engine.vllm_pair``): both models forward every token of as many
rows as its KV cache holds at once (the rest wait: waves of decoding), in vLLM's dtype; graph-
captured on GPUs, so no per-op dispatch: ``vllm_host`` is vLLM's own work between forwards and
the pen processor's ops; asleep during the update on GPUs (``vllm_wake`` and ``vllm_sleep``:
both models' weights over the host link, its KV cache re-mapped, not copied).

What this file leaves out: the trainer's passes (``tandem.plan.time_trainer``).
"""

from __future__ import annotations

import math

from tandem.plan import work as w
from tandem.plan.activations import junior_compute_bytes, kv_per_token
from tandem.plan.devices import LINK_SHARE, Device
from tandem.plan.settings import Settings
from tandem.plan.shape import DTYPE_BYTES, ModelShape
from tandem.plan.time_settings import TimeSettings

# padded prompt tokens per prefill chunk (tandem.engine.reader)
PREFILL_TOKENS = {"cpu": 1024, "gpu": 32768}
# seconds of one collective beyond its bytes (NCCL's latency on NVLink; gloo on a CPU)
COLLECTIVE_S = 30e-6
# vLLM's own host work per decode step (scheduling, input preparation, sampling, outputs): an
# assumption for batches of tens of rows, for benchmarks/gpu_check.py to measure
VLLM_STEP_S = 2e-3
# dispatched ops of one of vLLM's Qwen3 decoder layers run eagerly (enforce_eager): two fused
# add-RMSNorms, the QKV, O, gate-up and down GEMMs, the q and k norms, rotary, the cache write,
# attention, SiLU-and-mul, and their views
VLLM_LAYER_OPS = 14


# -- rollout -----------------------------------------------------------------------------------
def torch_rollout(s: Settings, t: TimeSettings, d: Device, per_pass: int) -> dict[str, float]:
    """The torch engine's rollout: its passes over the prompts, each a prefill and the decode;
    FSDP2 gathers the senior whole once around them all."""
    prompts, per_pass = s.prompts_per_rank, max(1, min(per_pass, s.prompts_per_rank))
    sizes = [per_pass] * (prompts // per_pass) + (
        [prompts % per_pass] if prompts % per_pass else []
    )
    out: dict[str, float] = {}
    for size in sizes:
        for key, value in rollout_pass(s, t, d, size).items():
            out[key] = out.get(key, 0.0) + value
    if s.rollout_gather == "whole":
        out["gather"] = out.get("gather", 0.0) + gather_senior(s, d, 1)
    return out


def rollout_pass(s: Settings, t: TimeSettings, d: Device, prompts: int) -> dict[str, float]:
    """One pass of ``prompts`` prompt groups: each model's prefill, then every decode step (the
    first token comes from the prefill's logits: one draw more than forwards)."""
    n, p, steps = prompts * s.group_size, s.prompt_tokens, s.max_new_tokens
    models = _engine_models(s)
    chunk = max(1, min(prompts, PREFILL_TOKENS["gpu" if d.gpu else "cpu"] // max(1, p)))
    forwards = math.ceil(prompts / chunk)
    prefill = 0.0
    for m, cb, cast, _ in models:
        items = w.layers(m, prompts * p, prompts * w.causal_pairs(p), cb, autocast_cast=cast)
        dispatch = w.Work(ops=forwards * ops(m, "prefill"))
        prefill += d.overlapped([*items, w.head_gemm(m, prompts, cb), dispatch])
    ctx = p + steps / 2  # the mean context of a decode step
    forward = []
    for m, cb, cast, bpt in models:
        items = w.layers(m, n, n * ctx, cb, kv_read=n * ctx * bpt, autocast_cast=cast)
        forward.append(d.total([*items, w.head_gemm(m, n, cb)])[0])
    passes = w.sampling_passes(len(models), s.fast_draw, t.tempered, s.compute_bytes)
    sample = d.seconds(w.vocab_work(passes, n, s.senior.vocab))[0]
    if d.gpu and not _shared_junior(s):  # each model on its device, the draws on the senior's
        device = max([forward[0] + sample, *forward[1:]])
    else:
        device = sum(forward) + sample
    engine = w.STEP_OPS[engine_kind(s, t)] * d.op_s
    host = engine + sum(ops(m, "decode") for m, *_ in models) * d.op_s
    out = {
        "prefill": prefill,
        "decode": (steps - 1) * (device - sample),
        "sampling": steps * sample,
        "dispatch": (steps - 1) * d.exposed(host, device) + d.exposed(engine, sample),
    }
    if s.rollout_gather != "whole":
        out["gather"] = gather_senior(s, d, forwards + steps - 1)
    return out


def vllm_rollout(s: Settings, t: TimeSettings, d: Device, notes: list[str]) -> dict[str, float]:
    """The vLLM pair engine: both models forward every token of as many rows as its KV cache
    holds at once (the rest wait for them: ``waves``), in vLLM's dtype; on GPUs graph-captured
    and asleep during the update."""
    rows, p, steps = s.rows_per_rank, s.prompt_tokens, s.max_new_tokens
    cb = DTYPE_BYTES[s.vllm_dtype]
    models = [s.senior, s.junior] if s.junior_reads else [s.senior]
    at_once = min(rows, vllm_rows(s, d))
    waves = math.ceil(rows / max(1, at_once))
    ctx = p + steps / 2
    prefill, decode, eager = 0.0, 0.0, 0
    for m in models:
        bpt = m.kv_bytes[s.vllm_dtype]
        # prefix caching: a group's rows read their prompt once
        items = w.layers(m, s.prompts_per_rank * p, s.prompts_per_rank * w.causal_pairs(p), cb)
        prefill += d.total([*items, w.head_gemm(m, s.prompts_per_rank, cb)])[0]
        items = w.layers(m, at_once, at_once * ctx, cb, kv_read=at_once * ctx * bpt)
        decode += d.total([*items, w.head_gemm(m, at_once, cb)])[0]
        eager += VLLM_LAYER_OPS * m.layers
    passes = w.sampling_passes(len(models), False, False, 4)
    sample = d.seconds(w.vocab_work(passes, at_once, s.senior.vocab))[0]
    # vLLM steps the schedule, samples and prepares the next step between forwards
    host = VLLM_STEP_S + w.STEP_OPS[engine_kind(s, t)] * d.op_s
    if not t.vllm_graphs:
        host += eager * d.op_s
    out = {
        "prefill": prefill,
        "decode": waves * steps * decode,
        "sampling": waves * steps * sample,
        "vllm_host": waves * steps * host,
    }
    if t.vllm_sleep and d.gpu:
        weights = sum(m.params for m in models) * cb / (d.host_link * LINK_SHARE)
        out["vllm_wake"], out["vllm_sleep"] = weights, weights
    if at_once < rows:
        notes.append(
            f"vLLM holds the KV of {at_once} of a process's {rows} rows at once: {waves} waves "
            "of decoding. Its share of the device (gpu_memory_utilization) sets how many."
        )
    return out


def vllm_rows(s: Settings, d: Device) -> int:
    """Rows whose KV vLLM holds at once: its share of the device less both models' weights, as
    the memory plan counts it (``tandem.plan.memory._vllm_engine``); on a CPU, every row."""
    if not d.gpu:
        return s.rows_per_rank
    cb = DTYPE_BYTES[s.vllm_dtype]
    weights = (s.senior.params + s.junior.params) * cb
    per_row = (s.senior.kv_bytes[s.vllm_dtype] + s.junior.kv_bytes[s.vllm_dtype]) * s.row_tokens
    return max(0, int(s.vllm_utilization * d.memory) - weights) // per_row


def gather_senior(s: Settings, d: Device, forwards: int) -> float:
    """FSDP2's all-gather of the whole senior for ``forwards`` forwards (each the shards cast to
    the compute dtype, and the other processes' shards over the link), one collective a layer."""
    if s.strategy != "fsdp2":
        return 0.0
    cb = s.compute_bytes
    cast = s.senior.params / s.shards * (4 + cb) / d.bandwidth(0)
    return forwards * (cast + collective(s, d, s.senior.params * cb, s.senior.layers))


def collective(s: Settings, d: Device, total: float, count: int) -> float:
    """A ring collective over the processes moving ``total`` bytes in ``count`` calls: each
    process sends and receives ``(world - 1) / world`` of them over the link (NVLink between a
    machine's GPUs; memory between a CPU's processes)."""
    if s.world <= 1:
        return 0.0
    link = d.link * LINK_SHARE if d.gpu else d.memory_bw
    return total * (s.world - 1) / s.world / link + count * COLLECTIVE_S


def engine_kind(s: Settings, t: TimeSettings) -> str:
    """``tandem`` where two models write (the engine steps a handoff sampler), else ``solo``."""
    return "tandem" if s.junior_reads and t.tandem else "solo"


def ops(m: ModelShape, kind: str) -> int:
    """Dispatched ops of one pass of ``kind`` through the model (``work.OPS``)."""
    layer, root = w.OPS[kind]
    return layer * m.layers + root


def _engine_models(s: Settings) -> list[tuple[ModelShape, int, bool, int]]:
    """The models the torch engine steps: shape, compute bytes, whether autocast casts its
    weights at every forward, KV bytes per position."""
    senior_kv, junior_kv = kv_per_token(s)
    models = [(s.senior, s.compute_bytes, s.autocast, senior_kv)]
    if s.junior_reads:
        cast = s.autocast and s.junior_bytes == 4
        models.append((s.junior, junior_compute_bytes(s), cast, junior_kv))
    return models


def _shared_junior(s: Settings) -> bool:
    """Whether the junior sits on the senior's GPU."""
    where = None if s.junior_device is None else str(s.junior_device)
    return where in (None, "cuda", "gpu") or where.rsplit(":", 1)[-1] == "0"
