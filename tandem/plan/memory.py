"""The bytes every device holds in each phase of a training step, as formulas of the settings.

Phases (what is alive at the worst moment of each):

- ``rollout``: weights and optimizer state (gradients are freed after every optimizer step),
  the senior as the engine reads it (gathered whole or by layer under FSDP2), the junior, both
  models' KV caches (reserved for every position at the prefill) and the largest forward of
  the rollout (a prefill chunk, or one decode step's logits and sampling);
- ``old_logprobs`` / ``ref_logprobs``: one no-grad forward of the largest micro-batch through
  the senior (the old log-probs) or the junior (a KL term's reference), where the trainer
  recomputes them;
- ``update``: weights, optimizer state, gradients, one micro-batch's saved activations, its
  attention mask and one LM-head chunk of logits;
- ``step``: AdamW's step, whose foreach kernels hold a float32 temporary of every parameter.

The activation coefficients are those of a Qwen3 decoder layer (sdpa on packed rows, so a
block-diagonal mask), counted from the tensors autograd saves, and were checked against
``torch.autograd.graph.saved_tensors_hooks`` on a small Qwen3 on CPU in float32, bfloat16 and
bf16 autocast (exact to the byte). Widths: ``h`` hidden, ``q`` heads x head_dim, ``kv``
kv_heads x head_dim, ``i`` intermediate, ``b`` the compute dtype's bytes. Per token per layer:

- weights in the compute dtype (bf16 weights, FSDP2's ``param_dtype``, or float32):
  ``(8 + 4b) h + (4 + 5b) q + (4 + b) kv + 4b i + 8 + 8 heads + 4 kv_heads``;
- float32 weights under autocast (``bf16-mixed`` on one device): the residual stream and the
  norms stay float32 and every projection saves its own cast input: ``(16 + 5b) h`` instead;
  the weights' casts are the autocast cache (``compute_copy``, counted once per weight);
- the mask: sdpa turns the ``[T, T]`` bool mask into a float bias that every layer saves:
  ``T x b`` per token per layer, besides the ``T^2`` bytes of the bool mask itself.

Not counted: vLLM's own memory (``module.backend.name=vllm``), validation rollouts (fewer rows
than training ones), the allocator's fragmentation (``MARGIN`` of each device is kept for it).

What this file leaves out: reading the config (``tandem.plan.settings``), fixes and reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.plan.settings import Settings
from tandem.plan.shape import ModelShape

GiB = 2**30
# kept free on every device: the caching allocator's fragmentation, and what no formula sees
MARGIN = 0.05
# a CUDA context, cuBLAS workspaces and NCCL buffers: per process, on every device it uses
RUNTIME_BYTES = GiB
# padded prompt tokens per prefill chunk (tandem.engine.reader)
PREFILL_TOKENS = {"cpu": 1024, "gpu": 32768}
# bytes per row x vocabulary of one decode step: the logits in the compute dtype and in
# float32, divided by the temperature, the probabilities and the recorded log-probs
SAMPLING_BYTES = 20
# bytes per token x vocabulary of one LM-head chunk beyond its compute-dtype logits: the float32
# copy (when the logits are lower), the tempered copy, and logsumexp's exponentials; with
# gradients, also its gradient (4 more)
LOGIT_BYTES_NO_GRAD = 8
LOGIT_BYTES_GRAD = 12

PHASES = ("rollout", "old_logprobs", "ref_logprobs", "update", "step")


@dataclass(frozen=True)
class DevicePlan:
    """One device's bytes: ``phases[phase][term]``, each phase's terms alive at once."""

    name: str
    capacity: int
    phases: dict[str, dict[str, int]]

    def total(self, phase: str) -> int:
        return sum(self.phases.get(phase, {}).values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)

    @property
    def peak(self) -> int:
        return self.total(self.peak_phase) if self.phases else 0

    @property
    def usable(self) -> int:
        return int(self.capacity * (1 - MARGIN))

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable


@dataclass(frozen=True)
class Fix:
    """Overrides that change the plan, and the peak (bytes, of the fullest device) they give."""

    overrides: tuple[str, ...]
    peak: int
    fits: bool
    note: str = ""


@dataclass(frozen=True)
class Plan:
    """The memory plan of a run: every device's phases and terms, the problems of its layout,
    and, where it does not fit, the overrides that would make it fit."""

    settings: Settings
    devices: tuple[DevicePlan, ...]
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    fixes: tuple[Fix, ...] = ()
    together: Fix | None = None

    @property
    def peak(self) -> int:
        """The fullest device's peak, in bytes."""
        return max(d.peak for d in self.devices)

    @property
    def fits(self) -> bool:
        return not self.problems and all(d.fits for d in self.devices)

    def phase_bytes(self, device: int = 0) -> dict[str, int]:
        """Each phase's predicted bytes on one device: what a measurement compares against."""
        d = self.devices[device]
        return {phase: d.total(phase) for phase in d.phases}


