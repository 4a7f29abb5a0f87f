"""Rollout throughput: Hugging Face ``generate`` vs our solo and tandem engine.

Prints one JSON object. For each model, tokens per second (response tokens over wall time,
prefill included) of:

- ``hf_generate``: ``model.generate`` sampling at temperature 1 (no top-k/top-p), solo;
- ``solo``: ``tandem.engine.generate`` with the solo sampler and no junior;
- ``tandem``: the word sampler at p=0.5 with the same model as senior and junior, so both read
  every token: 0.5 of solo is the ceiling when a forward dominates, and sampling shared across
  both models is what can lift it;
- ``asymmetric`` (tiny world only): the same schedule with ``tiny-bpe-small``, a smaller junior
  with a vocabulary of its own, through the cross-vocabulary engine (``tandem.engine.cross``),
  which steps the same sampler over each model's own tokens: the junior's words are
  re-tokenized, and each model reads a row's new words, packed, when it is to write there; the
  junior takes about 1.4 tokens per word of the base's. Its rate counts
  the senior's tokens, as ``tandem``'s does; its rows may stop a few tokens short of the full
  length (text the senior has not read is counted at a token per byte against the budget), so
  it is checked to write at least 90% of the full count rather than all of it.

and the ratios ``solo_vs_hf``, ``tandem_vs_solo`` and ``asymmetric_vs_tandem`` (target 0.7).
Models: the tiny world's, and a Qwen3-shaped random model with Qwen3's full 151,936-wide
vocabulary and a small hidden size (boundary tables from the real Qwen3 tokenizer), where
sampling over the vocabulary costs as much as the forward. Every row runs to the full length (no
EOS; ``generate`` is given an empty EOS list, as ``None`` would fall back to the model's own EOS
ids), so all do the same work, and each run checks that it wrote ``batch * new_tokens`` tokens.

The three take turns for R rounds (hf, solo, tandem, hf, ...); each rate is the median over the
rounds and each ratio the median of the rounds' ratios, so that a busy spell on a shared machine
slows a whole round rather than one method. Beside each ratio ``<ratio>_cpu`` is the same ratio
per second of the process's CPU time, which waiting for a busy core does not move, and
``<ratio>_load_1m`` the 1-minute load average before and after its model's rounds: on this
machine's ``settings.cpus`` cores, a load near 1 is this benchmark alone, and where the wall and
CPU ratios disagree, the load moved them (other work also evicts this one's caches, so even the
CPU ratios move a few hundredths under load). ``settings`` records the load before and after the
whole run.

Usage: ``python benchmarks/rollout.py [--quick] [--threads N] [--repeats R]`` (one thread unless
told otherwise). What this file leaves out: GPUs (it runs wherever the models are put: CPU here)
and vLLM.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import time
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from tandem.assets import TINY_BPE_SMALL, TINY_WORLD
from tandem.data.arithmetic import make_splits
from tandem.data.prompts import format_prompt
from tandem.engine import SamplingParams, generate
from tandem.samplers import WordSampler, boundary_tables


def prompts_for(tokenizer: Any, count: int) -> list[list[int]]:
    """``count`` chat prompts of arithmetic problems (ragged lengths)."""
    rows = make_splits(0, sizes={"train": 1, "validation": 1, "test": count})["test"]
    return [tokenizer(format_prompt(tokenizer, r["prompt"]))["input_ids"] for r in rows]


def qwen_shaped(hidden: int = 128) -> Any:
    """A random Qwen3 with the real vocabulary width and a small body."""
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        tie_word_embeddings=True,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).eval()


def hf_generate(model: Any, prompts: list[list[int]], new_tokens: int, pad: int) -> int:
    """Solo sampling with ``model.generate``; returns the number of response tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = copy.deepcopy(model.generation_config)
    config.update(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        eos_token_id=[],
        pad_token_id=pad,
    )
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return (out.shape[1] - width) * out.shape[0]


def ours(model: Any, junior: Any, prompts: list[list[int]], new_tokens: int, tables: Any) -> int:
    """Our engine, solo (``junior=None``) or tandem; returns the number of response tokens."""
    params = SamplingParams(max_new_tokens=new_tokens, eos_token_ids=(), seed=0)
    sampler = None if junior is None else WordSampler(tables, p=0.5)
    r = generate(model, junior, prompts, sampler, params)
    return int(r.lengths.sum())


def asymmetric(model: Any, junior: Any, tok: Any, junior_tok: Any, prompts, new_tokens) -> int:
    """The cross-vocabulary engine with ``junior`` (its own tokenizer); the senior's tokens."""
    params = SamplingParams(max_new_tokens=new_tokens, eos_token_ids=(), seed=0)
    sampler = WordSampler(tok, p=0.5)
    r = generate(
        model, junior, prompts, sampler, params, tokenizer=tok, junior_tokenizer=junior_tok
    )
    return int(r.lengths.sum())


