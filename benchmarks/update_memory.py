"""Peak memory of one update: packed micro-batches under a token budget against one padded pass.

Run: ``python benchmarks/update_memory.py [--budget 1024] [--chunk 256] [--sizes 4x128,...]``.

On the Qwen3-shaped model of ``benchmarks/rollout.py`` (Qwen3's 151,936-wide vocabulary, a small
body), each size ``rows x response tokens`` (with 32-token prompts) is one mini-batch whose
gradient is taken twice, each in a fresh process: ``packed`` through ``tandem.modules.update.
accumulate`` (rows packed without padding into micro-batches of at most ``--budget`` tokens, the
LM head ``--chunk`` positions at a time), and ``padded`` as the update did before (one forward over
the padded block, the whole ``[rows, tokens, vocabulary]`` log-softmax). The peak is the process's
resident high-water mark above its size just before the update (the kernel's mark is reset there
through ``/proc/self/clear_refs``; glibc's mmap threshold is pinned so that freed tensors leave).

Prints one JSON object: per size, each way's peak in MiB, and ``packed_growth`` /
``padded_growth``, the largest size's peak over the smallest's. The target: packed stays flat
(growth near 1) while padded grows with rows x tokens x vocabulary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = 32


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def one(way: str, rows: int, tokens: int, budget: int, chunk: int) -> float:
    """In this process: the peak MiB of one update of ``rows x tokens`` taken ``way``."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from rollout import qwen_shaped

    from tandem.modules.logprobs import micro_batches
    from tandem.modules.loss import LossConfig, grpo_loss
    from tandem.modules.update import UpdateBatch, accumulate

    torch.set_num_threads(1)
    model = qwen_shaped().train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (rows, PROMPT + tokens), generator=g)
    mask = torch.ones_like(ids)
    # lengths from a quarter to the whole: a realistic spread of padding
    for i in range(rows):
        mask[i, PROMPT + tokens // 4 + (i * 3 * tokens // 4) // max(1, rows - 1) :] = 0
    real = mask[:, PROMPT:].bool()
    old = torch.zeros(real.shape)
    batch = UpdateBatch(ids, mask, PROMPT, old, None, torch.randn(rows), real, ~real & real)
    cfg = LossConfig()
    before = rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    if way == "packed":
        parts = [(p, 1.0) for p in micro_batches(mask.sum(1), budget)]
        accumulate(model, batch, torch.arange(rows), parts, cfg, 0.6, lambda x: x.backward(), chunk)
    else:
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        logp = (logits[:, PROMPT - 1 : -1].float() / 0.6).log_softmax(-1)
        logp = logp.gather(-1, ids[:, PROMPT:, None]).squeeze(-1) * real
        loss, _ = grpo_loss(logp, old, None, batch.advantages, real, ~real & real, cfg)
        loss.backward()
    return (rss_kib("VmHWM") - before) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--sizes", default="4x128,8x192,16x256")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        way, rows, tokens = args.one.split(",")
        print(one(way, int(rows), int(tokens), args.budget, args.chunk))
        return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(ROOT)}
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    out: dict[str, object] = {"budget_tokens": args.budget, "chunk_tokens": args.chunk}
    peaks: dict[str, list[float]] = {"packed": [], "padded": []}
    for rows, tokens in sizes:
        for way in peaks:
            command = [sys.executable, __file__, "--one", f"{way},{rows},{tokens}"]
            command += ["--budget", str(args.budget), "--chunk", str(args.chunk)]
            result = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
            peaks[way].append(round(float(result.stdout.strip().splitlines()[-1]), 1))
        out[f"{rows}x{tokens}"] = {way: peaks[way][-1] for way in peaks}
    for way, values in peaks.items():
        out[f"{way}_growth"] = round(values[-1] / values[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
