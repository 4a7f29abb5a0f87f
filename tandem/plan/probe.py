"""This machine's CPU as a ``Device``, measured by a short probe.

The CPU's figures come from ``probe_cpu`` (this process's CPU seconds, one thread, once per
process; about a second beyond the imports):

- ``flops``: a 1024 x 1024 x 1024 float32 matmul;
- ``cache_bw`` / ``memory_bw``: bytes read and written per second by a copy of 4 MiB (in the
  last-level cache) and of 64 MiB (out of it);
- ``weight_bw``: bytes per second of GEMM weights streamed through ``F.linear`` at 16 rows, a
  turn of 64 weights that do not stay in cache (BLAS packs each into panels as it reads it), the
  arithmetic taken off;
- ``attention``: FLOP/s of ``scaled_dot_product_attention`` at a decode step's shape (one query
  a row against caches bigger than the last-level cache, masked: the rate includes the cache's
  reads), at a training pass's (causal over whole rows) and with its backward: a CPU core runs
  them at a fraction of its matmul rate;
- ``exp_rate``: elements per second of ``exp`` (transcendentals are arithmetic-bound on a CPU
  core, not memory-bound);
- ``fault_bw``: bytes per second of memory touched for the first time: a tensor of
  ``work.FRESH_BYTES`` or more is mapped fresh by glibc's allocator at every allocation (its
  mmap threshold tops out at 32 MiB), and each page faults on first write (a clone of 64 MiB,
  its copy taken off);
- ``op_s``: seconds per dispatched op of an eager forward of a 2-layer Qwen3 of width 16 at
  one token (transformers' own Python around every op, as the plan's models run it).

What this file leaves out: how work becomes seconds (``tandem.plan.devices.Device``).
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from pathlib import Path

from tandem.plan.devices import Device


def probe_cpu(threads: int | None = None) -> Device:
    """This machine's CPU for a run of ``threads`` torch threads (None: torch's default).

    Measured on one thread, in this process's CPU seconds (what other processes' load on the
    machine does not add), once per process (a few tenths of a second beyond the imports); with
    more threads the matmuls are counted as sharing the work perfectly, and the rest (memory
    traffic, exponentials, dispatch) as one thread's."""
    import torch

    base = _probe_one_thread()
    threads = threads or torch.get_num_threads()
    if threads == 1:
        return base
    flops = {k: v * threads for k, v in base.flops.items()}
    return replace(base, label=f"this CPU ({threads} threads)", flops=flops)


@functools.cache
def _probe_one_thread() -> Device:
    import psutil
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        flops = _rate(lambda a, b: a @ b, _pair(1024), 2 * 1024**3)
        cache = _copy_rate(4 * 2**20)
        memory = _copy_rate(64 * 2**20)
        x = torch.rand(2**18)
        y = torch.empty_like(x)
        exp_rate = x.numel() / _best(lambda: torch.exp(x, out=y), 20)
        fault = _fault_rate(64 * 2**20, memory)
        attention = {k: _attention_rate(k) for k in ("decode", "causal", "causal_grad")}
        weights = _weight_rate(flops)
        op_s = _op_seconds()
    finally:
        torch.set_num_threads(before)
    return Device(
        "cpu",
        "this CPU (1 thread)",
        psutil.virtual_memory().total,
        {"float32": flops, "bfloat16": flops},
        memory_bw=memory,
        host_link=0.0,
        link=0.0,
        op_s=op_s,
        gpu=False,
        cache_bw=cache,
        cache_bytes=_last_level_cache(),
        exp_rate=exp_rate,
        fault_bw=fault,
        source="probe_cpu",
        weight_bw=weights,
        attention=attention,
    )


