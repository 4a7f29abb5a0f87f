"""The time plan's counts (tandem.plan.work) and roofs (tandem.plan.devices): the formulas by hand
on small shapes, and the dispatch counts and vocabulary passes recounted on the real code."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM

from tandem.assets import TINY_WORLD
from tandem.plan import model_shape
from tandem.plan import work as w
from tandem.plan.devices import COMPUTE_SHARE, MEMORY_SHARE, Device, named
from tandem.plan.probe import probe_cpu
from tandem.plan.shape import ModelShape

# a made-up shape small enough to count by hand
SMALL = ModelShape(
    name="small",
    architecture="Qwen3ForCausalLM",
    params=0,
    layer_params=0,
    root_params=0,
    head_params=0,
    layers=2,
    hidden=4,
    intermediate=6,
    heads=4,
    kv_heads=1,
    head_dim=2,
    vocab=10,
    context=None,
    kv_bytes={},
)
CPU = Device(
    "cpu",
    "a CPU",
    2**30,
    {"float32": 1e9},
    memory_bw=1e9,
    host_link=0.0,
    link=0.0,
    op_s=1e-6,
    gpu=False,
    cache_bw=4e9,
    cache_bytes=1000,
    exp_rate=1e8,
    fault_bw=5e8,
    weight_bw=2e9,
    attention={"decode": 1e8, "causal": 2e8, "causal_grad": 2e8},
)


def test_gemm_attention_and_head_work_match_a_hand_count() -> None:
    # q = 8, kv = 2: 4*8 + 2*4*2 + 8*4 + 3*4*6
    assert w.layer_matmul(SMALL) == 152
    gemm, attention, elementwise = w.layers(SMALL, tokens=10, pairs=55, cb=4)
    assert gemm.flops == 2 * 10 * 152 * 2 and gemm.weights == 152 * 2 * 4
    assert gemm.bytes == 10 * 2 * (7 * 4 + 2 * 8 + 2 * 2 + 3 * 6) * 4
    assert attention.attention == 4 * 8 * 55 * 2 and attention.exps == 4 * 55 * 2
    assert elementwise.exps == 10 * 6 * 2  # SiLU's sigmoid
    grad = w.layers(SMALL, tokens=10, pairs=55, cb=4, grad=True)
    assert grad[0].flops == 3 * gemm.flops and grad[0].weights == 2 * gemm.weights
    assert grad[1].attention == 3.5 * attention.attention
    assert grad[1].attention_kind == "causal_grad" and grad[3].bytes == (4 + 12) * 152 * 2
    head = w.head_gemm(SMALL, 3, cb=2)
    assert head.flops == 2 * 3 * 4 * 10 and head.weights == 10 * 4 * 2
    assert w.head_gemm(SMALL, 3, cb=2, grad=True).flops == 4 * head.flops


def test_vocabulary_passes_follow_the_ops_of_the_head_and_the_draw() -> None:
    # a division (1 read, 1 write, 1 fresh) and a logsumexp (4, 2, 1, 1 exp)
    assert w.head_passes(1, 1, grad=False, cb=4).values == (5, 3, 2, 1)
    assert w.head_passes(1, 0, grad=False, cb=4).values == (4, 2, 1, 1)
    # bf16 logits: the float32 copy first (half a read, a write, fresh)
    assert w.head_passes(1, 1, grad=False, cb=2).values == (5.5, 4, 3, 1)
    # forward, recomputed, then the backward: shift, exp, product, zeros, scatter, sum, division
    assert w.head_passes(1, 1, grad=True, cb=4).values == (17, 13, 11, 3)
    # a decode step: each model's logsumexp and tempered log-probs, one draw, the rows gathered
    assert w.sampling_passes(1, fast=False, tempered=True, cb=4).values == (14, 9, 5, 3)
    assert w.sampling_passes(2, fast=False, tempered=True, cb=4).values == (24, 15, 9, 5)
    assert w.sampling_passes(2, fast=True, tempered=False, cb=4).values == (8, 4, 0, 2)


def test_fresh_allocations_start_at_the_allocators_threshold() -> None:
    assert w.fresh(w.FRESH_BYTES - 1) == 0 and w.fresh(w.FRESH_BYTES, 2) == 2 * w.FRESH_BYTES
    # [1024, 151936] float32 logits are fresh; [8, 151936] are not
    assert w.vocab_work(w.Passes(1, 1, 1, 0), 1024, 151936).fresh == 1024 * 151936 * 4
    assert w.vocab_work(w.Passes(1, 1, 1, 0), 8, 151936).fresh == 0


@pytest.mark.parametrize("name", ["tiny", "Qwen/Qwen3-4B-Instruct-2507"])
def test_parameter_tensors_add_up_to_the_model(name: str) -> None:
    m = model_shape(name)
    sizes = w.tensor_sizes(m)
    assert sum(sizes) == m.params
    model_tensors = {"tiny": 46, "Qwen/Qwen3-4B-Instruct-2507": 398}[name]
    assert len(sizes) == model_tensors
    step = w.adamw(m)
    assert sum(x.bytes for x in step) == (w.ADAMW_BYTES + w.CLIP_BYTES) * m.params
    assert sum(x.ops for x in step) == w.ADAMW_TENSOR_OPS * len(sizes) + w.CLIP_OPS


def test_a_gpu_is_roofline_bound_and_a_cpu_adds_its_parts() -> None:
    a100 = named("a100")
    compute = w.Work(flops=312e12, dtype="bfloat16")
    assert a100.seconds(compute) == (pytest.approx(1 / COMPUTE_SHARE), 0.0)
    memory = w.Work(flops=1.0, bytes=2.039e12, ops=10)
    assert a100.seconds(memory) == (pytest.approx(1 / MEMORY_SHARE), pytest.approx(1e-4))
    # the CPU: arithmetic + traffic (cache or memory by working set) + weights + exps + faults
    work = w.Work(flops=1e9, bytes=4e9, working_set=1000, weights=2e9, exps=1e8, fresh=5e8)
    assert CPU.seconds(work) == (pytest.approx(1 + 1 + 1 + 1 + 1), 0.0)
    assert CPU.seconds(w.Work(bytes=1e9, working_set=1001))[0] == pytest.approx(1.0)
    assert CPU.seconds(w.Work(attention=1e8, attention_kind="decode"))[0] == pytest.approx(1.0)
    # the host's dispatch: all of it on a CPU, beyond the device's work on a GPU
    assert CPU.exposed(3.0, 5.0) == 3.0 and a100.exposed(3.0, 5.0) == 0.0
    assert a100.exposed(7.0, 5.0) == 2.0 and a100.hidden(7.0, 5.0) == 2.0


def test_the_cpu_probe_measures_finite_rates_once_per_process() -> None:
    d = probe_cpu(1)
    assert d is probe_cpu(1) and not d.gpu
    rates = [d.flops["float32"], d.memory_bw, d.cache_bw, d.weight_bw, d.exp_rate, d.fault_bw]
    rates += list(d.attention.values())
    assert all(math.isfinite(r) and r > 0 for r in rates)
    assert 1e-8 < d.op_s < 1e-3
    # more threads share the matmuls, nothing else
    two = probe_cpu(2)
    assert two.flops["float32"] == 2 * d.flops["float32"] and two.memory_bw == d.memory_bw


# -- the dispatch counts, recounted on the code they count -----------------------------------
class Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def count(fn) -> int:
    counter = Count()
    with counter:
        fn()
    return counter.ops


def tiny(layers: int) -> torch.nn.Module:
    config = copy.deepcopy(AutoConfig.from_pretrained(TINY_WORLD))
    config.num_hidden_layers, config.layer_types = layers, ["full_attention"] * layers
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def per_layer(measure) -> tuple[int, int]:
    """``(per layer, the rest)`` from a count at 1 and at 2 layers."""
    one, two = measure(tiny(1)), measure(tiny(2))
    return two - one, 2 * one - two


def test_the_engines_dispatch_counts_are_the_plans() -> None:
    from tandem.engine.reader import Reader

    def decode(model) -> int:
        reader = Reader(model.eval())
        with torch.inference_mode():
            ids = torch.randint(3, 100, (2, 10))
            reader.prefill(ids, torch.ones_like(ids), 2, 8)
            token, live = torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.bool)
            reader.step(token, live)
            return count(lambda: reader.step(token, live))

    def prefill(model) -> int:
        with torch.inference_mode():
            ids = torch.randint(3, 100, (2, 10))
            return count(lambda: Reader(model.eval()).prefill(ids, torch.ones_like(ids), 2, 8))

    assert per_layer(decode) == w.OPS["decode"]
    # the prefill's rest includes building the cache it reads into
    assert per_layer(prefill)[0] == w.OPS["prefill"][0]
    assert abs(per_layer(prefill)[1] - w.OPS["prefill"][1]) <= 10


def test_the_trainers_dispatch_counts_are_the_plans() -> None:
    from tandem.modules.logprobs import lays_out_rows, pack, packed_logprobs

    ids = torch.randint(3, 100, (2, 20))

    def packed(model, chunk: int = 1024, grad: bool = False) -> int:
        rows = pack(ids, torch.ones_like(ids), 10, lays_out_rows(model))

        def run() -> None:
            (lp,) = packed_logprobs(model, rows, [0.6], chunk)
            if grad:
                lp.sum().backward()

        if grad:
            return count(run)
        with torch.no_grad():
            return count(run)

    assert per_layer(packed) == w.OPS["logprobs"]
    assert per_layer(lambda m: packed(m.train(), grad=True)) == w.OPS["train"]
    model = tiny(1)
    # 20 head positions (2 rows of 10): one chunk of 1024, or two of 10
    assert packed(model, 10) - packed(model) == w.CHUNK_OPS["logprobs"]
    assert packed(model, 10, True) - packed(model, 1024, True) == w.CHUNK_OPS["train"]


def test_adamw_and_clipping_dispatch_as_counted() -> None:
    model = tiny(1)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()  # the state is made at the first step
    assert count(opt.step) == w.ADAMW_TENSOR_OPS * len(params) + 2
    assert count(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0)) == w.CLIP_OPS


@pytest.mark.parametrize("tandem", [False, True], ids=["solo", "tandem"])
def test_an_engine_step_dispatches_what_the_plan_counts(tandem: bool) -> None:
    from transformers import AutoTokenizer

    from tandem.data.arithmetic import make_splits
    from tandem.data.prompts import format_prompt
    from tandem.engine import SamplingParams, generate
    from tandem.samplers import SoloSampler, WordSampler, boundary_tables

    tok = AutoTokenizer.from_pretrained(TINY_WORLD)
    model = AutoModelForCausalLM.from_pretrained(TINY_WORLD).eval()
    rows = make_splits(0, sizes={"train": 1, "validation": 1, "test": 4})["test"]
    prompts = [tok(format_prompt(tok, r["prompt"]))["input_ids"] for r in rows]
    tables = boundary_tables(tok, model.config.vocab_size)

    def run(steps: int) -> int:
        params = SamplingParams(
            max_new_tokens=steps,
            eos_token_ids=(),
            seed=0,
            samples_per_prompt=4,
            temperature=0.6,
            logprob_temperature=0.6,
        )
        sampler = WordSampler(tables, p=0.5) if tandem else SoloSampler()
        return count(lambda: generate(model, model if tandem else None, prompts, sampler, params))

    per_step = (run(40) - run(8)) / 32
    forwards = (2 if tandem else 1) * (w.OPS["decode"][0] * 4 + w.OPS["decode"][1])
    engine = w.STEP_OPS["tandem" if tandem else "solo"]
    assert per_step - forwards == pytest.approx(engine, rel=0.15)