def rounds(
    runs: dict[str, Any], expected: int, repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Tokens per second of each run in each of ``repeats`` rounds, the runs taking turns: per
    second of wall time, and per second of this process's CPU time.

    Taking turns puts the runs of a round under about the same load, so that a busy spell on a
    shared machine slows a whole round rather than one method's runs. CPU time (user and
    system, one thread) leaves out the time the process waited for a core, so its ratios are
    what a quiet machine's wall time would give, up to what other work does to the caches.
    """
    rates: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            start, used = time.perf_counter(), time.process_time()
            tokens = fn()
            seconds, used = time.perf_counter() - start, time.process_time() - used
            if name == "asymmetric":  # rows may stop short of the budget (see the module)
                assert 0.9 * expected <= tokens <= expected, f"{name} wrote {tokens} tokens"
            else:
                assert tokens == expected, f"{name} wrote {tokens} tokens, not {expected}"
            rates[name].append(tokens / seconds)
            cpu[name].append(tokens / used)
    return rates, cpu


def measure(
    model: Any, tok: Any, batch: int, new_tokens: int, repeats: int, cross: Any = None
) -> dict[str, Any]:
    """The runs on one model; ``cross``: ``(junior, its tokenizer)`` of another vocabulary."""
    prompts = prompts_for(tok, batch)
    pad = tok.pad_token_id
    # Boundary tables are built once per vocabulary, as a training run does.
    tables = boundary_tables(tok, model.config.vocab_size)
    # Warm-up on a small batch: first calls pay for allocations and lazy initialisation.
    hf_generate(model, prompts[:2], 4, pad)
    ours(model, model, prompts[:2], 4, tables)
    runs = {
        "hf_generate": lambda: hf_generate(model, prompts, new_tokens, pad),
        "solo": lambda: ours(model, None, prompts, new_tokens, tables),
        "tandem": lambda: ours(model, model, prompts, new_tokens, tables),
    }
    ratios = [("solo_vs_hf", "solo", "hf_generate"), ("tandem_vs_solo", "tandem", "solo")]
    if cross is not None:
        asymmetric(model, cross[0], tok, cross[1], prompts[:2], 4)  # warm-up
        runs["asymmetric"] = lambda: asymmetric(model, cross[0], tok, cross[1], prompts, new_tokens)
        ratios.append(("asymmetric_vs_tandem", "asymmetric", "tandem"))
    load = _load()
    rates, cpu = rounds(runs, batch * new_tokens, repeats)
    load = [load, _load()]
    # Medians: of the rates, and of each round's ratios (a round's runs share its load).
    result: dict[str, Any] = {
        f"{k}_tok_s": round(statistics.median(v), 1) for k, v in rates.items()
    }
    for name, a, b in ratios:
        result[name] = _median_ratio(rates[a], rates[b])
        # the same per second of CPU time, and the load the rounds ran under (see the module)
        result[f"{name}_cpu"] = _median_ratio(cpu[a], cpu[b])
        result[f"{name}_load_1m"] = load
    result["rounds_tok_s"] = {k: [round(x) for x in v] for k, v in rates.items()}
    return result


def _load() -> float:
    """The 1-minute load average, rounded."""
    return round(os.getloadavg()[0], 2)


def _median_ratio(a: list[float], b: list[float]) -> float:
    """The median over rounds of ``a / b``."""
    return round(statistics.median(x / y for x, y in zip(a, b, strict=True)), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small batch, short responses")
    # One thread by default: these models' matrices are small, and on a shared machine threads
    # that wait for each other's busy cores make every step many times slower, for all three.
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (0: torch's default)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per method")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batch, new_tokens = (16, 32) if args.quick else (64, 128)
    repeats = args.repeats or (1 if args.quick else 3)
    load_before = _load()

    from tandem.assets.qwen_vocab import qwen_tokenizer_folder

    tiny_tok = AutoTokenizer.from_pretrained(TINY_WORLD)
    tiny = AutoModelForCausalLM.from_pretrained(TINY_WORLD, dtype=torch.float32).eval()
    qwen_tok = AutoTokenizer.from_pretrained(qwen_tokenizer_folder())
    junior_tok = AutoTokenizer.from_pretrained(TINY_BPE_SMALL)
    junior = AutoModelForCausalLM.from_pretrained(TINY_BPE_SMALL, dtype=torch.float32).eval()
    result = {
        "settings": {
            "batch": batch,
            "new_tokens": new_tokens,
            "repeats": repeats,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "machine": platform.machine(),
            "tandem_sampler": "word, p=0.5, senior and junior the same model",
            "asymmetric_junior": "tiny-bpe-small (own tokenizer), word sampler at p=0.5",
            "cpus": os.cpu_count(),
        },
        "tiny_world": measure(tiny, tiny_tok, batch, new_tokens, repeats, (junior, junior_tok)),
        "qwen3_151k_vocab": measure(qwen_shaped(), qwen_tok, batch, new_tokens, repeats),
    }
    # 1-minute load averages: above the CPU count, other work was competing for the cores.
    result["settings"]["load_avg_1m"] = [load_before, _load()]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
