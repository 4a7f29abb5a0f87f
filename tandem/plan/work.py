"""The work of each pass a step makes: FLOPs, bytes, exponentials and dispatched ops, from a
model's shape.

A pass is a list of ``Work`` items, each one class of operation whose parts share a roof (the
layers' GEMMs of a forward; its elementwise traffic; attention; the LM head's GEMM; the passes
over ``[positions, vocabulary]`` after it). ``tandem.plan.devices.Device.seconds`` turns items
into seconds. Widths: ``h`` hidden, ``q`` heads x head_dim, ``kv`` kv_heads x head_dim, ``i``
intermediate, ``V`` vocabulary, ``cb`` the compute dtype's bytes.

- GEMMs: ``2 x tokens x`` each layer's matmul parameters (``h q + 2 h kv + q h + 3 h i``), and
  ``2 x positions x h V`` for the LM head; a backward twice the forward's. Their traffic: the
  weights (``Work.weights``: a CPU streams them at its own rate) and each GEMM's input and
  output rows, ``(7 h + 2 q + 2 kv + 3 i) cb`` a token and layer.
- attention: ``4 q`` FLOPs per (query, key) pair it scores (``pairs``, causal), its backward
  2.5 times that (flash attention recomputes the scores); its softmax an exponential per pair
  and head; a decode step reads every cached key and value of its rows.
- elementwise: twice what autograd saves of a layer (``tandem.plan.activations``), written once
  and read once, per token; the backward twice the forward's; SiLU's sigmoid an exponential per
  intermediate element.
- the vocabulary passes (``head_passes``, ``sampling_passes``): counted op by op from
  ``tandem.modules.logprobs._LogProbHead`` and ``tandem.engine.draw``, in reads, writes, fresh
  allocations and exponentials of one ``[positions, V]`` float32 tensor, including the passes
  inside ``logsumexp`` (max, shift, exp, sum: 4 reads, 2 writes, 1 allocation, 1 exp).
- dispatched ops: per layer and per pass, counted on Qwen3ForCausalLM (transformers 5) through
  ``TorchDispatchMode`` (``OPS``; ``tests/plan/test_time_work.py`` recounts each).
- AdamW: torch's single-tensor step, op by op (``ADAMW_BYTES``); each tensor's four arrays come
  from memory once (``STREAM_BYTES``), the rest of its traffic is over one tensor at a time.

What this file leaves out: which passes a step makes (``tandem.plan.time``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tandem.plan import activations as act
from tandem.plan.shape import ModelShape

# glibc's largest dynamic mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit): a tensor of
# this many bytes or more is mapped fresh at every allocation, and faults in page by page on a
# CPU (a GPU's caching allocator reuses its blocks)
FRESH_BYTES = 32 * 2**20
# dispatched ops of one decoder layer and of the rest of the model (embeddings, norm, masks,
# the head) in each kind of pass: a decode step through the engine's reader, a prefill chunk,
# a packed log-prob forward without gradients, and one with gradients and its backward
OPS = {"decode": (76, 39), "prefill": (95, 54), "logprobs": (105, 33), "train": (312, 100)}
# ... of each LM-head chunk of a packed pass (without gradients, and with them and backward)
CHUNK_OPS = {"logprobs": 11, "train": 50}
# ... of a layer's forward recomputed in backward under activation checkpointing
RECOMPUTE_OPS = 110
# ... per micro-batch beyond the model's: packing its rows, the loss and its bookkeeping
# (tandem.modules.update.accumulate), or packing and storing the old log-probs
MICRO_OPS = {"train": 143, "logprobs": 70}
# ... of one engine step beyond the models' forwards (tandem.engine.loop: drawing, the
# sampler's step, the log-probs recorded, the bookkeeping): one model, and a pair with a
# handoff sampler (the word sampler's retractions included, on average)
STEP_OPS = {"solo": 75, "tandem": 290}
# ... of torch's AdamW per parameter tensor (its single-tensor step), and of clipping the
# gradient's norm (foreach) per optimizer step
ADAMW_TENSOR_OPS = 10
CLIP_OPS = 8
# bytes a parameter of float32 traffic in torch's AdamW step (decoupled weight decay: mul_ 8,
# lerp_ 12, mul_ 8, addcmul_ 12, sqrt 8, div 8, add_ 8, addcdiv_ 16) and in clipping (the
# norm reads the gradient, the scale reads and writes it)
ADAMW_BYTES = 80
CLIP_BYTES = 12
# of those, the float32 temporaries AdamW allocates per parameter (sqrt's and div's outputs)
ADAMW_FRESH = 8
# ... and what comes from memory and goes back: four arrays read, three written
STREAM_BYTES = 28


@dataclass(frozen=True)
class Work:
    """One class of operation of a pass.

    Attributes:
        flops: matmul FLOPs.
        attention: FLOPs of attention's scores and weighted values, apart: a CPU runs them far
            below its matmul rate.
        attention_kind: ``decode`` (one query a row against a cache), ``causal`` (whole rows)
            or ``causal_grad`` (with the backward).
        bytes: memory traffic (reads and writes) besides the weights.
        weights: bytes of GEMM weight operands read.
        cache_reads: bytes of KV cache a decode step's attention reads (a CPU's decode attention
            rate is measured over a cache that does not stay in its caches: it includes them).
        working_set: bytes of its largest operation's operands (a CPU's cache decides on it).
        exps: transcendental elements (exp, sigmoid).
        fresh: bytes written to tensors allocated fresh from the system (a CPU's allocator maps
            tensors of ``FRESH_BYTES`` and more anew at every allocation).
        ops: dispatched ops.
        dtype: the dtype its matmuls compute in.
    """

    flops: float = 0.0
    attention: float = 0.0
    attention_kind: str = "causal"
    bytes: float = 0.0
    weights: float = 0.0
    cache_reads: float = 0.0
    working_set: int = 0
    exps: float = 0.0
    fresh: float = 0.0
    ops: float = 0.0
    dtype: str = "float32"

    def times(self, k: float) -> Work:
        """``k`` of it (the working set is one operation's, so it stays)."""
        return replace(
            self,
            flops=self.flops * k,
            attention=self.attention * k,
            bytes=self.bytes * k,
            weights=self.weights * k,
            cache_reads=self.cache_reads * k,
            exps=self.exps * k,
            fresh=self.fresh * k,
            ops=self.ops * k,
        )


@dataclass(frozen=True)
class Passes:
    """Reads, writes, fresh allocations and exponentials of one ``[positions, V]`` tensor."""

    reads: float
    writes: float
    fresh: float
    exps: float

    def __add__(self, other: Passes) -> Passes:
        return Passes(*(a + b for a, b in zip(self.values, other.values, strict=True)))

    def __mul__(self, k: float) -> Passes:
        return Passes(*(a * k for a in self.values))

    @property
    def values(self) -> tuple[float, float, float, float]:
        return (self.reads, self.writes, self.fresh, self.exps)


NONE = Passes(0, 0, 0, 0)
LOGSUMEXP = Passes(4, 2, 1, 1)
# a division by the temperature, a fresh tensor
DIVIDE = Passes(1, 1, 1, 0)


def fresh(size: float, count: float = 1.0) -> float:
    """Bytes of ``count`` fresh allocations of ``size`` bytes that fault in (see FRESH_BYTES)."""
    return count * size if size >= FRESH_BYTES else 0.0


def layer_matmul(m: ModelShape) -> int:
    """Matmul parameters of one decoder layer (the projections of attention and the MLP)."""
    return m.hidden * m.q + 2 * m.hidden * m.kv + m.q * m.hidden + 3 * m.hidden * m.intermediate


def gemm_rows_bytes(m: ModelShape, cb: int) -> int:
    """Bytes of the layers' GEMM inputs and outputs, per token and layer."""
    return (7 * m.hidden + 2 * m.q + 2 * m.kv + 3 * m.intermediate) * cb


def layers(
    m: ModelShape,
    tokens: float,
    pairs: float,
    cb: int,
    grad: bool = False,
    kv_read: float = 0.0,
    autocast_cast: bool = False,
) -> list[Work]:
    """The decoder layers over ``tokens`` positions, attention scoring ``pairs``
    (query, key) pairs in each layer: forward, and with ``grad`` its backward too.

    Args:
        m: the model.
        tokens: positions read.
        pairs: (query, key) pairs attention scores, per layer.
        cb: the compute dtype's bytes.
        grad: add the backward (and the weight gradients' accumulation, float32).
        kv_read: bytes of KV cache attention reads (a decode step), all layers.
        autocast_cast: the weights are float32, cast to ``cb`` for every forward (autocast
            without autograd caches no cast).
    """
    dtype = "float32" if cb == 4 else "bfloat16"
    k = 3.0 if grad else 1.0  # backward = twice the forward's GEMMs
    lm, L = layer_matmul(m), m.layers
    largest = max(m.hidden * m.intermediate, m.hidden * m.q) * cb
    gemm = Work(
        flops=k * 2 * tokens * lm * L,
        bytes=k * tokens * L * gemm_rows_bytes(m, cb),
        # the backward reads each weight once more (for the inputs' gradient) and writes its
        # gradient
        weights=(2.0 if grad else 1.0) * lm * L * cb,
        working_set=largest + int(tokens) * (m.hidden + m.intermediate) * cb,
        dtype=dtype,
    )
    a = 1.0 + (2.5 if grad else 0.0)
    attention = Work(
        attention=a * 4 * m.q * pairs * L,
        attention_kind="decode" if kv_read > 0 else ("causal_grad" if grad else "causal"),
        bytes=a * 2 * tokens * (2 * m.q + 2 * m.kv) * cb * L,
        cache_reads=kv_read,
        working_set=int(tokens) * (2 * m.q + 2 * m.kv) * cb,
        exps=(2.0 if grad else 1.0) * m.heads * pairs * L,
        dtype=dtype,
    )
    per_token = act.layer_bytes_per_token(m, cb, autocast=False)
    traffic = (3.0 if grad else 1.0) * 2 * tokens * per_token * L
    cast = lm * L * (4 + cb) if autocast_cast else 0
    elementwise = Work(
        bytes=traffic + cast,
        working_set=int(tokens) * m.intermediate * cb * 3,
        exps=(2.0 if grad else 1.0) * tokens * m.intermediate * L,
    )
    out = [gemm, attention, elementwise]
    if grad:  # the weight gradients written, then added into float32 .grad: read, read, write
        out.append(Work(bytes=(cb + 12) * lm * L, working_set=largest * 3))
    return out


def embedding_backward(m: ModelShape) -> Work:
    """The input embedding's gradient: a zeroed ``[V, h]`` float32 tensor, the rows added into
    it, then added into ``.grad``."""
    size = m.vocab * m.hidden * 4
    return Work(bytes=4 * size, working_set=2 * size, fresh=fresh(size))


def head_gemm(m: ModelShape, positions: float, cb: int, grad: bool = False) -> Work:
    """The LM head over ``positions`` (at most one chunk's worth at a time: the caller splits
    into chunks), its logits written (and with ``grad`` recomputed, and both gradients)."""
    dtype = "float32" if cb == 4 else "bfloat16"
    k = 4.0 if grad else 1.0  # forward, recomputed, and the two GEMMs of its backward
    out = positions * m.vocab * cb
    weights = m.vocab * m.hidden * cb
    # with gradients: the weight's gradient written, and added into float32 .grad
    grads = m.vocab * m.hidden * (cb + 12) if grad else 0
    return Work(
        flops=k * 2 * positions * m.hidden * m.vocab,
        bytes=k * (out + positions * m.hidden * cb) + grads,
        weights=(3.0 if grad else 1.0) * weights,
        working_set=int(weights + out),
        fresh=fresh(out, 2 if grad else 1),
        dtype=dtype,
    )


def head_passes(temperatures: int, tempered: int, grad: bool, cb: int) -> Passes:
    """The passes over one chunk's ``[c, V]`` logits after the head's GEMM
    (``tandem.modules.logprobs._LogProbHead._chunk``): the float32 copy where the head computes
    in ``cb < 4``; for each of ``temperatures`` (``tempered`` of them not 1) a division and a
    ``logsumexp``; with ``grad`` all of it again in backward (the chunk is recomputed), then
    ``logsumexp``'s backward (a shift, an exp, a product), the gather's (a zeroed tensor, a
    scatter), their sum, and the division's."""
    upcast = Passes(cb / 4, 1, 1, 0) if cb != 4 else NONE
    forward = upcast + LOGSUMEXP * temperatures + DIVIDE * tempered
    if not grad:
        return forward
    backward = (
        Passes(1, 1, 1, 0)  # the shift by logsumexp
        + Passes(1, 1, 1, 1)  # its exp
        + Passes(1, 1, 1, 0)  # times the gradient
        + Passes(0, 1, 1, 0)  # the gather's zeros
        + Passes(1, 1, 1, 0)  # scattered into
        + Passes(2, 1, 1, 0)  # the two gradients summed
    ) * temperatures + DIVIDE * tempered
    return forward * 2 + backward


def sampling_passes(models: int, fast: bool, tempered: bool, cb: int) -> Passes:
    """A decode step's passes over each model's ``[n, V]`` logits (``tandem.engine.draw``):
    each model's scores (at temperature 1, ``exp`` into the reserved buffer: a max, a shift, an
    exp, the block sums; else a ``logsumexp``) and, recorded at a loss temperature other than 1,
    its tempered log-probs (a division, a ``logsumexp``); one draw over the batch (at another
    temperature: a division, a zeroed buffer, a max, a shift, an exp, the sums) and, where two
    models write, each one's rows gathered first."""
    upcast = Passes(cb / 4, 1, 1, 0) if cb != 4 else NONE
    score = Passes(4, 2, 0, 1) if fast else LOGSUMEXP
    per_model = upcast + score + ((DIVIDE + LOGSUMEXP) if tempered else NONE)
    draw = NONE if fast else Passes(5, 4, 2, 1)
    gather = Passes(1, 1, 1, 0) if models > 1 and not fast else NONE
    return per_model * models + draw + gather


def vocab_work(p: Passes, positions: float, vocab: int) -> Work:
    """Work of ``p`` over a ``[positions, vocab]`` float32 tensor."""
    unit = positions * vocab * 4
    return Work(
        bytes=(p.reads + p.writes) * unit,
        working_set=int(2 * unit),
        exps=p.exps * positions * vocab,
        fresh=fresh(unit, p.fresh),
    )


def chunks(positions: int, chunk: int) -> list[int]:
    """The LM head's chunk sizes over ``positions``."""
    full, rest = divmod(positions, chunk)
    return [chunk] * full + ([rest] if rest else [])


def adamw(m: ModelShape, shards: int = 1) -> list[Work]:
    """One AdamW step with its clipping over the model's float32 parameters (a ``1 / shards``
    share of each tensor). Dispatches: the single-tensor step's (a foreach step dispatches per
    group of tensors instead: a bound). Its temporaries of tensors of ``FRESH_BYTES`` and more
    are fresh allocations."""
    params = m.params / shards
    sizes = [s / shards for s in tensor_sizes(m)]
    # each tensor's parameter, gradient and two moments come from memory once and their
    # parameter and moments go back (STREAM_BYTES); the rest of the traffic is over one
    # tensor's four arrays at a time
    return [
        Work(bytes=STREAM_BYTES * params, working_set=int(16 * params)),
        Work(
            bytes=(ADAMW_BYTES + CLIP_BYTES - STREAM_BYTES) * params,
            working_set=int(max(sizes)) * 4 * 4,
            fresh=sum(fresh(size * 4, ADAMW_FRESH / 4) for size in sizes),
            ops=ADAMW_TENSOR_OPS * len(sizes) + CLIP_OPS,
        ),
    ]


def tensor_sizes(m: ModelShape) -> list[int]:
    """The parameter tensors' sizes of a Qwen3-style model: per layer the seven projections and
    four norms (input, post-attention, queries', keys'), then the embedding, the final norm and
    an untied head."""
    h, q, kv, i = m.hidden, m.q, m.kv, m.intermediate
    layer = [h * q, h * kv, h * kv, q * h, h * i, h * i, i * h, h, h, m.head_dim, m.head_dim]
    untied = m.root_params > m.vocab * h + h
    root = [m.vocab * h, h] + ([m.vocab * h] if untied else [])
    return layer * m.layers + root


def causal_pairs(length: float) -> float:
    """(query, key) pairs of causal attention over ``length`` positions."""
    return length * (length + 1) / 2
