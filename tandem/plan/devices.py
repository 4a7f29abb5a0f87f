"""What a device can do per second: the named GPUs' published roofs, and this machine's CPU,
measured by a short probe.

A ``Device`` answers how long a piece of work (``tandem.plan.work.Work``) takes on it:

- a GPU: the larger of its arithmetic at the peak dense FLOP/s and its bytes at the memory
  bandwidth (the roofline), each at the share of the peak large kernels reach
  (``COMPUTE_SHARE``, ``MEMORY_SHARE``); the host's dispatch of every eager op apart
  (``op_s``), which the caller sets against the device's time, since a GPU runs behind its host;
- the CPU: the sum of its arithmetic (attention's apart, at its own rate), its memory traffic
  (at the cache's rate where an operation's working set fits this core's share of the
  last-level cache, else at memory's), the GEMM weights it streams, its exponentials, the first
  touch of freshly mapped memory, and every op's dispatch. On one core these do not overlap: a
  GEMM of Qwen's LM head (K = 128) at 16 rows takes the time of its arithmetic plus that of
  streaming its weight, not the larger of the two.

The CPU's figures come from ``tandem.plan.probe.probe_cpu``.

What this file leaves out: what a phase's work is (``tandem.plan.work``, ``tandem.plan.time``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

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
            traffic = work.bytes + work.weights + work.cache_reads
            memory = traffic / (self.memory_bw * MEMORY_SHARE)
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
