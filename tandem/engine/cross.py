"""Co-generation across vocabularies: a senior and a junior with tokenizers of their own.

The shared response is text. Each model keeps its own token sequence of it and reads it through
its own KV cache. The handoff sampler decides who writes, exactly as in the one-vocabulary loop:
the same ``start`` and ``step`` calls, the senior's tokens stepped by the sampler itself and the
junior's by ``sampler.with_tables(the junior's tables)``, the same rule over the junior's own
boundary tables. So every schedule (word under either rule and boundary, with its
``max_gap_tokens``; sentence; step; token; solo) runs across vocabularies. At a change of pen the
state's token ids (``Sampler.token_state``: the last token) are given in the new author's
vocabulary: its own last token of the same text. Where the sampler retracts a proposal (the word
sampler's ``onset`` rule), the new author, once it has read the other's words, draws that
position from ``sampler.allowed`` over its own vocabulary, as the one-vocabulary loop redraws.

What the rollout holds (``CrossRollouts``): ``tokens``/``authors`` are the senior's sequence,
the loss's: its own tokens with the log-probs it sampled them with, and the junior's words in
senior tokens, marked JUNIOR, with the senior's teacher-forced log-probs of them (taken as it
reads them, at no extra cost). ``junior`` holds the junior's own sequence likewise, with
its log-probs (the legibility metrics' per-byte figures). ``junior_logprobs`` and
``ref_logprobs`` are ``None``: no per-token junior figure exists on the senior's tokens.

How the models take turns, read each other's words and stop: ``tandem.engine.cross_loop``.

What this file leaves out: the loop itself (``tandem.engine.cross_loop``), the one-vocabulary
loop (``tandem.engine.loop``), the passes under a KV budget (one pass here;
``tandem.engine.generate`` warns over budget) and lockstep (refused by ``generate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tandem.engine.base import JUNIOR, PAD, SENIOR, Rollouts, SamplingParams
from tandem.engine.block import BlockReader
from tandem.engine.cross_loop import CrossLoop, Partner
from tandem.engine.layout import (
    Prompts,
    decoded,
    eos_ids,
    eval_mode,
    finish,
    model_configs,
    pad_id,
)
from tandem.engine.packed import PackedReader, packable
from tandem.engine.vocabulary import (
    PROBE_TEXTS,
    padded_to,
    same_vocabulary,
    split_problem,
    vocabulary,
)
from tandem.samplers.base import Sampler

__all__ = [
    "PROBE_TEXTS",
    "CrossRollouts",
    "Sequences",
    "generate_cross",
    "same_vocabulary",
    "split_problem",
]


@dataclass(frozen=True)
class Sequences:
    """One model's own token sequences of the shared responses, ``[N, T']`` aligned.

    Attributes:
        tokens: its token ids (its pad id past each row's length).
        authors: who wrote the text each token spells: SENIOR, JUNIOR, or PAD past the end.
        logprobs: the model's raw log-prob of each token (drawn, or teacher-forced on the
            other author's words).
        lengths: tokens per row.
        prompt_tokens: its prompts, left-padded.
        prompt_lengths: each row's prompt length.
        texts: each response decoded with its tokenizer (special tokens skipped).
        byte_lengths: ``[N, T']`` bytes each token spells (0 for special tokens and padding).
    """

    tokens: Tensor  # [N, T'] long
    authors: Tensor  # [N, T'] long
    logprobs: Tensor  # [N, T'] float32
    lengths: Tensor  # [N] long
    prompt_tokens: Tensor  # [N, P'] long
    prompt_lengths: Tensor  # [N] long
    texts: list[str]
    byte_lengths: Tensor  # [N, T'] long


@dataclass(frozen=True)
class CrossRollouts(Rollouts):
    """``Rollouts`` of a cross-vocabulary pair: the senior's sequence, plus ``junior``'s own."""

    junior: Sequences | None = None


def generate_cross(
    senior: Any,
    junior: Any,
    prompts: Sequence[Sequence[int]] | Sequence[Tensor],
    sampler: Sampler,
    params: SamplingParams,
    *,
    tokenizer: Any,
    junior_tokenizer: Any,
    junior_prompts: Sequence[Sequence[int]] | None = None,
) -> CrossRollouts:
    """Rollouts written by a senior and a junior of different vocabularies (see the module).

    Args:
        senior, junior: Hugging Face causal LMs.
        prompts: the prompts in the senior's token ids.
        sampler: the handoff schedule, built with the senior's tokenizer.
        params: sampling parameters (their EOS ids, if given, are the senior's; ``()`` turns
            off EOS for both models).
        tokenizer, junior_tokenizer: each model's tokenizer.
        junior_prompts: the same prompts in the junior's ids; ``None`` re-tokenizes the
            senior's prompt text (right when both use the same chat format, as the tiny world's
            pair does; give the junior's own chat template's prompts otherwise).
    """
    if junior_prompts is None:
        texts = tokenizer.batch_decode([list(map(int, x)) for x in prompts])
        junior_prompts = junior_tokenizer(texts, add_special_tokens=False)["input_ids"]
    eos_s = eos_ids(params.eos_token_ids, model_configs(senior))
    # the junior's own EOS ids, unless the caller turned EOS off for the row (``()``)
    eos_j = () if params.eos_token_ids == () else eos_ids(None, model_configs(junior))
    g = params.samples_per_prompt
    with eval_mode([senior, junior]), torch.inference_mode():
        s = _model(senior, tokenizer, sampler, SENIOR, eos_s, prompts, g, None)
        home = s.reader.device  # where the rows' bookkeeping and the schedules live
        j = _model(junior, junior_tokenizer, sampler, JUNIOR, eos_j, junior_prompts, g, home)
        loop = CrossLoop(s, j, params)
        loop.run()
        fields, juniors = _fields(loop)
    return finish(CrossRollouts, **fields, junior=finish(Sequences, **juniors))


def _model(
    model: Any,
    tokenizer: Any,
    sampler: Sampler,
    code: int,
    eos: tuple[int, ...],
    prompts: Sequence[Sequence[int]] | Sequence[Tensor],
    g: int,
    home: torch.device | None,
) -> Partner:
    reader = PackedReader(model) if packable(model) else BlockReader(model)
    home = reader.device if home is None else home
    vocab = vocabulary(tokenizer)
    pad = pad_id(eos, (tokenizer, *model_configs(model)))
    batch = Prompts.of(prompts, pad)
    own = sampler if code == SENIOR else sampler.with_tables(vocab.tables)
    # ids past the tokenizer (padding rows of the logits) spell nothing and begin no word
    width = model.get_output_embeddings().weight.shape[0]
    own.bind(width, home)
    return Partner(
        reader,
        vocab,
        own,
        code,
        torch.tensor(eos, dtype=torch.long, device=home),
        pad,
        batch,
        padded_to(vocab.tables.leading_space, width).to(home),
        padded_to(vocab.nbytes, width).to(home),
        batch.ids[:, -1].repeat_interleave(g).to(home),
    )


def _fields(loop: CrossLoop) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``CrossRollouts`` and its junior ``Sequences`` are made of: views of the loop's
    buffers, each trimmed to its longest row."""
    senior, junior = loop.models[SENIOR], loop.models[JUNIOR]
    g, home = loop.params.samples_per_prompt, loop.home
    s, lengths = _trimmed(loop, SENIOR), loop.length[SENIOR]
    tempered = loop.params.logprob_temperature is not None
    rollouts = {
        "tokens": s["tokens"],
        "authors": s["authors"],
        "senior_logprobs": s["logprobs"],
        "junior_logprobs": None,
        "lengths": lengths,
        "stop_reasons": loop.stop_reasons,
        **senior.prompts.rows(g, home),
        "pad_token_id": senior.pad,
        "texts": decoded(senior.tokenizer, s["tokens"], lengths),
        "old_logprobs": s["old"] if tempered else None,
        "ref_logprobs": None,
    }
    j, own = _trimmed(loop, JUNIOR), junior.prompts.rows(g, home)
    juniors = {
        "tokens": j["tokens"],
        "authors": j["authors"],
        "logprobs": j["logprobs"],
        "lengths": loop.length[JUNIOR],
        "prompt_tokens": own["prompt_tokens"],
        "prompt_lengths": own["prompt_lengths"],
        "texts": decoded(junior.tokenizer, j["tokens"], loop.length[JUNIOR]),
        "byte_lengths": junior.nbytes[j["tokens"]] * (j["authors"] != PAD),
    }
    return rollouts, juniors


def _trimmed(loop: CrossLoop, code: int) -> dict[str, Tensor]:
    """Model ``code``'s buffers up to its longest row (at least one column)."""
    t = max(1, int(loop.length[code].max()))
    return {k: v[:, :t] for k, v in loop.out[code].items()}