def plan_memory(s: Settings, devices: Sequence[tuple[str, int]]) -> Plan:
    """Every device's bytes under ``s``.

    Args:
        s: the run's settings.
        devices: ``(name, bytes)`` of each device of one machine: the GPUs in order, or the
            host (``cpu``) for a CPU run.
    """
    problems, notes = [], []
    gpu = s.accelerator == "gpu"
    ranks = s.local_ranks
    if gpu and ranks > len(devices):
        problems.append(
            f"the trainer starts {ranks} processes on each machine, one per GPU, but "
            f"{len(devices)} device(s) were given. Give as many devices, or set trainer.devices."
        )
    totals: list[dict[str, dict[str, int]]] = [{} for _ in devices]
    per_rank = rank_terms(s)
    for rank in range(ranks):
        home = min(rank, len(devices) - 1) if gpu else 0
        away = _junior_index(s, home, len(devices), problems, notes)
        for phase, terms in per_rank.items():
            for (where, term), value in terms.items():
                index = away if where == "junior" else home
                if index is None:
                    continue
                bucket = totals[index].setdefault(phase, {})
                bucket[term] = bucket.get(term, 0) + value
        if gpu:
            for index in {home, away} - {None}:
                for phase in per_rank:
                    bucket = totals[index].setdefault(phase, {})
                    bucket["runtime"] = bucket.get("runtime", 0) + RUNTIME_BYTES
    if s.backend != "torch":
        notes.append(
            f"module.backend.name={s.backend}: its engine's own memory is not planned here; the "
            "torch engine's rollout is counted in its place."
        )
    if _offloaded(s):
        host = math.ceil(s.senior.params / s.shards) * s.weight_bytes * (2 + s.optimizer_states)
        notes.append(f"cpu_offload: {host / GiB:.1f} GiB of shards per process in host memory.")
    plans = tuple(
        DevicePlan(
            name, capacity, {p: {k: v for k, v in t.items() if v} for p, t in phases.items()}
        )
        for (name, capacity), phases in zip(devices, totals, strict=True)
    )
    return Plan(s, plans, tuple(dict.fromkeys(problems)), tuple(dict.fromkeys(notes)))


def _junior_index(
    s: Settings, home: int, count: int, problems: list[str], notes: list[str]
) -> int | None:
    """The device of the junior of the process on device ``home`` (None: host memory, not
    planned); a device not among those given is named, and the junior planned at ``home``."""
    where = s.junior_device
    if s.accelerator != "gpu" or where in (None, "cuda", "gpu"):
        return home
    if str(where) == "cpu":
        notes.append("model.junior_device=cpu: the junior is in host memory, not planned here.")
        return None
    index = int(str(where).rsplit(":", 1)[-1]) if ":" in str(where) else home
    if index >= count:
        problems.append(
            f"model.junior_device ({where}) is not among the {count} device(s) given: the "
            "junior is planned on the senior's device. Give the device, or set "
            "model.junior_device=null."
        )
        return home
    if s.local_ranks > 1:
        notes.append(
            f"model.junior_device={where}: every one of the {s.local_ranks} processes puts its "
            f"junior there."
        )
    return index


def rank_terms(s: Settings) -> dict[str, dict[tuple[str, str], int]]:
    """One process's bytes by phase, each term keyed ``(senior|junior, term)``: on the device of
    the senior, or of the junior."""
    t, chunk = s.micro_tokens, s.logprob_chunk_tokens
    # alive in every phase: the master weights, the optimizer state and the junior
    held = {**_resident(s), ("junior", "junior_weights"): s.junior.params * s.junior_bytes}
    phases = {"rollout": {**held, **_rollout(s)}}
    if s.old_pass:
        cb, sen = s.compute_bytes, s.senior
        forward = no_grad_forward(sen, t, cb, _residual_bytes(s))
        forward += _logits(sen, chunk, t, cb, grad=False)
        phases["old_logprobs"] = {
            **held,
            **_compute(s, "old_logprobs"),
            ("senior", "forward_senior"): forward,
        }
    if s.junior_reference:
        cb, jun = _junior_compute_bytes(s), s.junior
        forward = no_grad_forward(jun, t, cb, s.junior_bytes)
        forward += _logits(jun, chunk, t, cb, grad=False)
        phases["ref_logprobs"] = {
            **held,
            **_compute(s, "old_logprobs"),
            ("junior", "forward_junior"): forward,
        }
    phases["update"] = {**held, **_gradients(s), **_compute(s, "update"), **_update(s)}
    phases["step"] = {
        **held,
        **_gradients(s),
        **_compute(s, "step"),
        ("senior", "step_temp"): _step_temp(s),
    }
    return phases


