"""The memory plan (tandem.plan): the paper's Qwen3-4B run from its config.json alone, the
refusal a run gets when it cannot fit, the CLI's JSON line, and the activation coefficients
against the tensors autograd really saves."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from transformers import AutoConfig

from tandem.errors import ConfigError
from tandem.plan import GiB, PlanError, check_plan, make_plan, model_shape
from tandem.plan.activations import kv_pass_bytes, layer_bytes_per_token, slot_bytes
from tests.paper_layouts import AUTHORS

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
# Qwen3-4B-Instruct-2507's public shape
QWEN3_4B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}
# the sharded layout that fits two 80 GiB cards (++: the keys may be new to conf/)
SHARDED = ("trainer=fsdp_gpu", "trainer.devices=2", "model.junior_device=null")
# one process under bf16-mixed, the junior on cuda:1, no KV budget: too big for 80 GiB cards
SINGLE = ("trainer=gpu", "++generation.kv_cache_gib=null")
BUDGETS = ("++module.max_tokens_per_micro_batch=4096", "++generation.kv_cache_gib=32")


@pytest.fixture(scope="module")
def qwen3_4b(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("qwen3_4b")
    (folder / "config.json").write_text(json.dumps(QWEN3_4B))
    return str(folder)


def paper(model: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("reproduce_paper", [f"model.name_or_path={model}", *AUTHORS, *overrides])


def devices(count: int, gib: float) -> tuple[tuple[str, int], ...]:
    return tuple((f"cuda:{i}", int(gib * GiB)) for i in range(count))


def test_parameters_are_counted_from_the_config_with_tied_embeddings_once(qwen3_4b: str) -> None:
    shape = model_shape(qwen3_4b)
    h, q, kv, i, v = 2560, 32 * 128, 8 * 128, 9728, 151936
    layer = 2 * h * q + 2 * h * kv + 3 * h * i + 2 * h + 2 * 128  # projections and norms
    assert shape.layer_params == layer
    assert shape.params == v * h + 36 * layer + h == 4_022_468_096  # 4.02B
    assert shape.root_params == v * h + h  # the embedding doubles as the LM head
    assert shape.kv_bytes["bfloat16"] == 36 * 8 * 128 * 2 * 2


def test_the_paper_model_is_planned_offline_from_its_bundled_config(qwen3_4b: str) -> None:
    bundled = model_shape("Qwen/Qwen3-4B-Instruct-2507")
    assert replace(bundled, name="") == replace(model_shape(qwen3_4b), name="")


def test_fsdp2_splits_master_weights_and_adam_state_across_devices(qwen3_4b: str) -> None:
    plan = make_plan(paper(qwen3_4b, *SHARDED), devices=devices(2, 80), fixes=False)
    half = math.ceil(4_022_468_096 / 2)
    for d in plan.devices:
        update = d.phases["update"]
        assert update["senior_weights"] == half * 4  # float32 master weights, 7.49 GiB
        assert update["optimizer_state"] == half * 8  # exp_avg and exp_avg_sq, float32
        # a mini-batch's micro-batches accumulate unsharded float32 gradients, reduced once
        assert update["accumulated_gradients"] == 4_022_468_096 * 4
        assert "gradients" not in update
        assert d.phases["step"]["gradients"] == half * 4  # reduced to shards for the step
        assert "gradients" not in d.phases["rollout"]  # freed after every optimizer step
        # the junior is whole on every rank, in model.dtype
        assert d.phases["rollout"]["junior_weights"] == 4_022_468_096 * 2


# KV-cache bytes per position of Qwen3-4B: bfloat16, and under bf16-mixed (float32 keys: the
# k_norm's float32 weight promotes them)
KV_BF16 = 36 * 8 * 128 * 2 * 2
KV_MIXED = 36 * 8 * 128 * (4 + 2)


def kv_pass(per_token: int, prompts: int) -> int:
    """What a pass's budget counts: 8 rows of 1,024 + 3,000 positions a prompt, and its own
    1,024 keys once more while the prefill repeats them (tandem.engine.cache.kv_chunk_bytes)."""
    return kv_rows(per_token, prompts) + per_token * prompts * 1024


def kv_rows(per_token: int, prompts: int) -> int:
    """What a pass's rows hold when they decode (the KV terms of a plan)."""
    return per_token * prompts * 8 * 4024


