"""Rebuild the embedded tiny world's base model: ``python -m tandem.assets.build``.

Steps, all deterministic from ``--seed`` on this machine's CPU with a fixed thread count:
1. generate the arithmetic task (``tandem.data.arithmetic``);
2. train the byte-level BPE tokenizer on the train split (``tandem.assets.tokenizer``);
3. fine-tune a tiny ``Qwen3ForCausalLM`` from random init on the worked solutions, mixed with
   hasty guesses (the answer with no working) at a rate that grows with the problem, loss on the
   response only, with a warmup + cosine schedule that runs to its end;
4. measure greedy and temperature-1 accuracy on held-out test problems;
5. write one Hugging Face folder (model, tokenizer, generation config, ``build_info.json``).

The model is deliberately imperfect (about half the test problems right): RL needs room to
improve and groups of samples that disagree. The schedule length is what sets that level; it was
chosen by evaluation and is recorded in ``build_info.json`` with the accuracy it reached.

What this file leaves out: the RL itself, and the vocabulary boundary tables (``tandem.samplers``).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from tandem.assets import TINY_WORLD
from tandem.assets.tokenizer import IM_END, PAD, train_tokenizer
from tandem.data.arithmetic import (
    answer_is_correct,
    hasty_solution,
    make_splits,
    operation_count,
)
from tandem.data.prompts import format_prompt, user_message

# The recipe of the committed model. Changing any of these changes the model.
RECIPE = {
    "seed": 0,
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    # vLLM serves only head_dim >= 32
    "head_dim": 48,
    "steps": 1200,
    "batch_size": 32,
    "lr": 3e-3,
    "warmup_steps": 50,
    "weight_decay": 0.1,
    # stage 2, a habit: a short fine-tune on answers of which a share are hasty guesses with no
    # working (``hasty_solution``): ``hasty_share`` of the problems with at least
    # ``hasty_min_ops`` operations, ``hasty_share_short`` of the shorter ones. The base then
    # guesses on long problems, which it mostly gets wrong, though it can work them out: the
    # choice RL with a verifiable reward is known to teach (0 steps: no stage 2)
    "hasty_steps": 200,
    "hasty_lr": 1e-3,
    "hasty_share": 0.5,
    "hasty_share_short": 0.0,
    "hasty_min_ops": 3,
    "eval_problems": 500,
    # matmul reduction order depends on the thread count; fix it so rebuilds match bit for bit
    "threads": 2,
    # evaluate every N steps while training (0: never); for choosing the schedule length
    "probe_every": 0,
}


def build_tokenizer(train_rows):
    texts = (
        f"user\n{user_message(p)}\nassistant\n{s}"
        for p, s in zip(train_rows["prompt"], train_rows["solution"], strict=True)
    )
    return train_tokenizer(texts)


def make_model(tokenizer, recipe: dict) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=recipe["hidden_size"],
        intermediate_size=recipe["intermediate_size"],
        num_hidden_layers=recipe["num_hidden_layers"],
        num_attention_heads=recipe["num_attention_heads"],
        num_key_value_heads=recipe["num_key_value_heads"],
        head_dim=recipe["head_dim"],
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
    )
    return Qwen3ForCausalLM(config)


def training_answers(rows, recipe: dict) -> list[str]:
    """The fine-tuning answer of each row: its worked solution, or a hasty guess at the recipe's
    rate for its length (drawn from the recipe's seed, apart from the task's own randomness)."""
    rng = random.Random(f"hasty-{recipe['seed']}")
    answers = []
    for row in rows:
        long = operation_count(row) >= recipe["hasty_min_ops"]
        share = recipe["hasty_share"] if long else recipe["hasty_share_short"]
        answers.append(hasty_solution(row) if rng.random() < share else row["solution"])
    return answers


def encode_examples(tokenizer, rows, answers: list[str]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) per row, tokenized apart as generation will see them."""
    prompts = [format_prompt(tokenizer, p) for p in rows["prompt"]]
    responses = [s + IM_END for s in answers]
    p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    r_ids = tokenizer(responses, add_special_tokens=False)["input_ids"]
    return list(zip(p_ids, r_ids, strict=True))


