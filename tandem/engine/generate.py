"""``generate``: the engine's entry point, from prompts to ``Rollouts``.

A pair that shares one vocabulary (or the senior alone) writes through the same-vocabulary loop
(``tandem.engine.loop``); a junior with a tokenizer of its own writes through the
cross-vocabulary engine (``tandem.engine.cross``), to which ``generate`` hands such a pair. Both
build their rollouts' layout with ``tandem.engine.layout``.

Memory: a call whose KV caches would exceed ``params.kv_cache_gib`` (``tandem.engine.budget``)
runs in passes over consecutive whole prompt groups, joined into one ``Rollouts``. A pass draws
the whole call's random numbers at every step and keeps its own rows' (a few uniforms per row:
nothing next to a forward), and its models read each prompt as one pass over every prompt would
(the same width, in the same prefill group or a part of it). Rows never interact, so the passes
give the rollouts of one pass: the same tokens, authors, lengths and stops, and log-probs equal
within the last bits (the matrix kernels see other batch sizes, which on most CPUs and GPUs
rounds a row's sums differently, as the batch's compaction already does within one pass).

Lockstep: a senior sharded layer by layer (FSDP2 gathering each decoder layer for its forward)
makes collectives at every forward, so every process must make as many. With ``lockstep``, each
process says at every step whether it still writes; one whose rows have all finished keeps
stepping the senior with one dropped token (``Reader.idle``) until every process has finished,
and the prefill makes as many forwards everywhere (``Reader.prefill``); the processes also agree
on the number of passes, one with no prompts left for a pass stepping along idle. Without it (one
process, or a senior gathered whole for the rollout), a call stops as soon as its own rows have.

What this file leaves out: the step itself (``loop``), a junior with a tokenizer of its own
(``cross``), and scaled-out serving (``vllm_backend``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tandem.engine.base import PAD, Lockstep, Rollouts, SamplingParams
from tandem.engine.budget import prompt_spans, warn_unsplit
from tandem.engine.cross import generate_cross
from tandem.engine.layout import Prompts, decoded, eos_ids, eval_mode, finish, model_configs, pad_id
from tandem.engine.loop import Loop
from tandem.engine.reader import Reader
from tandem.engine.vocabulary import same_vocabulary
from tandem.samplers.base import Sampler
from tandem.samplers.solo import SoloSampler


def generate(
    senior: Any,
    junior: Any | None,
    prompts: Sequence[Sequence[int]] | Sequence[Tensor],
    sampler: Sampler | None = None,
    params: SamplingParams | None = None,
    *,
    tokenizer: Any = None,
    junior_tokenizer: Any = None,
    junior_prompts: Sequence[Sequence[int]] | None = None,
    lockstep: Lockstep | None = None,
) -> Rollouts:
    """Generate ``len(prompts) * params.samples_per_prompt`` rollouts written by two models.

    Args:
        senior: the trainable Hugging Face causal LM.
        junior: the frozen partner (same tokenizer; may sit on another device), or ``None``
            for solo generation (``Rollouts.junior_logprobs`` is then ``None``).
        prompts: prompt token ids, one sequence per prompt, of any lengths.
        sampler: who authors each token; ``None`` is the solo sampler.
        params: sampling parameters; ``None`` is ``SamplingParams()``.
        tokenizer: decodes ``Rollouts.texts`` and supplies the pad id; optional.
        junior_tokenizer: the junior's, when it may differ from ``tokenizer``: a junior of
            another vocabulary writes through ``tandem.engine.cross``, under any sampler.
        junior_prompts: for such a junior, the prompts in its own ids and chat format
            (``PromptBatch.prompt_ids_for``); None re-tokenizes the senior's prompt text.
        lockstep: for a senior whose forward is a collective: every process then makes as
            many senior forwards (``tandem.engine.base.Lockstep``); ``None`` for one process.

    Returns:
        Rollouts on the senior's device, rows prompt-major.
    """
    params = params if params is not None else SamplingParams()
    sampler = sampler if sampler is not None else SoloSampler()
    if junior is None and not sampler.solo:
        raise ValueError(
            f"{sampler!r} hands tokens to the junior, but junior is None. Pass the junior "
            "model, or use the solo sampler for solo generation."
        )
    if junior is not None and not same_vocabulary(tokenizer, junior_tokenizer):
        if lockstep is not None:
            raise ValueError(
                "a junior of another vocabulary cannot write with a senior gathered layer by "
                "layer (trainer.strategy.rollout_gather=per_layer): the cross engine does not "
                "step processes in lockstep. Set trainer.strategy.rollout_gather=whole."
            )
        return _cross(
            senior, junior, prompts, sampler, params, tokenizer, junior_tokenizer, junior_prompts
        )
    eos = eos_ids(params.eos_token_ids, model_configs(senior))
    pad = pad_id(eos, (tokenizer, *model_configs(senior)))
    batch = Prompts.of(prompts, pad)
    models = [senior] if junior is None else [senior, junior]
    b, width = batch.ids.shape
    spans = prompt_spans(models, b, width, params, lockstep)
    with eval_mode(models), torch.inference_mode():
        # only the senior is sharded: the junior's forwards are this process's own
        readers = [Reader(senior, lockstep), *(Reader(m) for m in models[1:])]
        # a pass reads each of its prompts as one pass over all of them would
        groups = [r.prefill_groups(batch.lengths) for r in readers]
        parts = []
        for first, stop in spans:
            if first == stop:
                _idle_pass(readers[0], lockstep)
                continue
            loop = Loop(readers, sampler, params, eos, pad, lockstep, (first, stop, b))
            within = [_within(g, first, stop) for g in groups]
            parts.append(loop.run(batch[first:stop], within))
        out = parts[0] if len(parts) == 1 else _join(parts, pad)
        texts = None if tokenizer is None else decoded(tokenizer, out["tokens"], out["lengths"])
    return finish(Rollouts, **out, pad_token_id=pad, texts=texts)


def _within(groups: list[tuple[Tensor, int]], first: int, stop: int) -> list:
    """The prefill groups of prompts ``first ... stop - 1``, indexed from ``first``."""
    out = []
    for index, width in groups:
        mine = index[(index >= first) & (index < stop)]
        if mine.numel():
            out.append((mine - first, width))
    return out


def _idle_pass(reader: Reader, lockstep: Lockstep | None) -> None:
    """A pass in which this process has no prompts left while another has: its senior makes as
    many prefill forwards as the most any process makes, then one a step while any writes."""
    assert lockstep is not None, "only processes in lockstep make empty passes"
    for _ in range(lockstep(0)):
        reader.idle()
    while lockstep(0):
        reader.idle()


def _join(parts: list[dict[str, Any]], pad: int) -> dict[str, Any]:
    """The fields of consecutive passes over a call's rows as one pass's, each ``[n, t]`` one
    padded to the widest pass's ``t`` (as ``Rollouts`` pads a row past its length)."""
    width = max(p["tokens"].shape[1] for p in parts)
    fill = {"tokens": pad, "authors": PAD}
    out: dict[str, Any] = {}
    for name, value in parts[0].items():
        if value is None:
            out[name] = None
        elif value.dim() == 2 and name != "prompt_tokens":  # [n, t]
            right = fill.get(name, 0.0)
            out[name] = torch.cat([_pad_to(p[name], width, right) for p in parts])
        else:  # [n] and the prompts, all passes at the call's prompt width
            out[name] = torch.cat([p[name] for p in parts])
    return out