def _offloaded(s: Settings) -> bool:
    return s.cpu_offload and s.strategy == "fsdp2" and s.accelerator == "gpu"


def _resident(s: Settings) -> dict[tuple[str, str], int]:
    """The senior's float32 master weights and optimizer state: always there."""
    if _offloaded(s):
        return {}
    shard = math.ceil(s.senior.params / s.shards) * s.weight_bytes
    return {
        ("senior", "senior_weights"): shard,
        ("senior", "optimizer_state"): shard * s.optimizer_states,
    }


def _gradients(s: Settings) -> dict[tuple[str, str], int]:
    grads = 0 if _offloaded(s) else math.ceil(s.senior.params / s.shards) * s.weight_bytes
    # DDP reduces through buckets that copy every gradient (gradient_as_bucket_view is off)
    buckets = s.senior.params * s.weight_bytes if s.strategy == "ddp" else 0
    return {("senior", "gradients"): grads, ("senior", "ddp_buckets"): buckets}


def _compute(s: Settings, phase: str) -> dict[tuple[str, str], int]:
    """The senior's weights as its computation reads them, beside the master weights."""
    sen, cb = s.senior, s.compute_bytes
    if s.strategy == "fsdp2":
        # the root unit (embeddings, final norm) stays gathered; a layer, and the next prefetched
        unit = (sen.root_params + 2 * sen.layer_params) * cb
        if phase == "rollout":
            value = sen.params * cb if s.rollout_gather == "whole" else unit
        elif phase == "update":
            gathered = unit if s.reshard_after_forward else sen.params * cb
            # unsharded gradients before their reduce-scatter: the root's, one layer's (and its
            # float32 copy when gradients are reduced in float32)
            reduce = 4 if (s.reduce_dtype or s.param_dtype or "float32") == "float32" else cb
            extra = sen.layer_params * reduce if reduce != cb else 0
            value = gathered + (sen.root_params + sen.layer_params) * cb + extra
        elif phase == "old_logprobs":
            value = unit
        else:
            value = 0
        return {("senior", "gathered_senior"): value}
    if not s.autocast:
        return {}
    # under inference_mode (the engine) autocast casts each weight for its op and caches none;
    # with autograd on, it caches a cast of every weight until training_step ends
    rollout = phase == "rollout"
    value = max(sen.layer_params, sen.head_params) * cb if rollout else sen.params * cb
    return {("senior", "compute_copy"): value}


def _residual_bytes(s: Settings) -> int:
    """The senior's residual stream: float32 under autocast over float32 weights."""
    return s.weight_bytes if s.autocast else s.compute_bytes


def _junior_compute_bytes(s: Settings) -> int:
    return s.compute_bytes if s.autocast else s.junior_bytes


def kv_rows(s: Settings) -> tuple[int, int, int]:
    """``(rows at once, senior bytes per token, junior bytes per token)`` of a rollout's KV
    caches: every row of the process, or as many as ``generation.kv_cache_gib`` holds."""
    autocast_dtype = s.compute_dtype
    if s.autocast:
        # the k_norm's float32 weight promotes the keys to float32; the values stay autocast's
        weights = "float32" if s.weight_bytes == 4 else autocast_dtype
        senior = (s.senior.kv_bytes[weights] + s.senior.kv_bytes[autocast_dtype]) // 2
        junior = (s.junior.kv_bytes[s.model_dtype] + s.junior.kv_bytes[autocast_dtype]) // 2
    else:
        senior = s.senior.kv_bytes[s.compute_dtype]
        junior = s.junior.kv_bytes[s.model_dtype]
    junior = junior if s.junior_reads else 0
    rows = s.rows_per_rank
    if s.kv_cache_gib is not None:
        fit = int(s.kv_cache_gib * GiB) // (s.row_tokens * (senior + junior))
        rows = max(1, min(rows, fit))
    return rows, senior, junior


