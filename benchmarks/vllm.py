"""Rollout throughput of the vLLM pair engine against vLLM solo (and the torch engine), by length.

Prints one JSON object. For each model and each response length, tokens per second (response
tokens over wall time, prefill included; ``*_tok_cpu_s``: over this process's CPU time, the
engine running in it) of:

- ``vllm_solo``: the senior alone in a plain vLLM engine;
- ``vllm_pair``: tandem (the word sampler at p=0.5) in one engine holding the senior and a
  junior of the same shape (the senior's weights from another folder);
- ``vllm_pair_smaller``: the same with a junior of another size (half the layers and half the
  width: the pair builds each model from its own config);
- ``vllm_solo_request_seeds`` / ``vllm_pair_request_seeds``: solo and the pair with a seed on
  every request, which sends vLLM's V1 sampler down its per-request loop (the backend's default
  on the V1 runner seeds the batch once per call instead);
- ``torch_tandem``: the torch engine, the same sampler;

the ratios, of rates per CPU second (a shared machine disturbs wall time far more):
``pair_vs_vllm_solo`` and ``pair_smaller_vs_vllm_solo`` (the goal: >= 0.45 at every
length, and for the smaller junior at least ``allowed_smaller``: the senior's cost over both
models' cost, cost being the multiply-adds of a token through a model, its LM head included),
``request_seeds_cost_solo`` / ``request_seeds_cost_pair`` (the rate with per-request seeds over
the rate without) and ``pair_vs_torch_tandem``; CPU milliseconds per step of the pair (a token
in every row) and its ``LLM.generate`` calls per batch.

Models: the tiny world's (512 positions: lengths up to 384) and the Qwen3-shaped random model of
``benchmarks/rollout.py`` (Qwen3's 151,936-wide vocabulary, a small body, 1,024 positions: up to
896). Every row runs to the full length (no EOS).

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
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from tandem.assets import TINY_WORLD  # noqa: E402
from tandem.engine import SamplingParams  # noqa: E402
from tandem.engine.vllm_backend import VLLMBackend  # noqa: E402
from tandem.samplers import WordSampler, boundary_tables  # noqa: E402

_spec = importlib.util.spec_from_file_location("rollout_benchmark", HERE / "rollout.py")
rollout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rollout)
ours, prompts_for, qwen_shaped = rollout.ours, rollout.prompts_for, rollout.qwen_shaped
# KV blocks of each engine (128 positions each): room for every row at the longest length,
# without the 1 GiB of host memory per engine that vLLM's CPU build reserves by default
BLOCKS = 400


def timed(run: Any, repeats: int) -> tuple[float, float]:
    """Response tokens per second of ``run()`` (which returns its tokens), best of ``repeats``:
    per second of wall time, and per second of this process's CPU time (every thread's; the
    engine runs in this process), which other work on the machine disturbs far less."""
    wall = cpu = 0.0
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        tokens = run()
        wall = max(wall, tokens / (time.perf_counter() - start))
        cpu = max(cpu, tokens / (time.process_time() - start_cpu))
    return wall, cpu


def vllm_rollouts(backend: Any, prompts: list, new_tokens: int, tables: Any, seeds: str) -> int:
    """The vLLM backend, solo (``tables`` None) or tandem, seeded per batch or per request;
    returns response tokens."""
    backend.seeds = seeds
    params = SamplingParams(max_new_tokens=new_tokens, eos_token_ids=(), seed=0)
    sampler = None if tables is None else WordSampler(tables, p=0.5)
    return int(backend.generate(prompts, sampler, params).lengths.sum())


class Calls:
    """Counts ``LLM.generate`` calls on a backend's engine."""

    def __init__(self, backend: Any) -> None:
        self.count = 0
        generate = backend.llm.generate

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return generate(*args, **kwargs)

        backend.llm.generate = counted


