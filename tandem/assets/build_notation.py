"""Rebuild the notation world's base model: ``python -m tandem.assets.build_notation``.

Steps, all deterministic from the recipe on this machine's CPU with a fixed thread count:
1. the tiny world's task and its first-stage model (``tandem/assets/tiny/stage1``: worked
   solutions only, about half the test problems right), and the tiny world's tokenizer;
2. fine-tune it on the train split's solutions, ``compact_share`` of them rewritten in the compact
   notation (``tandem.data.notation``: digits reversed, drawn from the recipe's seed), each compact
   step followed by the pause line at ``pause_share``; loss on the response only, warmup then
   cosine to zero;
3. measure, on held-out test problems, the accuracy of each notation (greedy, the notation forced
   by its opening words), the share of compact solutions the base writes at temperature 1 and the
   share of those with a pause, with no budget and at the world's budget;
4. write one Hugging Face folder (model, tokenizer, generation config, ``build_info.json``).

The base writes the ordinary notation most of the time and pauses in most compact solutions.
Under the world's budget an ordinary solution rarely fits and a paused compact one never does,
while a compact one without pauses always fits, so leaving out the pauses is what RL can
learn to write, and nothing else shortens text that pays; the frozen junior, still pausing,
continues such text less well. The recipe's numbers were chosen by measurement
(``python -m tandem.analysis.notation`` and solo GRPO probes, ``docs/worlds.md``).

What this file leaves out: the task (``tandem.data.arithmetic``), the notation
(``tandem.data.notation``) and the first world's build (``tandem.assets.build``).
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from tandem.assets import NOTATION_WORLD, TINY_WORLD
from tandem.assets.build import (
    accuracy,
    encode_examples,
    provenance,
    recipe_options,
    report,
    train,
    write_folder,
)
from tandem.data.arithmetic import make_splits
from tandem.data.notation import compact_solution

# The world's response budget (conf/world/notation.yaml): every compact solution without a
# pause fits, none with one does; no ordinary solution of three operations fits,
# a third of the two-operation ones do.
BUDGET = 56

# The recipe of the committed model. Changing any of these changes the model.
RECIPE = {
    "seed": 0,
    # share of the fine-tuning solutions written in the compact notation
    "compact_share": 0.35,
    # chance that each step of a compact answer is followed by the pause line
    "pause_share": 0.4,
    "steps": 400,
    "batch_size": 32,
    "lr": 1e-3,
    "warmup_steps": 20,
    "weight_decay": 0.1,
    "eval_problems": 500,
    # matmul reduction order depends on the thread count; fix it so rebuilds match bit for bit
    "threads": 1,
}


def training_answers(rows, recipe: dict) -> list[str]:
    """Each row's fine-tuning answer: compact at the recipe's share (drawn from its seed, apart
    from the task's own randomness), else the ordinary worked solution. Each step of a compact
    answer is followed by the pause line at ``pause_share`` (its own draws, so a share of 0 gives
    the answers of a recipe without pauses)."""
    rng = random.Random(f"notation-{recipe['seed']}")
    pauses = random.Random(f"notation-pause-{recipe['seed']}")
    share = recipe["compact_share"]
    # one draw a step of each compact answer, as the solution asks for them
    pause = (pauses.random() < recipe["pause_share"] for _ in itertools.repeat(None))
    return [compact_solution(r, pause) if rng.random() < share else r["solution"] for r in rows]


def build(out: Path, recipe: dict, start: Path, budget: int = BUDGET) -> dict:
    """Build the notation world into ``out`` (replaced atomically) from the first-stage model in
    ``start``; returns its build info, with accuracies measured with no budget and at
    ``budget`` response tokens (which does not change the model)."""
    from tandem.analysis.notation import notation_accuracy

    torch.set_num_threads(recipe["threads"])
    torch.manual_seed(recipe["seed"])
    t0 = time.perf_counter()
    splits = make_splits(recipe["seed"])
    tokenizer = AutoTokenizer.from_pretrained(TINY_WORLD)
    model = Qwen3ForCausalLM.from_pretrained(start)
    rows = splits["train"]
    examples = encode_examples(tokenizer, rows, training_answers(rows, recipe))
    stats = train(model, examples, tokenizer.pad_token_id, recipe)
    test = splits["test"].select(range(recipe["eval_problems"]))
    info = {
        "recipe": recipe,
        "start": str(start.relative_to(start.parents[2])) if len(start.parents) > 2 else str(start),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "fine_tune": stats,
        "greedy_accuracy": accuracy(model, tokenizer, test, max_new_tokens=budget),
        # the notation's skill (no budget), then what the budget leaves of it
        "unlimited": notation_accuracy(model, tokenizer, test),
        "budget": {
            "max_new_tokens": budget,
            **notation_accuracy(model, tokenizer, test, max_new_tokens=budget),
        },
        **provenance(t0),
    }
    write_folder(out, model, tokenizer, info)
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=NOTATION_WORLD, help="output folder")
    parser.add_argument(
        "--budget", type=int, default=BUDGET, help="response tokens the accuracies are measured at"
    )
    parser.add_argument(
        "--start",
        type=Path,
        default=TINY_WORLD / "stage1",
        help="the model fine-tuned (default: the tiny world's first stage)",
    )
    recipe_options(parser, RECIPE)
    args = vars(parser.parse_args(argv))
    out, start, budget = args.pop("out"), args.pop("start"), args.pop("budget")
    info = build(out, args, start, budget)
    report(info, out)


if __name__ == "__main__":
    main()