def collate(examples, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels (-100 off the response)."""
    width = max(len(p) + len(r) for p, r in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # [B, T]
    labels = torch.full_like(ids, -100)  # [B, T]
    mask = torch.zeros_like(ids)  # [B, T]
    for i, (p, r) in enumerate(examples):
        n = len(p) + len(r)
        ids[i, :n] = torch.tensor(p + r)
        labels[i, len(p) : n] = torch.tensor(r)
        mask[i, :n] = 1
    return ids, mask, labels


def lr_at(step: int, recipe: dict) -> float:
    """Linear warmup, then cosine decay to zero at the last step."""
    warm, total = recipe["warmup_steps"], recipe["steps"]
    if step < warm:
        return recipe["lr"] * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return recipe["lr"] * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(model, examples, pad_id: int, recipe: dict, probe=None) -> dict:
    """Supervised fine-tuning for exactly ``recipe['steps']`` steps; returns throughput stats.

    ``probe(step)``, if given, runs every ``recipe['probe_every']`` steps (used when choosing
    the schedule length; the committed build does not probe).
    """
    opt = torch.optim.AdamW(
        model.parameters(), lr=recipe["lr"], betas=(0.9, 0.95), weight_decay=recipe["weight_decay"]
    )
    rng = random.Random(recipe["seed"])
    order: list[int] = []
    tokens, start = 0, time.perf_counter()
    model.train()
    bar = tqdm(range(recipe["steps"]), desc="fine-tune", unit="step")
    for step in bar:
        if len(order) < recipe["batch_size"]:
            fresh = list(range(len(examples)))
            rng.shuffle(fresh)
            order += fresh
        batch = [examples[i] for i in order[: recipe["batch_size"]]]
        del order[: recipe["batch_size"]]
        ids, mask, labels = collate(batch, pad_id)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, recipe)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += int(mask.sum())
        if probe and recipe.get("probe_every") and (step + 1) % recipe["probe_every"] == 0:
            probe(step + 1)
            model.train()
        if step % 10 == 0:
            rate = tokens / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{rate:.0f}")
    seconds = time.perf_counter() - start
    return {
        "train_seconds": round(seconds, 1),
        "train_tokens": tokens,
        "tokens_per_second": round(tokens / seconds),
    }


@torch.no_grad()
def accuracy(
    model,
    tokenizer,
    rows,
    temperature: float = 0.0,
    batch_size: int = 100,
    max_new_tokens: int = 160,
    seed: int = 0,
) -> float:
    """Share of ``rows`` whose sampled solution boxes the right answer."""
    model.eval()
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    correct = 0
    for lo in tqdm(range(0, len(rows), batch_size), desc=f"eval T={temperature}", leave=False):
        chunk = rows[lo : lo + batch_size]
        prompts = [format_prompt(tokenizer, p) for p in chunk["prompt"]]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_k": 0}
            if temperature
            else {"do_sample": False}
        )
        out = model.generate(**enc, max_new_tokens=max_new_tokens, **sampling)
        texts = tokenizer.batch_decode(
            out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
        )
        correct += sum(answer_is_correct(t, a) for t, a in zip(texts, chunk["answer"], strict=True))
    return correct / len(rows)


def build(out: Path, recipe: dict, stage1: Path | None = None) -> dict:
    """Build the tiny world into ``out`` (replaced atomically) and return its build info.

    ``stage1``: a folder holding the first stage's model (the worked-solutions fine-tune of this
    recipe, e.g. from an earlier build's ``stage1/``), to run only the second stage.
    """
    torch.set_num_threads(recipe["threads"])
    torch.manual_seed(recipe["seed"])
    t0 = time.perf_counter()
    splits = make_splits(recipe["seed"])
    tokenizer = build_tokenizer(splits["train"])
    print(f"tokenizer: {len(tokenizer)} tokens")
    model = make_model(tokenizer, recipe)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters")
    rows = splits["train"]
    test = splits["test"].select(range(recipe["eval_problems"]))
    probe_rows = splits["validation"].select(range(200))

    def probe(step: int) -> None:
        acc = accuracy(model, tokenizer, probe_rows)
        tqdm.write(f"step {step}: greedy accuracy {acc:.3f} on 200 validation problems")

    stats: dict = {}
    if stage1 is None:
        worked = encode_examples(tokenizer, rows, list(rows["solution"]))
        stats["stage1"] = train(model, worked, tokenizer.pad_token_id, recipe, probe)
    else:
        model.load_state_dict(Qwen3ForCausalLM.from_pretrained(stage1).state_dict())
        stats["stage1"] = {"from": str(stage1)}
    stage1_model = copy.deepcopy(model)
    stats["stage1"]["greedy_accuracy"] = accuracy(model, tokenizer, test)
    if recipe["hasty_steps"]:
        habit = {
            **recipe,
            "steps": recipe["hasty_steps"],
            "lr": recipe["hasty_lr"],
            "warmup_steps": min(recipe["warmup_steps"], recipe["hasty_steps"]),
        }
        mixed = encode_examples(tokenizer, rows, training_answers(rows, recipe))
        stats["stage2"] = train(model, mixed, tokenizer.pad_token_id, habit, probe)
    info = {
        "recipe": recipe,
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        **stats,
        "greedy_accuracy": accuracy(model, tokenizer, test),
        "temperature_1_accuracy": accuracy(model, tokenizer, test, temperature=1.0),
        "eval_problems": len(test),
        **provenance(t0),
    }
    # the first stage's model too, so that a change to the second stage can start from it
    write_folder(out, model, tokenizer, info, {"stage1": stage1_model})
    return info


def provenance(t0: float) -> dict[str, object]:
    """What ``build_info.json`` records of a build begun at ``t0`` (``time.perf_counter``): how
    long it took and what it ran on."""
    return {
        "build_seconds": round(time.perf_counter() - t0, 1),
        "torch": torch.__version__,
        "machine": platform.machine(),
    }


def recipe_options(parser: argparse.ArgumentParser, recipe: dict) -> None:
    """One ``--key`` option per recipe entry (underscores as dashes), the recipe's value its
    type and default: a build's command line can change any number of the recipe."""
    for key, value in recipe.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value)


