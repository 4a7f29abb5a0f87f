"""What a device can do per second: the named GPUs' published roofs, and this machine's CPU,
measured by a short probe.

A ``Device`` answers how long a piece of work (``tandem.plan.work.Work``) takes on it:

- a GPU: the larger of its arithmetic at the peak dense FLOP/s and its bytes at the memory
  bandwidth (the roofline), each at the fraction of the peak large kernels reach
  (``COMPUTE_SHARE``, ``MEMORY_SHARE``); the host's dispatch of every eager op apart
  (``op_s``), which the caller sets against the device's time, since a GPU runs behind its host;
- the CPU (one or ``threads`` cores doing both): the sum of its arithmetic, its memory traffic
  (at the cache's rate for what fits in the last-level cache, else at memory's), its
  exponentials, the first touch of freshly mapped memory and every op's dispatch. On one core
  these do not overlap: a GEMM of Qwen's LM head (K = 128) at 16 rows takes the time of its
  arithmetic plus that of streaming its packed weight panels, not the larger of the two.

The CPU's figures come from ``probe_cpu`` (seconds, cached per process and thread count):

- ``flops``: a 1024 x 1024 x 1024 float32 matmul;
- ``cache_bw`` / ``memory_bw``: bytes read and written per second by a copy of 4 MiB (in the
  last-level cache) and of 64 MiB (out of it);
- ``attention``: FLOP/s of ``scaled_dot_product_attention`` at a decode step's shape (one query
  a row against a cache, masked) and at a training pass's (causal over whole rows): a CPU core
  runs them at a fraction of its matmul rate;
- ``exp_rate``: elements per second of an in-place ``exp_`` (transcendentals are arithmetic-
  bound on a CPU core, not memory-bound);
- ``fault_bw``: bytes per second of memory touched for the first time: a tensor of
  ``FRESH_BYTES`` or more is mapped fresh from the kernel by glibc's allocator at every
  allocation (its mmap threshold tops out at 32 MiB), and each page faults on first write
  (measured on a tensor of 64 MiB);
- ``op_s``: seconds per dispatched op of an eager forward of a 2-layer Qwen3 of width 16 at
  one token (transformers' own Python around every op, as the plan's models run it).

What this file leaves out: what a phase's work is (``tandem.plan.work``, ``tandem.plan.time``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tandem.errors import ConfigError
from tandem.plan.work import Work

GiB = 2**30
# the share of the published peaks that large kernels reach: cuBLAS GEMMs of a transformer's
# shapes in bf16 reach 70-80% of the dense peak, streaming kernels 80-90% of HBM's bandwidth,
# pinned copies over PCIe and NCCL's collectives over NVLink about 80% of the link's
COMPUTE_SHARE = 0.7
MEMORY_SHARE = 0.85
LINK_SHARE = 0.8
# host seconds per eager op on a GPU: PyTorch's dispatch through transformers' Python (5-6 us an
# op on this machine's CPU, probe_cpu's op_s) and a CUDA launch (cudaLaunchKernel, ~3-5 us)
GPU_OP_S = 10e-6
# the GPU servers' host memory, for an optimizer step on the host (FSDP2's CPU offload): torch's
# per-tensor AdamW over many threads reaches about a quarter of a DGX socket's 204.8 GB/s
# (8 channels of DDR4-3200); not measured, an assumption the plan names where it is used
HOST_BW = 50e9
HOST_OP_S = 3e-6


@dataclass(frozen=True)
class Device:
    """One device's roofs.

    Attributes:
        kind: ``a100``, ``h100``, ``h200`` or ``cpu``.
        label: how the table names it.
        memory: bytes it holds.
        flops: peak dense FLOP/s by compute dtype (``bfloat16``, ``float32``).
        attention: the CPU's FLOP/s of attention, ``decode`` (one query a row against a
            cache, masked) and ``causal`` (whole rows); a GPU runs it at ``flops``.
        memory_bw: bytes per second of its memory (read and write together).
        host_link: bytes per second each way between host and device (PCIe); 0 on the CPU.
        link: bytes per second each way between two devices (NVLink); 0 on the CPU.
        op_s: host seconds per dispatched op.
        gpu: whether its work runs behind the host (a GPU) or is the host's (the CPU).
        cache_bw, cache_bytes, exp_rate, fault_bw: the CPU's (see the module).
        source: where the figures come from.
    """

    kind: str
    label: str
    memory: int
    flops: dict[str, float]
    memory_bw: float
    host_link: float
    link: float
    op_s: float
    gpu: bool
    cache_bw: float = 0.0
    cache_bytes: int = 0
    exp_rate: float = 0.0
    fault_bw: float = 0.0
    source: str = ""
    weight_bw: float = 0.0
    attention: dict[str, float] = field(default_factory=dict)

    def flop_rate(self, dtype: str) -> float:
        """FLOP/s of matmuls in ``dtype`` (float16 runs at bfloat16's rate)."""
        dtype = "bfloat16" if dtype == "float16" else dtype
        return self.flops.get(dtype, self.flops["float32"])

    def bandwidth(self, working_set: int) -> float:
        """Bytes per second of traffic over a working set of this many bytes."""
        if not self.gpu and 0 < working_set <= self.cache_bytes:
            return self.cache_bw
        return self.memory_bw

    def seconds(self, work: Work) -> tuple[float, float]:
        """``(device, host)`` seconds of one work item: its computation (see the module), and
        the host's dispatch of its ops."""
        host = work.ops * self.op_s
        rate = self.attention.get(work.attention_kind)
        attention = work.attention / (rate or self.flop_rate(work.dtype))
        flops = work.flops / self.flop_rate(work.dtype) + attention
        if self.gpu:
            memory = (work.bytes + work.weights) / (self.memory_bw * MEMORY_SHARE)
            return max(flops / COMPUTE_SHARE, memory), host
        memory = work.bytes / self.bandwidth(work.working_set) + work.weights / self.weight_bw
        exps = work.exps / self.exp_rate if self.exp_rate else 0.0
        fresh = work.fresh / self.fault_bw if self.fault_bw else 0.0
        return flops + memory + exps + fresh, host

    def total(self, items: Iterable[Work]) -> tuple[float, float]:
        """``(device, host)`` seconds of a pass's items."""
        pairs = [self.seconds(item) for item in items]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)

    def exposed(self, host: float, device: float) -> float:
        """What the host's dispatch adds to the device's work: all of it on a CPU (one thread
        does both), what it takes beyond the device on a GPU (which runs behind it)."""
        return host if not self.gpu else max(0.0, host - device)

    def hidden(self, transfer: float, compute: float) -> float:
        """What a transfer adds to the computation it overlaps (FSDP2 gathers the next layer,
        and copies in the next shard, while this one computes): all of it on a CPU."""
        return transfer if not self.gpu else max(0.0, transfer - compute)

    def overlapped(self, items: Iterable[Work]) -> float:
        """Seconds of a pass: its device work and the dispatch that work does not hide."""
        device, host = self.total(items)
        return device + self.exposed(host, device)


