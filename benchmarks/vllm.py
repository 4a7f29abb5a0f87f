"""Rollout throughput of the vLLM backend against the torch engine, solo and tandem.

Prints one JSON object. For each model, tokens per second (response tokens over wall time,
prefill and, for tandem, the final teacher-forced log-prob passes included) of:

- ``torch_solo`` / ``vllm_solo``: the senior alone;
- ``torch_tandem`` / ``vllm_tandem``: the word sampler at p=0.5, senior and junior the same
  weights in two engines (vLLM: two ``LLM`` instances from two folders, so nothing is shared
  that two different models could not share);

and the ratios ``vllm_vs_torch_solo`` and ``vllm_vs_torch_tandem``. Models: the tiny world's, and
the Qwen3-shaped random model of ``benchmarks/rollout.py`` (Qwen3's 151,936-wide vocabulary and a
small body). Every row runs to the full length (no EOS), so both backends do the same work.

Usage (in the vLLM environment, see ``.ci/vllm``): ``python benchmarks/vllm.py [--quick]``.
What this file leaves out: GPUs (vLLM's reason to exist; run it there for those numbers).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Python puts this script's folder first on the path, where this file would shadow the vllm
# package: take it off, and load benchmarks/rollout.py by its path instead.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
# vLLM logs to stdout by its own config; without it, its warnings go to stderr and stdout holds
# only the JSON
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from tandem.assets import TINY_WORLD  # noqa: E402
from tandem.engine import SamplingParams  # noqa: E402
from tandem.engine.vllm_backend import VLLMBackend  # noqa: E402
from tandem.samplers import WordSampler, boundary_tables  # noqa: E402

_spec = importlib.util.spec_from_file_location("rollout_benchmark", HERE / "rollout.py")
rollout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rollout)
ours, prompts_for, qwen_shaped, timed = (
    rollout.ours,
    rollout.prompts_for,
    rollout.qwen_shaped,
    rollout.timed,
)


def vllm_rollouts(backend: Any, prompts: list[list[int]], new_tokens: int, tables: Any) -> int:
    """The vLLM backend, solo (``tables`` None) or tandem; returns response tokens."""
    params = SamplingParams(max_new_tokens=new_tokens, eos_token_ids=(), seed=0)
    sampler = None if tables is None else WordSampler(tables, p=0.5)
    return int(backend.generate(prompts, sampler, params).lengths.sum())


def measure(folder: str, batch: int, new_tokens: int, repeats: int, work: Path) -> dict:
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = prompts_for(tok, batch)
    tables = boundary_tables(tok, model.config.vocab_size)
    junior = work / f"junior-{Path(folder).name}"  # a second folder: a second engine
    shutil.copytree(folder, junior, dirs_exist_ok=True)
    start = time.perf_counter()
    backend = VLLMBackend(folder, str(junior), tok)
    startup = time.perf_counter() - start
    # warm-up: first calls pay for allocations and lazy initialisation
    ours(model, model, prompts[:2], 4, tables)
    vllm_rollouts(backend, prompts[:2], 4, tables)
    rates = {
        "torch_solo_tok_s": timed(lambda: ours(model, None, prompts, new_tokens, tables), repeats),
        "vllm_solo_tok_s": timed(
            lambda: vllm_rollouts(backend, prompts, new_tokens, None), repeats
        ),
        "torch_tandem_tok_s": timed(
            lambda: ours(model, model, prompts, new_tokens, tables), repeats
        ),
        "vllm_tandem_tok_s": timed(
            lambda: vllm_rollouts(backend, prompts, new_tokens, tables), repeats
        ),
    }
    rates = {k: round(v, 1) for k, v in rates.items()}
    rates["vllm_vs_torch_solo"] = round(rates["vllm_solo_tok_s"] / rates["torch_solo_tok_s"], 3)
    rates["vllm_vs_torch_tandem"] = round(
        rates["vllm_tandem_tok_s"] / rates["torch_tandem_tok_s"], 3
    )
    rates["vllm_startup_s"] = round(startup, 1)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small batch, short responses")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per method")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batch, new_tokens = (16, 32) if args.quick else (64, 128)
    repeats = args.repeats or (1 if args.quick else 2)

    import vllm

    from tandem.assets.qwen_vocab import qwen_tokenizer_folder

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        qwen = work / "qwen3_151k"
        qwen_shaped().save_pretrained(qwen)
        AutoTokenizer.from_pretrained(qwen_tokenizer_folder()).save_pretrained(qwen)
        result = {
            "settings": {
                "batch": batch,
                "new_tokens": new_tokens,
                "repeats": repeats,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "vllm": vllm.__version__,
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "tandem_sampler": "word, p=0.5, senior and junior the same weights",
            },
            "tiny_world": measure(str(TINY_WORLD), batch, new_tokens, repeats, work),
            "qwen3_151k_vocab": measure(str(qwen), batch, new_tokens, repeats, work),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