def test_one_process_does_not_fit_one_80_gib_card_and_names_fixes(qwen3_4b: str) -> None:
    plan = make_plan(
        paper(qwen3_4b, "trainer=gpu", "++generation.kv_cache_gib=1000"), devices=devices(1, 80)
    )
    rollout = plan.devices[0].phases["rollout"]
    # a budget that holds every row: 128 rows of 4,024 positions, 70.7 GiB per bf16 model
    assert rollout["kv_cache_junior"] == kv_rows(KV_BF16, 16)
    assert round(128 * 4024 * KV_BF16 / GiB, 1) == 70.7
    assert rollout["kv_cache_senior"] == kv_rows(KV_MIXED, 16)
    assert not plan.fits
    assert any("model.junior_device (cuda:1)" in p for p in plan.problems)
    named = {o.split("=")[0] for f in plan.fixes for o in f.overrides}
    assert "generation.kv_cache_gib" in named  # the rollout is the peak
    assert plan.together is not None and plan.together.fits


def test_a_null_kv_budget_takes_nine_tenths_of_what_is_free(qwen3_4b: str) -> None:
    plan = make_plan(paper(qwen3_4b, *SINGLE), devices=devices(1, 80), fixes=False)
    rollout = plan.devices[0].phases["rollout"]
    kv = rollout.pop("kv_cache_senior") + rollout.pop("kv_cache_junior")
    rollout.pop("rollout_forward")
    # what the engine finds free when the rollout starts: the device less weights, AdamW's
    # state, the junior, the runtime; whole prompt groups of both models' caches in 90% of it
    group = kv_pass(KV_MIXED + KV_BF16, 1)
    prompts = int(0.9 * (80 * GiB - sum(rollout.values()))) // group
    assert prompts == 2 and kv == kv_rows(KV_MIXED + KV_BF16, prompts)
    assert plan.devices[0].peak_phase == "update"


def test_with_budgets_fsdp2_over_two_80_gib_cards_fits(qwen3_4b: str) -> None:
    plan = make_plan(paper(qwen3_4b, *SHARDED, *BUDGETS), devices=devices(2, 80))
    assert plan.fits, [(d.name, d.peak / GiB) for d in plan.devices]
    d = plan.devices[0]
    assert d.peak <= d.usable < d.capacity
    # 8 prompts a rank: 32 GiB holds 3 prompt groups of both bf16 models' caches at once
    assert d.phases["rollout"]["kv_cache_senior"] == kv_rows(KV_BF16, 3)


def test_kv_caches_are_counted_as_the_engine_counts_them(qwen3_4b: str) -> None:
    from tandem.engine import cache

    plan = make_plan(paper(qwen3_4b, *SHARDED, *BUDGETS), devices=devices(2, 80), fixes=False)
    # the budget's count of a pass, and what its rows hold once the prompts are repeated in
    assert kv_pass_bytes(plan.settings, KV_BF16, 3) == cache.kv_chunk_bytes(
        KV_BF16, 3, 8, 1024, 3000
    )
    assert plan.devices[0].phases["rollout"]["kv_cache_junior"] == kv_rows(KV_BF16, 3)
    config = AutoConfig.from_pretrained(qwen3_4b)
    assert cache.kv_bytes_per_token(config, torch.bfloat16) == KV_BF16


def test_the_paper_layout_fits_two_80_gib_cards_with_two_kv_passes(qwen3_4b: str) -> None:
    # conf/trainer/paper_gpus.yaml: one FSDP2 process offloading its shards and AdamW state
    # between phases (verl's offload), the junior apart
    plan = make_plan(paper(qwen3_4b), devices=devices(2, 80))  # as shipped
    assert plan.fits, [(d.name, d.peak / GiB) for d in plan.devices]
    # 64 GiB a card holds 14 of the 16 prompt groups: two passes of 8, as even as they go
    for d, term in zip(plan.devices, ("kv_cache_senior", "kv_cache_junior"), strict=True):
        assert d.phases["rollout"][term] == kv_rows(KV_BF16, 8)
    senior, junior = plan.devices
    assert junior.peak_phase == "rollout"
    # the AdamW state waits on the host through the rollout and the old log-probs; the step
    # holds the shards, the state, the gradients and foreach AdamW's temporaries on the device
    state = 4_022_468_096 * 8
    assert "optimizer_state" not in senior.phases["rollout"]
    assert senior.phases["step"]["optimizer_state"] == state and senior.peak_phase == "step"
    assert plan.host.phases["rollout"]["optimizer_state"] == state
    assert "optimizer_state" not in plan.host.phases["step"]


VLLM = ("module.backend.name=vllm", "+module.backend.dtype=bfloat16")