def report(info: dict, out: Path) -> None:
    """Print a build's info (its recipe left out: the command line said it) and where it went."""
    print(json.dumps({k: v for k, v in info.items() if k != "recipe"}, indent=2))
    print(f"wrote {out}")


def write_folder(
    out: Path, model, tokenizer, info: dict, extra: dict[str, object] | None = None
) -> None:
    """Write a built world's Hugging Face folder into ``out``, replacing it only once complete:
    the model with its sampling defaults, the tokenizer, ``build_info.json``, and ``extra``
    models in subfolders by name, each with the tokenizer."""
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
    )
    tokenizer.padding_side = "right"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        staged = Path(tmp) / "staged"
        model.save_pretrained(staged)
        tokenizer.save_pretrained(staged)
        for name, other in (extra or {}).items():
            other.generation_config = model.generation_config
            other.save_pretrained(staged / name)
            # each a checkpoint of its own: loadable as a junior, it needs its tokenizer
            tokenizer.save_pretrained(staged / name)
        (staged / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=TINY_WORLD, help="output folder")
    parser.add_argument(
        "--stage1",
        type=Path,
        default=None,
        help="start from this first-stage model (e.g. tandem/assets/tiny/stage1): stage 2 only",
    )
    recipe_options(parser, RECIPE)
    args = vars(parser.parse_args(argv))
    out, stage1 = args.pop("out"), args.pop("stage1")
    info = build(out, args, stage1)
    report(info, out)


if __name__ == "__main__":
    main()
