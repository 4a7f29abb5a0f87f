"""What a forward, a backward and a rollout hold beside the weights, as formulas of the shapes.

Each formula names the tensors it counts; ``benchmarks/plan_memory.py`` measures them on the
CPU (the resident high-water mark of real training steps, phase by phase) and the figures here
are within 20% of it at every size it runs. Widths: ``h`` hidden, ``q`` heads x head_dim, ``kv``
kv_heads x head_dim, ``i`` intermediate, ``V`` vocabulary, ``b`` the compute dtype's bytes.

- a decoder layer's saved tensors, per token (``layer_bytes_per_token``): counted from what
  autograd saves (``torch.autograd.graph.saved_tensors_hooks``, exact to the byte in float32,
  bfloat16 and bf16 autocast; ``tests/test_plan.py``). With a pack's rows laid out side by side
  for sdpa (``ModelShape.rows_attention``): ``(4 + 4b) q + (4 + 3b) kv`` for the attention's
  inputs and output; without it, ``(4 + 5b) q + (4 + b) kv`` and the ``[T, T]`` mask's float
  bias, ``T x b``, in every layer;
- a backward holds, besides every layer's saved tensors, the largest of: one LM-head chunk
  recomputed with its gradient (float32 logits, their tempered copy, logsumexp's exponentials
  and the logits' gradient: 16 bytes a position and vocabulary entry in float32, measured), and
  across chunks the LM head's weight gradient waiting for the rest (one ``[V, h]``); the
  gradients of that weight met at the end (the waiting one, the new one and their sum: three
  ``[V, h]``, measured); a layer's gradients in flight (two ``[T, i]``, measured);
- a forward without gradients holds the larger of one layer's working set and the LM head's
  chunk (the layers' tensors are gone by the time the head runs);
- a rollout holds both models' KV caches for its rows (``kv_rows_bytes``) and the worst of a
  prefill beside the caches reserved before it, a prompt's own keys while they are repeated
  into its rows, and one decode step (``rollout_forward``). A decode step holds each model's
  float32 logits of this step and of the last (the list of the new ones is built before the
  old one is dropped), or, while a token is drawn, this step's logits and the draw's tempered
  copy and weights (one model at a time).

Not counted: allocator fragmentation, and a pack's padding where its rows are laid out: each
row is laid out as wide as the pack's longest, so a pack of one long row and many short ones
(responses that stopped early beside one that ran to the end) lays out rows x longest slots
for attention's queries, keys, values and output, which can be several times its tokens. The
plan's rows are all at their longest, where there is none.

What this file leaves out: the phases and the resident terms (``tandem.plan.memory``).
"""

from __future__ import annotations

import math

from tandem.plan.settings import Settings
from tandem.plan.shape import ModelShape

# padded prompt tokens per prefill chunk (tandem.engine.reader)
PREFILL_TOKENS = {"cpu": 1024, "gpu": 32768}
# bytes per row x vocabulary of a decode step, measured on the CPU at 8 and 32 rows of Qwen3's
# 151,936-wide vocabulary: each model's float32 logits of this step and of the last ...
STEP_LOGITS_BYTES = 8
# ... or, while a token is drawn, this step's logits (4 a model) and the draw's tempered logits
# and weights (one model at a time)
DRAW_BYTES = 8
# the temperature-1 draw's weights buffer, per model, kept for the whole rollout
FAST_BUFFER_BYTES = 4
# share of a device's free memory the engine's KV caches may take when kv_cache_gib is null
# (tandem.engine.budget.FREE_SHARE)
KV_FREE_SHARE = 0.9
# bytes per position x vocabulary of one LM-head chunk beyond its compute-dtype logits: without
# gradients, the float32 copy (when the logits are narrower) aside, the tempered copy and
# logsumexp's exponentials (measured: 12 in all in float32); with them, also the logits'
# gradient (16 in all in float32, measured)
LOGIT_BYTES_NO_GRAD = 8
LOGIT_BYTES_GRAD = 12


