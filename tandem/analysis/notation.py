"""Is the notation world's mechanism there? ``python -m tandem.analysis.notation``.

Measures, on held-out test problems, for the notation world's base and for any trained seniors
given with ``--senior`` (a run's exported ``senior/`` folder or a checkpoint folder):

- ``accuracy``: greedy accuracy with the notation forced, ``compact`` by writing the compact
  mark first, ``ordinary`` by forbidding the mark's first token at the response's first position;
- ``share``, ``accuracy_as_chosen`` and ``compact_paused``: at the training temperature, the
  share of solutions the model writes in the compact notation, its accuracy in each notation it
  chose, and the share of its compact solutions with a pause line;
- ``continues``: greedy accuracy when the model is handed the first ``--cut`` lines (the opening
  and ``cut - 1`` steps) of a correct solution in each notation, with no pause, and must finish
  it, and the share of compact continuations that pause. For the base this is the frozen junior
  handed a senior's text; a senior's figure beside it shows who stumbles where.

Prints one JSON object. The mechanism the world needs: the base rarely writes the compact
notation and pauses in it; solo GRPO adopts it and leaves the pauses out; the base, handed such a
solution, still pauses (``docs/worlds.md``).

What this file leaves out: training (``tandem.train``) and the study (``tandem.analysis.study``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.assets import resolve
from tandem.data.arithmetic import answer_is_correct, make_splits
from tandem.data.notation import COMPACT_MARK, compact_solution, notation_of, pauses_in
from tandem.data.prompts import format_prompt

NOTATIONS = ("ordinary", "compact")


@torch.no_grad()
def complete(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    temperature: float = 0.0,
    banned_first: int | None = None,
    max_new_tokens: int = 160,
    batch_size: int = 100,
    seed: int = 0,
) -> list[str]:
    """Each prompt's completion (greedy at temperature 0); ``banned_first``: a token id the first
    generated token may not be."""
    model.eval()
    tokenizer.padding_side = "left"
    torch.manual_seed(seed)
    everything = list(range(len(tokenizer)))
    texts: list[str] = []
    for lo in range(0, len(prompts), batch_size):
        enc = tokenizer(
            prompts[lo : lo + batch_size],
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
        )
        width = enc["input_ids"].shape[1]
        kwargs: dict[str, Any] = (
            {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            if temperature
            else {"do_sample": False}
        )
        if banned_first is not None:
            allowed = [t for t in everything if t != banned_first]
            kwargs["prefix_allowed_tokens_fn"] = _first_banned(allowed, everything, width)
        out = model.generate(**enc, max_new_tokens=max_new_tokens, **kwargs)
        texts += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return texts


def _first_banned(allowed: list[int], everything: list[int], width: int) -> Any:
    """``prefix_allowed_tokens_fn``: ``allowed`` at the first generated position, then all."""
    return lambda _, ids: allowed if ids.shape[0] == width else everything


def _correct(texts: list[str], answers: list[str]) -> float:
    return round(
        sum(answer_is_correct(t, a) for t, a in zip(texts, answers, strict=True)) / len(texts), 3
    )


def notation_accuracy(
    model: Any, tokenizer: Any, rows: Any, temperature: float = 1.0, max_new_tokens: int = 160
) -> dict:
    """Greedy accuracy per notation (forced), and the share and accuracy of each notation the
    model chooses at ``temperature``, each solution cut at ``max_new_tokens``."""
    prompts = [format_prompt(tokenizer, p) for p in rows["prompt"]]
    answers = list(rows["answer"])
    mark_first = tokenizer(COMPACT_MARK, add_special_tokens=False)["input_ids"][0]
    n = max_new_tokens
    mark = len(tokenizer(COMPACT_MARK, add_special_tokens=False)["input_ids"])
    forced = {
        "ordinary": complete(model, tokenizer, prompts, banned_first=mark_first, max_new_tokens=n),
        "compact": complete(
            model, tokenizer, [p + COMPACT_MARK for p in prompts], max_new_tokens=n - mark
        ),
    }
    chosen = complete(model, tokenizer, prompts, temperature=temperature, max_new_tokens=n)
    kinds = [notation_of(t) for t in chosen]
    as_chosen = {}
    for kind in NOTATIONS:
        picked = [(t, a) for t, a, k in zip(chosen, answers, kinds, strict=True) if k == kind]
        as_chosen[kind] = _correct(*map(list, zip(*picked, strict=True))) if picked else None
    compact = [t for t, k in zip(chosen, kinds, strict=True) if k == "compact"]
    return {
        "accuracy": {k: _correct(v, answers) for k, v in forced.items()},
        f"share_compact_T{temperature:g}": round(kinds.count("compact") / len(kinds), 3),
        f"accuracy_as_chosen_T{temperature:g}": as_chosen,
        # of the compact solutions it chose, the share with a pause line
        f"compact_paused_T{temperature:g}": _paused(compact),
    }


def _paused(texts: list[str]) -> float | None:
    """The share of ``texts`` with a pause line (None: no texts)."""
    return round(sum(pauses_in(t) > 0 for t in texts) / len(texts), 3) if texts else None


def _prefix(solution: str, cut: int) -> str:
    """The first ``cut`` lines of a solution (its opening and ``cut - 1`` steps), and the blank
    line after them: where a handoff at a step boundary would pass the pen."""
    return "\n\n".join(solution.split("\n\n")[:cut]) + "\n\n"


def continuation_accuracy(model: Any, tokenizer: Any, rows: Any, cut: int) -> dict:
    """Greedy accuracy finishing the first ``cut`` lines of each notation's correct solution, and
    the share of compact continuations with a pause line."""
    out = {}
    answers = list(rows["answer"])
    for kind, write in (("ordinary", lambda r: r["solution"]), ("compact", compact_solution)):
        prompts = [format_prompt(tokenizer, r["prompt"]) + _prefix(write(r), cut) for r in rows]
        texts = complete(model, tokenizer, prompts)
        out[kind] = _correct(texts, answers)
        if kind == "compact":
            out["compact_paused"] = _paused(texts)
    return out


def measure(name_or_path: str, rows: Any, cut: int, temperature: float) -> dict:
    path = resolve(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return {
        **notation_accuracy(model, tokenizer, rows, temperature),
        "continues": continuation_accuracy(model, tokenizer, rows, cut),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="notation", help="the base model (default: notation)")
    parser.add_argument("--senior", action="append", default=[], help="a trained senior folder")
    parser.add_argument("--problems", type=int, default=300, help="test problems (default 300)")
    parser.add_argument("--cut", type=int, default=2, help="lines of the solution handed over")
    parser.add_argument("--temperature", type=float, default=0.6, help="sampling temperature")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = make_splits(0)["test"].select(range(args.problems))
    for folder in [args.base, *args.senior]:
        if folder != args.base and not Path(folder).is_dir():
            parser.error(f"--senior {folder!r} is not a folder: give a run's senior/ folder.")
    result = {
        "problems": args.problems,
        "cut": args.cut,
        "base": measure(args.base, rows, args.cut, args.temperature),
    }
    for folder in args.senior:
        result[folder] = measure(folder, rows, args.cut, args.temperature)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