def test_a_vllm_engine_holds_its_share_of_the_device_in_every_phase(qwen3_4b: str) -> None:
    share = "+module.backend.engine_args.gpu_memory_utilization=0.5"
    # the shards and AdamW state on the host for good: vLLM holds its share through the update
    # when it does not sleep (asleep, it holds the rollout only: tests/test_plan_vllm.py)
    offload = "trainer.strategy.offload=fsdp"
    awake = "+module.backend.sleep=false"
    plan = make_plan(paper(qwen3_4b, *VLLM, share, offload, awake), devices=devices(2, 80))
    assert plan.fits and not plan.problems
    first = plan.devices[0]
    for phase, terms in first.phases.items():
        assert terms["vllm_engine"] == int(0.5 * 80 * GiB), phase
    assert not any(k.startswith("kv_cache") for t in first.phases.values() for k in t)
    # both bf16 models (15.0 GiB) leave 25 GiB, 22 rows of 4,024 positions of both KV caches
    per_row = 2 * KV_BF16 * 4024
    rows = (int(0.5 * 80 * GiB) - 2 * 4_022_468_096 * 2) // per_row
    assert any(f"the KV of {rows} of this process's 128 rows" in n for n in plan.notes), plan.notes
    # a share too small for both models' weights is refused, naming the key
    small = make_plan(
        paper(qwen3_4b, *VLLM, "+module.backend.engine_args.gpu_memory_utilization=0.15", offload),
        devices=devices(2, 80),
    )
    assert any("gpu_memory_utilization" in p for p in small.problems), small.problems


def test_the_fixes_a_plan_names_fit_when_composed(qwen3_4b: str) -> None:
    plan = make_plan(paper(qwen3_4b, *SINGLE), devices=devices(2, 80))
    assert not plan.fits and plan.together is not None and plan.together.fits
    groups = {p.name for p in CONF.iterdir() if p.is_dir()}
    overrides = [o if o.split("=")[0] in groups else f"++{o}" for o in plan.together.overrides]
    fixed = make_plan(paper(qwen3_4b, *SINGLE, *overrides), devices=devices(2, 80))
    assert fixed.fits and fixed.peak == plan.together.peak


def test_a_run_that_cannot_fit_is_refused_with_the_figures(qwen3_4b: str) -> None:
    cfg = paper(qwen3_4b, *SINGLE)
    with pytest.raises(PlanError) as err:
        check_plan(cfg, 1, devices=devices(2, 80))
    assert isinstance(err.value, ConfigError)  # tandem.train exits 2 on it
    message = str(err.value)
    assert "cuda:0 needs" in message and "module.max_tokens_per_micro_batch" in message
    fitting = check_plan(paper(qwen3_4b, *SHARDED, *BUDGETS), 2, devices=devices(2, 80))
    assert fitting.fits


def test_a_cpu_run_of_the_tiny_world_fits_the_host() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", ["module.max_tokens_per_micro_batch=4096"])
    plan = make_plan(cfg, 1, devices=(("cpu", 8 * GiB),))
    assert plan.fits and [d.name for d in plan.devices] == ["cpu"]
    phases = plan.phase_bytes()
    assert set(phases) == {"rollout", "update", "step"}  # old log-probs from the engine
    assert phases["update"] > phases["rollout"] > 0


