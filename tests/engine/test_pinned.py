"""The engine's rollouts pinned bit for bit: a change meant only to make the engine faster must
not change a single token, author or log-prob for the same seed.

A few small fixed cases (solo, the word schedule with its retractions, truncated sampling, a
schedule that ends rows, and a junior of another vocabulary) are generated, and two digests of
each are compared with those in ``pinned_rollouts.json``, recorded before the engine's speed work:
one of what was written (tokens, authors, lengths, stop reasons; both sequences of a cross pair),
one of every log-prob recorded. Rows stop on EOS in every case, so compaction is covered too.

The discrete digest must hold on any machine (a token would flip only if a uniform fell within a
float32 rounding of a cumulative sum's boundary). The log-probs' bits depend on the CPU's kernels,
so they are compared only under the torch version and CPU capability they were recorded with,
and skipped elsewhere with the reason. A change that is meant to change rollouts re-records them:
``TANDEM_RECORD_PINNED=1 pytest tests/engine/test_pinned.py -p no:xdist``, and says why in its
commit.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.assets import TINY_BPE_SMALL
from tandem.engine import SamplingParams, generate
from tandem.samplers import StepSampler, WordSampler

PINNED = Path(__file__).with_name("pinned_rollouts.json")
RECORD = os.environ.get("TANDEM_RECORD_PINNED") == "1"
# what was written, and the floats recorded beside it (``CrossRollouts.junior``'s too)
DISCRETE = ("tokens", "authors", "lengths", "stop_reasons")
FLOATS = ("senior_logprobs", "junior_logprobs", "old_logprobs", "ref_logprobs")
JUNIOR_FLOATS = ("logprobs",)
CASES = ("solo", "word", "word_top_p", "step_capped", "cross")


def machine() -> dict[str, str]:
    """What the log-probs' bits depend on besides the code."""
    return {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability()}


def digest(parts: list[tuple[str, torch.Tensor | None]]) -> str:
    """A sha256 of named tensors: their dtypes, shapes and bytes."""
    h = hashlib.sha256()
    for name, value in parts:
        h.update(name.encode())
        if value is None:
            h.update(b"none")
            continue
        h.update(f"{value.dtype}{tuple(value.shape)}".encode())
        h.update(value.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def digests(r) -> dict[str, str]:
    """The ``discrete`` and ``floats`` digests of rollouts ``r`` (and of a cross pair's junior
    sequences)."""
    discrete = [(k, getattr(r, k)) for k in DISCRETE]
    floats = [(k, getattr(r, k)) for k in FLOATS]
    junior = getattr(r, "junior", None)
    if junior is not None:
        discrete += [(f"junior.{k}", getattr(junior, k)) for k in ("tokens", "authors", "lengths")]
        floats += [(f"junior.{k}", getattr(junior, k)) for k in JUNIOR_FLOATS]
    return {"discrete": digest(discrete), "floats": digest(floats)}


@pytest.fixture(scope="module")
def junior_tokenizer():
    return AutoTokenizer.from_pretrained(TINY_BPE_SMALL)


@pytest.fixture(scope="module")
def small_junior():
    return AutoModelForCausalLM.from_pretrained(TINY_BPE_SMALL, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def runs(senior, junior, small_junior, prompts, tokenizer, junior_tokenizer) -> dict[str, dict]:
    """Each case's digests, generated now (4 prompts x 2 samples, up to 48 tokens, the model's
    own EOS, the loss's temperature recorded too)."""
    few = prompts[:4]

    def params(**knobs) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=48, samples_per_prompt=2, seed=7, logprob_temperature=0.7, **knobs
        )

    word = WordSampler(tokenizer, p=0.5)
    made = {
        "solo": generate(senior, None, few, None, params()),
        "word": generate(senior, junior, few, word, params()),
        "word_top_p": generate(senior, junior, few, word, params(temperature=0.8, top_p=0.9)),
        "step_capped": generate(
            senior, junior, few, StepSampler(tokenizer, first="coin", max_rounds=2), params()
        ),
        "cross": generate(
            senior,
            small_junior,
            few,
            WordSampler(tokenizer, p=0.5),
            params(),
            tokenizer=tokenizer,
            junior_tokenizer=junior_tokenizer,
        ),
    }
    out = {name: digests(r) for name, r in made.items()}
    if RECORD:
        PINNED.write_text(json.dumps({"recorded_on": machine(), "cases": out}, indent=2) + "\n")
    return out


@pytest.fixture(scope="module")
def pinned(runs) -> dict:
    return json.loads(PINNED.read_text())


def test_every_case_is_pinned(runs, pinned) -> None:
    assert sorted(pinned["cases"]) == sorted(CASES) == sorted(runs)


@pytest.mark.parametrize("case", CASES)
def test_the_same_tokens_authors_and_lengths(case, runs, pinned) -> None:
    assert runs[case]["discrete"] == pinned["cases"][case]["discrete"], (
        f"{case}: the rollouts' tokens, authors, lengths or stops changed for the same seed"
    )


@pytest.mark.parametrize("case", CASES)
def test_the_same_logprobs_bit_for_bit(case, runs, pinned) -> None:
    if pinned["recorded_on"] != machine():
        pytest.skip(f"log-probs recorded on {pinned['recorded_on']}, this is {machine()}")
    assert runs[case]["floats"] == pinned["cases"][case]["floats"], (
        f"{case}: a recorded log-prob changed in its last bits for the same seed"
    )