def _best(fn, reps: int, rounds: int = 3) -> float:
    """The fastest of ``rounds`` averages of ``reps`` calls, in CPU seconds of this process
    (what another process's load on the machine does not add)."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(reps):
            fn()
        best = min(best, (time.process_time() - start) / reps)
    return max(best, 1e-9)


def _pair(n: int):
    import torch

    return torch.rand(n, n), torch.rand(n, n)


def _rate(fn, args, work: float, reps: int = 3) -> float:
    return work / _best(lambda: fn(*args), reps)


def _copy_rate(size: int) -> float:
    import torch

    src = torch.rand(size // 4)
    dst = torch.empty_like(src)
    reps = max(3, (256 * 2**20) // size)
    return 2 * size / _best(lambda: dst.copy_(src), reps)


def _fault_rate(size: int, copy_bw: float) -> float:
    """Bytes per second of first touch: a clone of ``size`` bytes (mapped fresh) less the copy's
    own time."""
    import torch

    src = torch.rand(size // 4)
    clone = _best(lambda: src.clone(), 3)
    touch = clone - 2 * size / copy_bw
    return size / max(touch, clone * 0.05)


def _weight_rate(flops: float) -> float:
    """Bytes per second of GEMM weights streamed through ``F.linear`` at 16 rows: 64 weights of
    1024 x 256 (64 MiB, beyond the last-level cache) in turn, their arithmetic at ``flops``
    taken off."""
    import torch
    import torch.nn.functional as F

    weights = [torch.rand(1024, 256) for _ in range(64)]
    x = torch.rand(16, 256)
    seconds = _best(lambda: [F.linear(x, w) for w in weights], 3)
    arithmetic = len(weights) * 2 * 16 * 256 * 1024 / flops
    return len(weights) * 256 * 1024 * 4 / max(seconds - arithmetic, seconds * 0.05)


def _attention_rate(kind: str) -> float:
    """FLOP/s of ``scaled_dot_product_attention`` with 4 heads of 64 over 2 KV heads.

    ``decode``: one query for each of 64 rows against 256 cached keys under a mask, as
    transformers calls it in a decode step (each KV head's queries packed as its rows, the keys
    and values views of caches reserved for 512 positions), over 8 caches in turn (128 MiB: every
    layer's cache of both models, which no cache holds from one step to the next), so the rate
    includes the cache's reads. ``causal``: 4 rows of 512 keys (in cache: a pass's traffic is
    counted apart); ``causal_grad``: the same with its backward (2.5 times the forward's FLOPs).
    """
    import torch
    import torch.nn.functional as F

    if kind == "decode":
        q = torch.rand(64, 2, 2, 64)
        caches = [(torch.rand(64, 2, 512, 64), torch.rand(64, 2, 512, 64)) for _ in range(8)]
        mask = torch.ones(64, 1, 1, 512, dtype=torch.bool)[..., :256]

        def attend() -> None:
            for k, v in caches:
                F.scaled_dot_product_attention(q, k[:, :, :256], v[:, :, :256], attn_mask=mask)

        return len(caches) * 4 * 4 * 64 * 64 * 256 / _best(attend, 3)
    grad = kind == "causal_grad"
    q = torch.rand(4, 4, 512, 64, requires_grad=grad)
    k = torch.rand(4, 2, 512, 64, requires_grad=grad)
    v = torch.rand(4, 2, 512, 64, requires_grad=grad)

    def causal() -> None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if grad:
            out.sum().backward()

    return (3.5 if grad else 1.0) * 4 * 4 * 64 * 4 * 512 * 513 / 2 / _best(causal, 5)


def _op_seconds() -> float:
    """Seconds per dispatched op of a tiny eager Qwen3 forward (see the module)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
    )
    model = Qwen3ForCausalLM(config).eval()
    ids = torch.zeros(1, 1, dtype=torch.long)

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    with torch.inference_mode():
        forward = lambda: model(input_ids=ids, use_cache=False)  # noqa: E731
        with Count():
            forward()
        return _best(forward, 30) / Count.ops


def _last_level_cache() -> int:
    """Bytes of the last-level cache this core can count on: its size over the CPUs that share
    it (sysfs; other processes run on the others), 16 MiB where sysfs does not say."""
    best, level = 16 * 2**20, -1
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
            depth = int((index / "level").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit() and depth > level:
            best, level = int(digits) * scale // max(1, _cpus(shared)), depth
    return best


def _cpus(listing: str) -> int:
    """CPUs in a sysfs list such as ``0-3,8``."""
    count = 0
    for part in listing.split(","):
        first, _, last = part.partition("-")
        if first.isdigit():
            count += int(last) - int(first) + 1 if last.isdigit() else 1
    return count