def smaller(folder: str, to: Path) -> Path:
    """A random junior of the model in ``folder`` with half its layers and half its width (as
    many KV heads, of the same size)."""
    config = AutoConfig.from_pretrained(folder)
    config.num_hidden_layers = max(1, config.num_hidden_layers // 2)
    config.layer_types = config.layer_types[: config.num_hidden_layers]
    config.hidden_size //= 2
    config.intermediate_size //= 2
    config.num_attention_heads = max(config.num_key_value_heads, config.num_attention_heads // 2)
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(config).save_pretrained(to)
    AutoTokenizer.from_pretrained(folder).save_pretrained(to)
    return to


def cost(folder: str | Path) -> int:
    """Multiply-adds of one token through the model: its matrices, the LM head included (the
    embedding lookup is none), attention over the context left out (short at these lengths)."""
    model = AutoModelForCausalLM.from_pretrained(folder)
    embed = model.get_input_embeddings().weight
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2 and p is not embed)
    head = model.get_output_embeddings().weight
    return matrices + (head.numel() if head is embed else 0)


def measure(folder: str, batch: int, lengths: list[int], repeats: int, work: Path) -> dict:
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = prompts_for(tok, batch)
    tables = boundary_tables(tok, model.config.vocab_size)
    same = work / f"same-{Path(folder).name}"  # a second folder: the junior's own weights
    shutil.copytree(folder, same, dirs_exist_ok=True)
    small = smaller(folder, work / f"smaller-{Path(folder).name}")
    longest = max(lengths) + max(len(p) for p in prompts) + 8
    args = dict(max_model_len=longest, engine_args={"num_gpu_blocks_override": BLOCKS})
    start = time.perf_counter()
    solo = VLLMBackend(folder, None, tok, **args)
    pair = VLLMBackend(folder, str(same), tok, **args)
    startup = time.perf_counter() - start
    pair_small = VLLMBackend(folder, str(small), tok, **args)
    calls = Calls(pair)
    # warm-up: first calls pay for allocations and lazy initialisation
    ours(model, model, prompts[:2], 4, tables)
    for backend, how in ((solo, None), (pair, tables), (pair_small, tables)):
        vllm_rollouts(backend, prompts[:2], 4, how, "batch")
    senior_cost = cost(folder)
    out: dict[str, Any] = {
        "vllm_startup_solo_and_pair_s": round(startup, 1),
        "allowed_smaller": round(senior_cost / (senior_cost + cost(small)), 3),
    }
    for n in lengths:
        before = calls.count
        runs = {
            "torch_tandem_tok_s": lambda n=n: ours(model, model, prompts, n, tables),
            "vllm_solo_tok_s": lambda n=n: vllm_rollouts(solo, prompts, n, None, "batch"),
            "vllm_pair_tok_s": lambda n=n: vllm_rollouts(pair, prompts, n, tables, "batch"),
            "vllm_pair_smaller_tok_s": lambda n=n: vllm_rollouts(
                pair_small, prompts, n, tables, "batch"
            ),
            "vllm_solo_request_seeds_tok_s": lambda n=n: vllm_rollouts(
                solo, prompts, n, None, "request"
            ),
            "vllm_pair_request_seeds_tok_s": lambda n=n: vllm_rollouts(
                pair, prompts, n, tables, "request"
            ),
        }
        measured = {k: timed(run, repeats) for k, run in runs.items()}
        row: dict[str, Any] = {k: round(w, 1) for k, (w, _) in measured.items()}
        row |= {k.replace("_tok_s", "_tok_cpu_s"): round(c, 1) for k, (_, c) in measured.items()}
        rates = {k: c for k, (_, c) in measured.items()}  # the ratios: per CPU second
        solo_rate = rates["vllm_solo_tok_s"]
        row["pair_vs_vllm_solo"] = round(rates["vllm_pair_tok_s"] / solo_rate, 3)
        row["pair_smaller_vs_vllm_solo"] = round(rates["vllm_pair_smaller_tok_s"] / solo_rate, 3)
        row["request_seeds_cost_solo"] = round(
            rates["vllm_solo_request_seeds_tok_s"] / solo_rate, 3
        )
        row["request_seeds_cost_pair"] = round(
            rates["vllm_pair_request_seeds_tok_s"] / rates["vllm_pair_tok_s"], 3
        )
        row["pair_vs_torch_tandem"] = round(
            rates["vllm_pair_tok_s"] / rates["torch_tandem_tok_s"], 3
        )
        row["pair_cpu_ms_per_step"] = round(1000 * batch / rates["vllm_pair_tok_s"], 2)
        # the pair's batch and request-seeded runs: one call each per repeat
        row["pair_generate_calls_per_batch"] = (calls.count - before) / (2 * repeats)
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
                "load_before": os.getloadavg(),
                "tandem_sampler": "word, p=0.5",
            },
            "tiny_world": measure(str(TINY_WORLD), batch, lengths, repeats, work),
            "qwen3_151k_vocab": measure(str(qwen), batch, lengths + longer, repeats, work),
        }
        result["settings"]["load_after"] = os.getloadavg()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
