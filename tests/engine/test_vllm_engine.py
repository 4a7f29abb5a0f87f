"""What the vLLM backend decides before any engine starts; no vLLM needed.

Where it runs (``engine_setup``: the model runner, CUDA graphs, sleep mode, seeds, one engine
per rank, and what it refuses), which pairs one engine can hold (``pair_refusal``), and the
torch engine standing in where vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest
from transformers import AutoConfig

from tandem.assets import TINY_WORLD
from tandem.engine import SENIOR, TorchBackend, build_backend, vllm_engine
from tandem.engine import backend as backend_module
from tandem.engine.vllm_engine import engine_setup
from tandem.engine.vllm_pair import pair_refusal

ONE = {"world": 1, "rank": 0, "local_rank": 0}


def test_on_the_cpu_the_engine_is_eager_v1_without_sleep_seeded_per_batch():
    setup = engine_setup(gpu=False, **ONE)
    assert not setup.v2 and not setup.sleep and setup.seeds == "batch"
    assert setup.args == {"enforce_eager": True, "kv_cache_memory_bytes": 2**30}
    assert setup.env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert any("eager on the CPU" in note for note in setup.notes)


def test_on_gpus_cuda_graphs_and_sleep_are_on_and_v1_is_chosen_by_code():
    setup = engine_setup(gpu=True, **ONE)
    assert "enforce_eager" not in setup.args, "CUDA graphs are vLLM's default"
    assert setup.args["enable_sleep_mode"] and setup.args["sleep_mode_offload_cudagraph"]
    assert setup.sleep and not setup.v2 and setup.seeds == "batch"
    assert setup.env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert any("VLLM_USE_V2_MODEL_RUNNER=0" in note for note in setup.notes)
    v2 = engine_setup(gpu=True, model_runner="v2", **ONE)
    assert v2.v2 and v2.seeds == "request" and v2.env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    # the user's engine arguments win: eager wanted, so no CUDA graphs to back up in sleep
    eager = engine_setup(gpu=True, engine_args={"enforce_eager": True}, sleep=False, **ONE)
    assert eager.args == {"enforce_eager": True} and not eager.sleep


def test_the_choices_are_said_once_a_process(caplog, monkeypatch):
    monkeypatch.setattr(vllm_engine, "_said", set())
    with caplog.at_level(logging.INFO, logger="tandem.engine.vllm_backend"):
        for _ in range(3):  # three engines started
            vllm_engine.say_once(engine_setup(gpu=False, **ONE).notes)
    said = [r.getMessage() for r in caplog.records]
    eager = "eager on the CPU (no compile, no CUDA graphs), no sleep mode"
    assert sum(eager in m for m in said) == 1
    assert len(said) == len(set(said)) == len(engine_setup(gpu=False, **ONE).notes)


def test_every_rank_runs_its_own_engine_under_a_multi_process_trainer():
    setup = engine_setup(gpu=False, world=2, rank=1, local_rank=1)
    assert setup.args["distributed_executor_backend"] == "external_launcher"
    assert setup.env["RANK"] == "1" and setup.env["WORLD_SIZE"] == "2"
    assert "distributed_executor_backend" not in engine_setup(gpu=False, **ONE).args


def test_parallel_engines_and_impossible_levers_are_refused_at_once():
    with pytest.raises(ValueError) as refused:
        engine_setup(
            gpu=False,
            engine_args={"tensor_parallel_size": 2, "pipeline_parallel_size": 2},
            model_runner="v2",
            sleep=True,
            **ONE,
        )
    said = str(refused.value)
    for key in ("tensor_parallel_size (2) must be 1", "pipeline_parallel_size (2)", "v2", "sleep"):
        assert key in said, said
    with pytest.raises(ValueError, match="seeds='batch' needs the V1 runner"):
        engine_setup(gpu=True, model_runner="v2", seeds="batch", **ONE)


def tiny(**changes) -> dict:
    config = AutoConfig.from_pretrained(TINY_WORLD).to_dict()
    return config | changes


def test_one_engine_holds_any_pair_whose_kv_pages_share_a_block_table():
    senior = tiny()
    smaller = tiny(num_hidden_layers=2, hidden_size=96, num_key_value_heads=1, head_dim=32)
    other = {"architectures": ["LlamaForCausalLM"], "vocab_size": 1110}
    for junior in (smaller, tiny(rope_parameters={"rope_theta": 1e6}), other):
        assert pair_refusal(senior, junior, 512) is None
    sliding = tiny(layer_types=["sliding_attention"] * 4, sliding_window=64)
    assert "cannot share one block table" in pair_refusal(senior, sliding, 512)
    assert "vocab_size differs (senior 1110, junior 1200)" in pair_refusal(
        senior, tiny(vocab_size=1200), 512
    )
    short = pair_refusal(senior, tiny(max_position_embeddings=256), None)
    assert "max_position_embeddings (256) is below the engine's max_model_len (512)" in short
    assert pair_refusal(senior, tiny(max_position_embeddings=256), 256) is None


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_falls_back_to_torch_once(senior, prompts, tokenizer, caplog, monkeypatch):
    monkeypatch.setattr(backend_module, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="tandem.engine.backend"):
        first = build_backend("vllm", senior, None, tokenizer, sync_every=2)
        second = build_backend("vllm", senior, None, tokenizer)
    assert isinstance(first, TorchBackend) and isinstance(second, TorchBackend)
    warnings = [r for r in caplog.records if "vLLM is not installed" in r.getMessage()]
    assert len(warnings) == 1, "the fallback must be said once, not at every build"
    r = first.generate(prompts[:2], None, None)
    assert r.junior_logprobs is None and (r.authors[r.mask] == SENIOR).all()
    first.sync(senior, 7)
    first.sleep()  # nothing to free: a no-op
    assert first.weights_step == 7