def layer_bytes_per_token(m: ModelShape, cb: int, autocast: bool, rows: bool | None = None) -> int:
    """What autograd saves of one decoder layer per token (a mask's bias aside).

    Args:
        m: the model.
        cb: the compute dtype's bytes.
        autocast: float32 weights under autocast: the residual stream and the norms stay
            float32 and every projection saves its own cast input.
        rows: the pack's rows laid out for attention (None: as ``m.rows_attention``).
    """
    rows = m.rows_attention if rows is None else rows
    h_coeff = 16 + 5 * cb if autocast else 8 + 4 * cb
    if rows:
        # the projection (and its float32 cast for the norm), the normalised and the laid-out
        # queries, sdpa's laid-out output and the gathered one; keys and values: the same
        # less the output
        q_coeff, kv_coeff = 4 + 4 * cb, 4 + 3 * cb
    else:
        q_coeff, kv_coeff = 4 + 5 * cb, 4 + cb
    return (
        h_coeff * m.hidden
        + q_coeff * m.q
        + kv_coeff * m.kv
        + 4 * cb * m.intermediate
        + 8
        + 8 * m.heads
        + 4 * m.kv_heads
    )


def slot_bytes(m: ModelShape, cb: int) -> int:
    """Of ``layer_bytes_per_token``, what is saved per slot of the rows laid out for attention
    (the laid-out queries, keys and values, sdpa's output and its float32 log-sum-exp), not per
    token read: a prompt read once for several rows is laid out in each (measured,
    ``tests/test_plan.py``)."""
    return cb * (2 * m.q + 2 * m.kv) + 4 * m.heads if m.rows_attention else 0


def activation_bytes(s: Settings) -> tuple[int, int]:
    """``(saved activations, attention mask)`` of the largest micro-batch's forward: its rows'
    ``micro_tokens`` laid out for attention, ``read_positions`` of them read by the layers."""
    m, slots, cb = s.senior, s.micro_tokens, s.compute_bytes
    t = s.read_positions
    resid = residual_bytes(s)
    per_slot = slot_bytes(m, cb)
    layer = t * (layer_bytes_per_token(m, cb, s.autocast) - per_slot) + slots * per_slot
    # after the layers: the final norm's saved input and output, the positions picked for the
    # LM head, and the rotary tables
    rest = t * ((4 + resid) * m.hidden + resid * m.hidden + 2 * m.head_dim * resid + 24)
    if s.activation_checkpointing:
        # each layer's input kept, and one layer recomputed in backward
        acts, biases = t * m.hidden * resid * m.layers + layer, 1
    else:
        acts, biases = m.layers * layer, m.layers
    mask = 0 if m.rows_attention else slots * slots * (1 + biases * cb)
    return acts + rest, mask


def backward_bytes(s: Settings) -> int:
    """What a backward holds beyond the saved activations and the gradients (see the module)."""
    m, t, cb, chunk = s.senior, s.read_positions, s.compute_bytes, s.logprob_chunk_tokens
    head = logits_bytes(m, chunk, s.head_positions, cb, grad=True)
    # under FSDP2 the unsharded root gradients are counted with the gathered senior
    weight = 0 if s.strategy == "fsdp2" else m.vocab * m.hidden * s.weight_bytes
    if s.head_positions > chunk:  # the head's weight gradient waits across its chunks
        head += weight
    return max(head, 3 * weight, 2 * t * m.intermediate * cb)


def residual_bytes(s: Settings) -> int:
    """The senior's residual stream: float32 under autocast over float32 weights."""
    return s.weight_bytes if s.autocast else s.compute_bytes


def junior_compute_bytes(s: Settings) -> int:
    return s.compute_bytes if s.autocast else s.junior_bytes