# Published peaks (dense, without structured sparsity, which the datasheets double), from
# NVIDIA's datasheets: A100 (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf: 80GB SXM4,
# BF16 312 TFLOPS, FP32 19.5, HBM2e 2,039 GB/s, NVLink 600 GB/s, PCIe Gen4 64 GB/s); H100 SXM5
# (H100 datasheet: BF16 1,979 TFLOPS with sparsity, FP32 67, HBM3 3.35 TB/s, NVLink 900 GB/s,
# PCIe Gen5 128 GB/s); H200 SXM (H200 datasheet: the H100's compute, HBM3e 4.8 TB/s, 141 GB).
# Link figures are both directions together there: halved here for one direction. Memory is
# counted as `--devices 2x80` reads it (GiB), as the guide's memory tables do.
NAMED = {
    "a100": Device(
        "a100",
        "A100 80 GB SXM4",
        80 * GiB,
        {"bfloat16": 312e12, "float32": 19.5e12},
        memory_bw=2.039e12,
        host_link=32e9,
        link=300e9,
        op_s=GPU_OP_S,
        gpu=True,
        source="NVIDIA A100 datasheet",
    ),
    "h100": Device(
        "h100",
        "H100 80 GB SXM5",
        80 * GiB,
        {"bfloat16": 989e12, "float32": 67e12},
        memory_bw=3.35e12,
        host_link=64e9,
        link=450e9,
        op_s=GPU_OP_S,
        gpu=True,
        source="NVIDIA H100 datasheet",
    ),
    "h200": Device(
        "h200",
        "H200 141 GB SXM",
        141 * GiB,
        {"bfloat16": 989e12, "float32": 67e12},
        memory_bw=4.8e12,
        host_link=64e9,
        link=450e9,
        op_s=GPU_OP_S,
        gpu=True,
        source="NVIDIA H200 datasheet",
    ),
}
# what torch.cuda.get_device_name says of each, for this machine's own GPUs
CUDA_NAMES = {"A100": "a100", "H100": "h100", "H200": "h200"}


def named(kind: str, given: str | None = None) -> Device:
    """The named device ``kind``; a ``ConfigError`` naming the value (``given``: the argument it
    came from) and the choices else."""
    device = NAMED.get(kind.lower())
    if device is None:
        where = f"--devices ({given!r})" if given else "the device kind"
        raise ConfigError(
            f"{where} names {kind!r}, a device the time plan does not know: choose one of "
            f"{', '.join(NAMED)} (e.g. 2xa100), or give a size in GiB (2x80) for the memory "
            "plan alone."
        )
    return device


def local_gpu() -> Device | None:
    """This machine's GPU as a named device, where it is one the plan knows (None else)."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    return next((NAMED[k] for key, k in CUDA_NAMES.items() if key in name), None)


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
    """FLOP/s of ``scaled_dot_product_attention`` with 4 heads of 64 over 2 KV heads: ``decode``,
    one query for each of 64 rows against 512 cached keys under a mask (32 MiB of cache);
    ``causal``, 4 rows of 512; ``causal_grad``, the same with its backward (2.5 times the
    forward's FLOPs)."""
    import torch
    import torch.nn.functional as F

    decode = kind == "decode"
    rows, length, keys = (64, 1, 512) if decode else (4, 512, 512)
    grad = kind == "causal_grad"
    q = torch.rand(rows, 4, length, 64, requires_grad=grad)
    k = torch.rand(rows, 2, keys, 64, requires_grad=grad)
    v = torch.rand(rows, 2, keys, 64, requires_grad=grad)
    mask = torch.ones(rows, 1, length, keys, dtype=torch.bool) if decode else None

    def attend() -> None:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=not decode, enable_gqa=True
        )
        if grad:
            out.sum().backward()

    pairs = rows * keys if decode else rows * keys * (keys + 1) / 2
    return (3.5 if grad else 1.0) * 4 * 4 * 64 * pairs / _best(attend, 5)


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
    """Bytes of the CPU's last-level cache (sysfs), 32 MiB where it does not say."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=32 * 2**20)
