"""The memory plan (tandem.plan): the paper's Qwen3-4B run from its config.json alone, the
refusal a run gets when it cannot fit, the CLI's JSON line, and the activation coefficients
against the tensors autograd really saves."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from tandem.errors import ConfigError
from tandem.plan import GiB, PlanError, check_plan, make_plan, model_shape
from tandem.plan.memory import layer_bytes_per_token

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
BUDGETS = ("++module.max_tokens_per_micro_batch=4096", "++generation.kv_cache_gib=32")


@pytest.fixture(scope="module")
def qwen3_4b(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("qwen3_4b")
    (folder / "config.json").write_text(json.dumps(QWEN3_4B))
    return str(folder)


def paper(model: str, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("reproduce_paper", [f"model.name_or_path={model}", *overrides])


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


def test_fsdp2_splits_master_weights_and_adam_state_across_devices(qwen3_4b: str) -> None:
    plan = make_plan(paper(qwen3_4b, *SHARDED), devices=devices(2, 80), fixes=False)
    half = math.ceil(4_022_468_096 / 2)
    for d in plan.devices:
        update = d.phases["update"]
        assert update["senior_weights"] == half * 4  # float32 master weights, 7.49 GiB
        assert update["optimizer_state"] == half * 8  # exp_avg and exp_avg_sq, float32
        assert update["gradients"] == half * 4
        assert "gradients" not in d.phases["rollout"]  # freed after every optimizer step
        # the junior is whole on every rank, in model.dtype
        assert d.phases["rollout"]["junior_weights"] == 4_022_468_096 * 2


def test_the_paper_config_does_not_fit_one_80_gib_card_and_names_fixes(qwen3_4b: str) -> None:
    plan = make_plan(paper(qwen3_4b), devices=devices(1, 80))
    rollout = plan.devices[0].phases["rollout"]
    # 128 rows x (1024 prompt + 3000 new) positions, no KV budget: 70.7 GiB per bf16 model
    per_model = 128 * 4024 * (36 * 8 * 128 * 2 * 2)
    assert rollout["kv_cache_junior"] == per_model
    assert round(per_model / GiB, 1) == 70.7
    # under bf16-mixed the senior's float32 k_norm weight makes its keys float32: 1.5 x
    assert rollout["kv_cache_senior"] == per_model * 3 // 2
    assert not plan.fits
    assert any("model.junior_device (cuda:1)" in p for p in plan.problems)
    named = {o.split("=")[0] for f in plan.fixes for o in f.overrides}
    assert "module.max_tokens_per_micro_batch" in named
    assert plan.together is not None and plan.together.fits


def test_with_budgets_fsdp2_over_two_80_gib_cards_fits(qwen3_4b: str) -> None:
    plan = make_plan(paper(qwen3_4b, *SHARDED, *BUDGETS), devices=devices(2, 80))
    assert plan.fits, [(d.name, d.peak / GiB) for d in plan.devices]
    d = plan.devices[0]
    assert d.peak <= d.usable < d.capacity
    # 64 rows a rank: the budget holds 28 rows of both models' caches at once
    assert d.phases["rollout"]["kv_cache_senior"] == 28 * 4024 * 36 * 8 * 128 * 2 * 2


def test_the_fixes_a_plan_names_fit_when_composed(qwen3_4b: str) -> None:
    plan = make_plan(paper(qwen3_4b), devices=devices(2, 80))
    assert not plan.fits and plan.together is not None and plan.together.fits
    groups = {p.name for p in CONF.iterdir() if p.is_dir()}
    overrides = [o if o.split("=")[0] in groups else f"++{o}" for o in plan.together.overrides]
    fixed = make_plan(paper(qwen3_4b, *overrides), devices=devices(2, 80))
    assert fixed.fits and fixed.peak == plan.together.peak


def test_a_run_that_cannot_fit_is_refused_with_the_figures(qwen3_4b: str) -> None:
    cfg = paper(qwen3_4b)
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
            *(f"model.name_or_path={qwen3_4b}", "--devices", "2x80"),
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
    assert result["devices"][1]["phases"]["rollout"]["kv_cache_junior"] == pytest.approx(70.734)
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


@pytest.mark.parametrize("mode", ["float32", "bfloat16", "autocast"])
def test_layer_coefficients_match_what_autograd_saves(mode: str, tmp_path: Path) -> None:
    """Saved-tensor bytes of one decoder layer per token, for a packed forward through
    tandem.modules.logprobs, against ``layer_bytes_per_token`` and the mask's bias."""
    from transformers import Qwen3Config

    from tandem.modules.logprobs import pack, packed_logprobs

    def config(layers: int) -> Qwen3Config:
        return Qwen3Config(
            hidden_size=96,
            intermediate_size=304,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=40,
            vocab_size=300,
            tie_word_embeddings=True,
        )

    saved = {n: _saved_bytes(config(n), mode, pack, packed_logprobs) for n in (1, 2)}
    config(2).save_pretrained(tmp_path)
    shape = model_shape(str(tmp_path))
    tokens = 3 * 20
    cb = 4 if mode == "float32" else 2
    expected = tokens * layer_bytes_per_token(shape, cb, mode == "autocast") + tokens**2 * cb
    assert saved[2] - saved[1] == expected


def _saved_bytes(config, mode: str, pack, packed_logprobs) -> int:
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
    packed = pack(ids, torch.ones_like(ids), 10)
    seen: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        # an autocast cast of a weight is the compute copy, counted once per weight elsewhere
        if storage.data_ptr() not in weights and tuple(t.shape) not in shapes:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast")
    with autocast, torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        packed_logprobs(model, packed, [0.6], chunk_tokens=16)
    return sum(seen.values())