def logits_bytes(m: ModelShape, chunk: int, tokens: int, cb: int, grad: bool) -> int:
    """One LM-head chunk: its compute-dtype logits and what is made of them."""
    per = cb + (LOGIT_BYTES_GRAD if grad else LOGIT_BYTES_NO_GRAD) + (4 if cb != 4 else 0)
    return min(chunk, tokens) * m.vocab * per


def layer_working_set(
    m: ModelShape,
    tokens: int,
    cb: int,
    resid: int,
    mask: int | None = None,
    slots: int | None = None,
) -> int:
    """The largest working set of a layer's forward without gradients: the residual stream and
    the layer's widest intermediates (the MLP's gate, up and product over the ``tokens`` read;
    or attention's queries, keys and values as laid out in ``slots``, default ``tokens``, and
    its output), and the mask with a float bias of it."""
    h = m.hidden
    slots = tokens if slots is None else slots
    widest = max(3 * m.intermediate * cb * tokens, 4 * m.q * cb * slots)
    mask = tokens * tokens if mask is None else mask
    return tokens * (2 * resid * h + 4 * h) + widest + mask * (1 + cb)


def no_grad_forward(
    m: ModelShape,
    tokens: int,
    positions: int,
    chunk: int,
    cb: int,
    resid: int,
    read: int | None = None,
) -> int:
    """A log-prob pass without gradients over a pack of rows of ``tokens``, ``read`` of them
    read by the layers (default all), ``positions`` through the LM head (the old or reference
    log-probs): the larger of a layer's working set and the LM head's chunk beside the last
    hidden states."""
    read = tokens if read is None else read
    mask = 0 if m.rows_attention else None
    head = read * m.hidden * resid + logits_bytes(m, chunk, positions, cb, grad=False)
    return max(layer_working_set(m, read, cb, resid, mask, slots=tokens), head)


def kv_per_token(s: Settings) -> tuple[int, int]:
    """KV-cache bytes per position of the senior and the junior (0: it does not read)."""
    autocast_dtype = s.compute_dtype
    if s.autocast:
        # the k_norm's float32 weight promotes the keys to float32; the values stay autocast's
        weights = "float32" if s.weight_bytes == 4 else autocast_dtype
        senior = (s.senior.kv_bytes[weights] + s.senior.kv_bytes[autocast_dtype]) // 2
        junior = (s.junior.kv_bytes[s.model_dtype] + s.junior.kv_bytes[autocast_dtype]) // 2
    else:
        senior = s.senior.kv_bytes[s.compute_dtype]
        junior = s.junior.kv_bytes[s.model_dtype]
    return senior, junior if s.junior_reads else 0


def kv_rows_bytes(s: Settings, per_token: int, prompts: int) -> int:
    """The rows' caches of a pass of ``prompts`` prompt groups: every row reserves the prompt
    and every response position."""
    return per_token * prompts * s.group_size * s.row_tokens


def kv_prompt_bytes(s: Settings, per_token: int, prompts: int) -> int:
    """The prompts' own caches, one row a prompt, read before they are repeated into rows."""
    return per_token * prompts * s.prompt_tokens


def kv_pass_bytes(s: Settings, per_token: int, prompts: int) -> int:
    """What the engine's budget counts of a pass (``tandem.engine.cache.kv_chunk_bytes``): the
    rows' caches, and each prompt's own keys once more while they are repeated into them."""
    return kv_rows_bytes(s, per_token, prompts) + kv_prompt_bytes(s, per_token, prompts)


def kv_group_bytes(s: Settings, shared: bool) -> dict[str, int]:
    """One prompt group's KV caches on the senior's device (``shared``: the junior's too) and,
    apart, on the junior's."""
    senior, junior = kv_per_token(s)
    if shared:
        return {"senior": kv_pass_bytes(s, senior + junior, 1)}
    return {"senior": kv_pass_bytes(s, senior, 1), "junior": kv_pass_bytes(s, junior, 1)}


