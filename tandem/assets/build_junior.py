"""Build the tiny world's second junior, of another vocabulary (``tiny-bpe-small``).

Run ``python -m tandem.assets.build_junior``.

A partner of another family in miniature: a smaller ``Qwen3ForCausalLM`` with a *differently
trained* byte-level BPE (the same pre-tokenizer as the base, so words begin with a space under
both, but a quarter of the vocabulary, so the two models cut the same text into different
tokens with different ids). It is what ``model.junior_name_or_path=tiny-bpe-small`` loads, to
train and evaluate Tandem RL with a junior that shares no token table with the senior.

Steps, deterministic from ``--seed`` on this machine's CPU with a fixed thread count, reusing the
base's recipe code (``tandem.assets.build``):
1. generate the arithmetic task (the same splits as the base);
2. train the BPE tokenizer on the train split with at most ``vocab_size`` tokens;
3. fine-tune the small model from random init on the worked solutions (one stage: the base's
   second stage, a guessing habit, is what RL teaches away; a junior needs none);
4. measure greedy accuracy on held-out test problems;
5. write one Hugging Face folder (model, tokenizer, generation config, ``build_info.json``).

What this file leaves out: the base (``tandem.assets.build``) and how a cross-vocabulary pair
writes together (``tandem.engine.cross``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from tandem.assets import TINY_BPE_SMALL
from tandem.assets.build import (
    accuracy,
    encode_examples,
    make_model,
    provenance,
    recipe_options,
    report,
    train,
    write_folder,
)
from tandem.assets.tokenizer import train_tokenizer
from tandem.data.arithmetic import make_splits
from tandem.data.prompts import user_message

# The recipe of the committed junior. Changing any of these changes the model.
RECIPE = {
    "seed": 0,
    # about a third of the base's 1110 tokens: the same words fall into other pieces
    "vocab_size": 400,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "steps": 500,
    "batch_size": 32,
    "lr": 3e-3,
    "warmup_steps": 50,
    "weight_decay": 0.1,
    "eval_problems": 200,
    # matmul reduction order depends on the thread count; fix it so rebuilds match bit for bit
    "threads": 2,
}


def build(out: Path, recipe: dict) -> dict:
    """Build the junior into ``out`` (replaced atomically) and return its build info."""
    torch.set_num_threads(recipe["threads"])
    torch.manual_seed(recipe["seed"])
    t0 = time.perf_counter()
    splits = make_splits(recipe["seed"])
    rows = splits["train"]
    texts = (
        f"user\n{user_message(p)}\nassistant\n{s}"
        for p, s in zip(rows["prompt"], rows["solution"], strict=True)
    )
    tokenizer = train_tokenizer(texts, vocab_size=recipe["vocab_size"])
    model = make_model(tokenizer, recipe)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"tokenizer: {len(tokenizer)} tokens; model: {n_params / 1e6:.2f}M parameters")
    worked = encode_examples(tokenizer, rows, list(rows["solution"]))
    stats = train(model, worked, tokenizer.pad_token_id, recipe)
    test = splits["test"].select(range(recipe["eval_problems"]))
    info = {
        "recipe": recipe,
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "train": stats,
        "greedy_accuracy": accuracy(model, tokenizer, test, max_new_tokens=320),
        "eval_problems": len(test),
        **provenance(t0),
    }
    write_folder(out, model, tokenizer, info)
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=TINY_BPE_SMALL, help="output folder")
    recipe_options(parser, RECIPE)
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    info = build(out, args)
    report(info, out)


if __name__ == "__main__":
    main()