def _pad_to(x: Tensor, width: int, fill: float) -> Tensor:
    """``x [n, t]`` padded on the right with ``fill`` to ``[n, width]``."""
    return F.pad(x, (0, width - x.shape[1]), value=fill)


def _cross(
    senior, junior, prompts, sampler, params, tokenizer, junior_tokenizer, junior_prompts
) -> Rollouts:
    """A junior of another vocabulary: the schedule on text (``tandem.engine.cross``).

    It generates every row in one pass, whatever ``params.kv_cache_gib`` says: its readers'
    caches grow with what each model reads, and a pass split in two would have to split its
    random streams and its two token sequences too. Over the budget, it warns."""
    if tokenizer is None:
        raise ValueError(
            "the junior's tokenizer differs from the senior's, so the pair writes through "
            "tandem.engine.cross, which reads the text between them with both tokenizers; got "
            "no senior tokenizer. Pass tokenizer=<the senior's>, or a junior with the senior's "
            "tokenizer."
        )
    b, width = Prompts.of(prompts, 0).ids.shape
    warn_unsplit([senior, junior], b, width, params)
    return generate_cross(
        senior,
        junior,
        prompts,
        sampler,
        params,
        tokenizer=tokenizer,
        junior_tokenizer=junior_tokenizer,
        junior_prompts=junior_prompts,
    )