def _rollout(s: Settings) -> dict[tuple[str, str], int]:
    rows, senior_bpt, junior_bpt = kv_rows(s)
    out = {**_compute(s, "rollout")}
    out[("senior", "kv_cache_senior")] = rows * s.row_tokens * senior_bpt
    out[("senior", "rollout_forward_senior")] = _rollout_forward(
        s, s.senior, rows, s.compute_bytes, _residual_bytes(s)
    )
    if s.junior_reads:
        out[("junior", "kv_cache_junior")] = rows * s.row_tokens * junior_bpt
        out[("junior", "rollout_forward_junior")] = _rollout_forward(
            s, s.junior, rows, _junior_compute_bytes(s), s.junior_bytes
        )
    return out


def _rollout_forward(s: Settings, m: ModelShape, rows: int, cb: int, resid: int) -> int:
    """The larger of a prefill chunk's no-grad forward and one decode step's sampling."""
    p = s.prompt_tokens
    prompts = max(1, min(rows, PREFILL_TOKENS[s.accelerator] // p))
    prefill = no_grad_forward(m, prompts * p, cb, resid, mask=prompts * p * p)
    return max(prefill, rows * m.vocab * SAMPLING_BYTES)


def no_grad_forward(
    m: ModelShape, tokens: int, cb: int, resid: int, mask: int | None = None
) -> int:
    """The largest working set of a forward without gradients: the residual stream and one
    layer's widest intermediates (MLP gate, up and product; or attention's q, keys and values
    repeated to every head, and output), and the mask with one layer's float bias of it."""
    h = m.hidden
    per_token = 2 * resid * h + 4 * h + max(3 * m.intermediate * cb, 4 * m.q * cb)
    mask = tokens * tokens if mask is None else mask
    return tokens * per_token + mask * (1 + cb)


def layer_bytes_per_token(m: ModelShape, cb: int, autocast: bool) -> int:
    """What autograd saves of one decoder layer per token (the mask's bias aside)."""
    h_coeff = 16 + 5 * cb if autocast else 8 + 4 * cb
    return (
        h_coeff * m.hidden
        + (4 + 5 * cb) * m.q
        + (4 + cb) * m.kv
        + 4 * cb * m.intermediate
        + 8
        + 8 * m.heads
        + 4 * m.kv_heads
    )


def activation_bytes(s: Settings) -> tuple[int, int]:
    """``(activations, attention mask)`` of the largest micro-batch's forward and backward."""
    m, t, cb = s.senior, s.micro_tokens, s.compute_bytes
    resid = _residual_bytes(s)
    layer = t * layer_bytes_per_token(m, cb, s.autocast)
    # after the layers: the final norm's saved input and output, the positions picked for the
    # LM head, and the rotary tables
    rest = t * ((4 + resid) * m.hidden + resid * m.hidden + 2 * m.head_dim * resid + 24)
    if s.activation_checkpointing:
        # each layer's input kept; one layer recomputed in backward, and its gradients
        acts = t * m.hidden * resid * m.layers + 2 * layer
        biases = 1
    else:
        # every layer's saved tensors, and one layer's gradients in flight in backward
        acts = (m.layers + 1) * layer
        biases = m.layers
    return acts + rest, t * t * (1 + biases * cb)


def _logits(m: ModelShape, chunk: int, tokens: int, cb: int, grad: bool) -> int:
    per = cb + (LOGIT_BYTES_GRAD if grad else LOGIT_BYTES_NO_GRAD) + (4 if cb != 4 else 0)
    return min(chunk, tokens) * m.vocab * per


def _update(s: Settings) -> dict[tuple[str, str], int]:
    acts, mask = activation_bytes(s)
    return {
        ("senior", "activations"): acts,
        ("senior", "attention_mask"): mask,
        ("senior", "logits"): _logits(
            s.senior, s.logprob_chunk_tokens, s.micro_tokens, s.compute_bytes, grad=True
        ),
    }


def _step_temp(s: Settings) -> int:
    """AdamW's foreach step (the GPU default) holds a float32 temporary of every parameter (the
    square root of exp_avg_sq); the CPU's loop over parameters one at a time."""
    if _offloaded(s):
        return 0
    if s.accelerator == "gpu":
        return math.ceil(s.senior.params / s.shards) * s.weight_bytes
    # the largest single tensor: the embedding matrix (the tied LM head)
    return (s.senior.head_params or s.senior.layer_params) * s.weight_bytes