def test_the_cli_ends_with_one_json_line(qwen3_4b: str) -> None:
    out = subprocess.run(
        [
            *(sys.executable, "-m", "tandem.plan", "--config-name", "reproduce_paper"),
            *(f"model.name_or_path={qwen3_4b}", "--devices", "2x80", *AUTHORS, *SINGLE),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "cuda:1" in out.stdout and "KV cache, junior" in out.stdout
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["fits"] is False and result["peak_gib"] > 80
    assert [d["capacity_gib"] for d in result["devices"]] == [80.0, 80.0]
    # the junior's card: 4 prompt groups, as many as the senior's card holds in 90% of its free
    kv = result["devices"][1]["phases"]["rollout"]["kv_cache_junior"]
    assert kv == pytest.approx(kv_rows(KV_BF16, 4) / GiB, abs=1e-3)
    assert result["senior_params"] == 4_022_468_096 and result["terms"]
    assert result["together"]["fits"] and "trainer=fsdp_gpu" in result["together"]["overrides"]


def test_the_cli_refuses_bad_devices() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tandem.plan", "--devices", "two"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "COUNTxGIB" in out.stderr


@pytest.mark.parametrize("rows", [True, False], ids=["rows_laid_out", "mask"])
@pytest.mark.parametrize("mode", ["float32", "bfloat16", "autocast"])
def test_layer_coefficients_match_what_autograd_saves(
    mode: str, rows: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved-tensor bytes of one decoder layer per token, for a packed forward through
    tandem.modules.logprobs (its rows laid out for sdpa, or read through a block-diagonal
    mask), against ``layer_bytes_per_token`` and the mask's bias."""
    from transformers import Qwen3Config

    import tandem.modules.logprobs as logprobs

    if hasattr(logprobs, "lays_out_rows"):
        monkeypatch.setattr(logprobs, "lays_out_rows", lambda model: rows)
    elif rows:
        pytest.skip("this trainer reads packs through a mask only")

    def config(layers: int) -> Qwen3Config:
        # every width apart (q = 240, kv = 80), so that no coefficient hides another's
        return Qwen3Config(
            hidden_size=96,
            intermediate_size=304,
            num_hidden_layers=layers,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=40,
            vocab_size=300,
            tie_word_embeddings=True,
        )

    saved = {n: _saved_bytes(config(n), mode, logprobs) for n in (1, 2)}
    config(2).save_pretrained(tmp_path)
    shape = model_shape(str(tmp_path))
    tokens = 3 * 20
    cb = 4 if mode == "float32" else 2
    per_token = layer_bytes_per_token(shape, cb, mode == "autocast", rows=rows)
    assert saved[2] - saved[1] == tokens * per_token + (0 if rows else tokens**2 * cb)
    if rows:
        # the three rows of one prompt of 10 tokens read it once (40 tokens) in 60 slots
        shared = {n: _saved_bytes(config(n), mode, logprobs, share=True) for n in (1, 2)}
        per_slot = slot_bytes(shape, cb)
        assert 0 < per_slot < per_token
        assert shared[2] - shared[1] == 40 * (per_token - per_slot) + tokens * per_slot


def test_qwen3_packs_are_laid_out_where_the_trainer_can(qwen3_4b: str) -> None:
    import tandem.modules.logprobs as logprobs

    assert model_shape(qwen3_4b).rows_attention == hasattr(logprobs, "lays_out_rows")


def _saved_bytes(config, mode: str, logprobs, share: bool = False) -> int:
    """Bytes autograd saves for backward that are neither weights nor their autocast casts."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    if mode == "bfloat16":
        model = model.to(torch.bfloat16)
    model.train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
    shapes |= {s[::-1] for s in shapes}
    ids = torch.randint(0, config.vocab_size, (3, 20))
    ids[1:, :10] = ids[0, :10]  # one prompt of three rows
    packed = logprobs.pack(ids, torch.ones_like(ids), 10, share_prompts=share)
    seen: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        # an autocast cast of a weight is the compute copy, counted once per weight elsewhere
        if storage.data_ptr() not in weights and tuple(t.shape) not in shapes:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast")
    with autocast, torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        logprobs.packed_logprobs(model, packed, [0.6], chunk_tokens=16)
    return sum(seen.values())


@pytest.mark.parametrize("offload", ["none", "fsdp", "between_phases"])
def test_each_offload_layout_is_planned_on_the_device_and_the_host(
    qwen3_4b: str, offload: str
) -> None:
    cfg = paper(qwen3_4b, f"trainer.strategy.offload={offload}")
    plan = make_plan(cfg, devices=devices(2, 80), fixes=False, host_bytes=256 * GiB)
    senior, host = plan.devices[0], plan.host
    shard, state = 4_022_468_096 * 4, 4_022_468_096 * 8
    on_device = {
        # (rollout, update, step): the shards, the AdamW state on cuda:0
        "none": [(shard, state)] * 3,
        "fsdp": [(None, None)] * 3,
        "between_phases": [(shard, None), (shard, state), (shard, state)],
    }[offload]
    for phase, (weights, adam) in zip(("rollout", "update", "step"), on_device, strict=True):
        assert senior.phases[phase].get("senior_weights") == weights, phase
        assert senior.phases[phase].get("optimizer_state") == adam, phase
        # whatever is not on the device waits on the host
        assert host.phases[phase].get("senior_weights") == (None if weights else shard), phase
        assert host.phases[phase].get("optimizer_state") == (None if adam else state), phase
    # before training each process reads its senior in float32 and its junior on the host
    assert host.phases["load"]["senior_load"] == shard
    assert host.phases["load"]["junior_load"] == 4_022_468_096 * 2
    # FSDP2's offload reduces gradients to the host, where its optimizer step runs
    host_grads = host.phases["step"].get("gradients")
    assert host_grads == (shard if offload == "fsdp" else None)
    assert ("step_temp" in senior.phases["step"]) == (offload != "fsdp")


def test_fits_includes_the_host_where_its_size_is_known(qwen3_4b: str) -> None:
    cfg = paper(qwen3_4b, "trainer.strategy.offload=fsdp")
    unknown = make_plan(cfg, devices=devices(2, 80), fixes=False)
    assert unknown.fits and unknown.host.capacity == 0
    small = make_plan(cfg, devices=devices(2, 80), fixes=False, host_bytes=48 * GiB)
    assert not small.fits and all(d.fits for d in small.devices)
    with pytest.raises(PlanError, match="host needs"):
        check_plan(cfg, 1, devices=devices(2, 80), host_bytes=48 * GiB)