def kv_prompts(s: Settings, shared: bool, free: dict[str, int] | None = None) -> int:
    """Prompt groups the engine generates at once (``tandem.engine.budget``): all of this
    process's, or as many as ``generation.kv_cache_gib`` holds on each device, or (null) 90%
    of each device's free memory when the rollout starts (``free``, by ``senior`` and
    ``junior``); at least one."""
    need = kv_group_bytes(s, shared)
    if s.kv_cache_gib is not None:
        budgets = {k: int(s.kv_cache_gib * 2**30) for k in need}
    elif free is not None:
        budgets = {k: int(KV_FREE_SHARE * max(0, free.get(k, free["senior"]))) for k in need}
    else:
        return s.prompts_per_rank
    fit = max(1, min(budgets[k] // max(1, v) for k, v in need.items()))
    # the passes' sizes differ by at most one prompt
    prompts = s.prompts_per_rank
    return math.ceil(prompts / math.ceil(prompts / fit))


def rollout_forward(s: Settings, prompts: int, shared: bool) -> dict[str, int]:
    """What a pass holds beyond its rows' KV caches at its worst moment, on the senior's
    device (``shared``: the junior's too) and, apart, on the junior's.

    The senior reads the prompts first into caches of the prompts alone, which are then
    repeated into its rows' caches; the junior does the same after it; then every step
    decodes. So beside the rows' caches of both (``kv_rows_bytes``), the worst of: a prefill
    (its forward and its prompts' caches) with the caches reserved so far, a model's prompt
    caches while they are repeated, and one decode step.
    """
    rows = min(s.rows_per_rank, prompts * s.group_size)
    p = s.prompt_tokens
    chunk = max(1, min(prompts, PREFILL_TOKENS[s.accelerator] // p))
    senior_bpt, junior_bpt = kv_per_token(s)

    def read(m: ModelShape, cb: int, resid: int, per_token: int) -> tuple[int, int, int]:
        """(the prefill's forward, the prompts' caches, the rows' caches) of one model."""
        forward = layer_working_set(m, chunk * p, cb, resid, mask=chunk * p * p)
        return forward, kv_prompt_bytes(s, per_token, prompts), kv_rows_bytes(s, per_token, prompts)

    fs, ps, rs = read(s.senior, s.compute_bytes, residual_bytes(s), senior_bpt)
    fj, pj, rj = 0, 0, 0
    if s.junior_reads:
        fj, pj, rj = read(s.junior, junior_compute_bytes(s), s.junior_bytes, junior_bpt)
    models = 2 if s.junior_reads else 1
    fast = FAST_BUFFER_BYTES if s.fast_draw else 0
    vocab = rows * s.senior.vocab
    if shared:
        step = max(STEP_LOGITS_BYTES * models, 4 * models + DRAW_BYTES) + fast * models
        # the senior's prefill and repeat come before the junior's rows are reserved
        reading = max(fs + ps - rs - rj, ps - rj, fj + pj - rj, pj)
        return {"senior": max(0, reading, vocab * step), "junior": 0}
    step = max(STEP_LOGITS_BYTES, 4 + DRAW_BYTES) + fast
    senior = max(0, fs + ps - rs, ps, vocab * step)
    junior = max(0, fj + pj - rj, pj, vocab * step) if s.junior_reads else 0
    return {"senior": senior, "junior": junior}


def step_temp(s: Settings, offloaded: bool) -> int:
    """AdamW's step: on a GPU, a foreach step holds a float32 temporary of every parameter (the
    square root of exp_avg_sq); on the CPU the step goes a tensor at a time, and the largest
    tensor's square root and its quotient by the bias correction are both held (measured)."""
    if offloaded:
        return 0
    m = s.senior
    if s.accelerator == "gpu":
        return math.ceil(m.params / s.shards) * s.weight_bytes
    largest = max(m.vocab * m.hidden, m.intermediate * m.hidden, m.q * m.hidden)
    return 2 * largest * s.weight_bytes
