"""Rollout throughput of the vLLM backend against the torch engine, solo and tandem, by length.

Prints one JSON object. For each model and each response length, tokens per second (response
tokens over wall time, prefill included) of:

- ``torch_solo`` / ``vllm_solo``: the senior alone (vLLM: a plain engine of the senior);
- ``torch_tandem``: the torch engine, the word sampler at p=0.5;
- ``vllm_pair``: tandem in one vLLM engine holding both models (``engine="pair"``);
- ``vllm_turns``: tandem through two vLLM engines in turns (``engine="turns"``), with the final
  teacher-forced passes for the other model's log-probs;

the ratios ``pair_vs_vllm_solo`` (the goal: >= 0.45 at every length), ``turns_vs_vllm_solo``
and ``pair_vs_torch_tandem``, milliseconds per step of the pair (a token in every row: flat
in the length when no token is re-read), and ``LLM.generate`` calls per batch of each tandem
engine. Senior and junior hold the same weights from two folders, so nothing is shared that
two different models could not share. Models: the tiny world's (512 positions: lengths up to
384) and the Qwen3-shaped random model of ``benchmarks/rollout.py`` (Qwen3's 151,936-wide
vocabulary, a small body, 1,024 positions: up to 896). Every row runs to the full length (no EOS).

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
ours, prompts_for, qwen_shaped = rollout.ours, rollout.prompts_for, rollout.qwen_shaped


def timed(run: Any, repeats: int) -> float:
    """Response tokens per second of ``run()`` (which returns its tokens), best of ``repeats``."""
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = run()
        best = max(best, tokens / (time.perf_counter() - start))
    return best


def vllm_rollouts(backend: Any, prompts: list[list[int]], new_tokens: int, tables: Any) -> int:
    """The vLLM backend, solo (``tables`` None) or tandem; returns response tokens."""
    params = SamplingParams(max_new_tokens=new_tokens, eos_token_ids=(), seed=0)
    sampler = None if tables is None else WordSampler(tables, p=0.5)
    return int(backend.generate(prompts, sampler, params).lengths.sum())


class Calls:
    """Counts ``LLM.generate`` calls on a backend's engines."""

    def __init__(self, backend: Any) -> None:
        self.count = 0
        for engine in {id(e): e for e in (backend.senior, backend.junior)}.values():
            engine.generate = self._counted(engine.generate)

    def _counted(self, generate: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return generate(*args, **kwargs)

        return counted


def measure(folder: str, batch: int, lengths: list[int], repeats: int, work: Path) -> dict:
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = prompts_for(tok, batch)
    tables = boundary_tables(tok, model.config.vocab_size)
    junior = work / f"junior-{Path(folder).name}"  # a second folder: a second engine
    shutil.copytree(folder, junior, dirs_exist_ok=True)
    longest = max(lengths) + max(len(p) for p in prompts) + 8  # a turn asks one token more
    start = time.perf_counter()
    solo = VLLMBackend(folder, None, tok, max_model_len=longest)
    pair = VLLMBackend(folder, str(junior), tok, engine="pair", max_model_len=longest)
    startup = time.perf_counter() - start
    turns = VLLMBackend(folder, str(junior), tok, engine="turns", max_model_len=longest)
    calls = {"pair": Calls(pair), "turns": Calls(turns)}
    # warm-up: first calls pay for allocations and lazy initialisation
    ours(model, model, prompts[:2], 4, tables)
    for backend, how in ((solo, None), (pair, tables), (turns, tables)):
        vllm_rollouts(backend, prompts[:2], 4, how)
    out: dict[str, Any] = {"vllm_startup_solo_and_pair_s": round(startup, 1)}
    for n in lengths:
        before = {k: c.count for k, c in calls.items()}
        runs = {
            "torch_solo_tok_s": lambda n=n: ours(model, None, prompts, n, tables),
            "torch_tandem_tok_s": lambda n=n: ours(model, model, prompts, n, tables),
            "vllm_solo_tok_s": lambda n=n: vllm_rollouts(solo, prompts, n, None),
            "vllm_pair_tok_s": lambda n=n: vllm_rollouts(pair, prompts, n, tables),
            "vllm_turns_tok_s": lambda n=n: vllm_rollouts(turns, prompts, n, tables),
        }
        rates = {k: timed(run, repeats) for k, run in runs.items()}
        row: dict[str, Any] = {k: round(v, 1) for k, v in rates.items()}
        row["pair_vs_vllm_solo"] = round(rates["vllm_pair_tok_s"] / rates["vllm_solo_tok_s"], 3)
        row["turns_vs_vllm_solo"] = round(rates["vllm_turns_tok_s"] / rates["vllm_solo_tok_s"], 3)
        row["pair_vs_torch_tandem"] = round(
            rates["vllm_pair_tok_s"] / rates["torch_tandem_tok_s"], 3
        )
        row["pair_ms_per_step"] = round(1000 * batch / rates["vllm_pair_tok_s"], 2)  # a token a row
        for k, c in calls.items():
            row[f"{k}_generate_calls_per_batch"] = (c.count - before[k]) / repeats
        out[str(n)] = row
        print(f"{Path(folder).name} {n}: {json.dumps(row)}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small batch, short responses")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: default)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per method")
    parser.add_argument("--lengths", type=int, nargs="+", help="response lengths (tokens)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batch = 16 if args.quick else 32
    lengths = args.lengths or ([32, 64] if args.quick else [64, 128, 256, 384])
    repeats = args.repeats or 1
    longer = [] if args.quick or args.lengths else [512, 896]  # the Qwen-shaped model's 1,024

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
                "lengths": lengths,
                "repeats": repeats,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "vllm": vllm.__version__,
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "tandem_sampler": "word, p=0.5, senior and junior the same weights",
            },
            "tiny_world": measure(str(TINY_WORLD), batch, lengths, repeats, work),
            "qwen3_151k_vocab": measure(str(qwen), batch, lengths + longer, repeats, work),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
