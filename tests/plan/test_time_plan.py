"""The time plan of whole configs (tandem.plan.time): phases by hand where they are one formula,
what must grow with what, the offload and vLLM readings, and the CLI's table and JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from tandem.errors import ConfigError
from tandem.plan import make_plan
from tandem.plan.devices import LINK_SHARE, named
from tandem.plan.time import TimePlan, make_time_plan, plan_time
from tandem.plan.time_settings import TimeSettings, offload_mode, vllm_levers
from tandem.plan.time_trainer import micro_batches
from tests.paper_layouts import AUTHORS

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
QWEN3_4B_PARAMS = 4_022_468_096


def config(*overrides: str, name: str = "reproduce_paper"):
    """``name`` composed; ``reproduce_paper`` in the authors' layout, as these figures are."""
    layout = AUTHORS if name == "reproduce_paper" else ()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, [*layout, *overrides])


def timed(*overrides: str, kind: str = "a100", count: int = 2) -> TimePlan:
    cfg = config(*overrides)
    device = named(kind)
    devices = tuple((f"cuda:{i}", device.memory) for i in range(count))
    return make_time_plan(cfg, make_plan(cfg, devices=devices, fixes=False), device)


def test_the_papers_packs_are_two_rows_of_one_prompt_under_the_budget() -> None:
    cfg = config()
    s = make_plan(cfg, devices=(("cuda:0", 80 * 2**30),) * 2, fixes=False).settings
    packs = micro_batches(s, TimeSettings(max_steps=1))
    # 128 rows of 1,024 + 3,000 tokens, two mini-batches, 10,000 tokens a pack
    assert len(packs) == 64 and {p.rows for p in packs} == {2}
    # the two rows of a pack answer one prompt (groups of 8): it is read once
    assert {p.read for p in packs} == {2 * 3000 + 1024} and {p.head for p in packs} == {6000}
    assert packs[0].pairs == 2 * 4024 * 4025 / 2
    assert sum(p.last for p in packs) == 2 and packs[31].last and packs[-1].last


def test_the_between_phases_offload_moves_the_shards_and_adam_state_twice() -> None:
    plan = timed("experiment=paper/trl", "++trainer.strategy.offload=between_phases")
    a100 = named("a100")
    # float32 weights and two AdamW moments, in before the rollout and out after the step
    hand = 2 * QWEN3_4B_PARAMS * 4 * 3 / (a100.host_link * LINK_SHARE)
    assert plan.phases["offload"] == {"moves": pytest.approx(hand)}
    assert "adamw" in plan.phases["step"] and "adamw_host" not in plan.phases["step"]
    # the vLLM pair's rollout holds no shard: the shards go out and in once more
    pair = timed("experiment=paper/trl", "module.backend.name=vllm")
    trip = 2 * QWEN3_4B_PARAMS * 4 / (a100.host_link * LINK_SHARE)
    assert pair.phases["offload"]["moves"] == pytest.approx(hand + trip)


def test_the_step_and_the_run_add_up() -> None:
    plan = timed("experiment=paper/trl")
    assert plan.step_s == pytest.approx(sum(sum(t.values()) for t in plan.phases.values()))
    assert plan.run_h == pytest.approx(plan.step_s * 300 / 3600)
    assert set(plan.phases) >= {"rollout", "old_logprobs", "update", "step", "offload"}
    # the shipped layout (verl's offload) steps AdamW on the device; FSDP2's CPU offload steps
    # it on the host, and says so
    assert "adamw" in plan.phases["step"] and not any("host:" in n for n in plan.notes)
    fsdp = timed("experiment=paper/trl", "trainer.strategy.offload=fsdp")
    assert "adamw_host" in fsdp.phases["step"] and any("host:" in n for n in fsdp.notes)
    assert fsdp.phase_s("step") > 10 * plan.phase_s("step")


def test_more_tokens_take_more_seconds_in_every_phase() -> None:
    short = timed("generation.max_new_tokens=1000")
    long = timed("generation.max_new_tokens=2000")
    for phase in ("rollout", "old_logprobs", "update"):
        assert long.phase_s(phase) > short.phase_s(phase), phase
    # a mean response length shortens the trainer's passes, not the decode to the longest row
    cfg = config()
    memory = make_plan(cfg, devices=(("cuda:0", 80 * 2**30),) * 2, fixes=False)
    mean = make_time_plan(cfg, memory, named("a100"), response_tokens=1000)
    bound = make_time_plan(cfg, memory, named("a100"))
    assert mean.phase_s("update") < bound.phase_s("update")
    assert mean.phase_s("rollout") == pytest.approx(bound.phase_s("rollout"))


def test_checkpointing_recomputes_and_offloading_moves() -> None:
    base = ("trainer=fsdp_gpu", "trainer.devices=1", "model.junior_device=null")
    plain = timed(*base, "trainer.strategy.activation_checkpointing=false")
    again = timed(*base, "trainer.strategy.activation_checkpointing=true")
    assert "recompute" not in plain.phases["update"] and again.phases["update"]["recompute"] > 0
    assert again.phase_s("update") > plain.phase_s("update")
    assert "offload" not in plain.phases
    for mode in ("fsdp", "between_phases"):
        moved = timed(*base, f"++trainer.strategy.offload={mode}")
        assert moved.phase_s("offload") > 0 and moved.step_s > plain.step_s, mode


def test_the_junior_reading_along_costs_rollout_time() -> None:
    grpo, trl = timed("experiment=grpo"), timed("experiment=paper/trl")
    assert trl.phase_s("rollout") > 1.5 * grpo.phase_s("rollout")
    assert trl.phase_s("update") == pytest.approx(grpo.phase_s("update"))


def test_faster_devices_take_less_time_and_more_devices_share_the_rows() -> None:
    a100, h100 = timed(kind="a100"), timed(kind="h100")
    assert h100.phase_s("update") < a100.phase_s("update")
    sharded = ("trainer=fsdp_gpu", "model.junior_device=null", "++generation.kv_cache_gib=32")
    one = timed(*sharded, "trainer.devices=1")
    two = timed(*sharded, "trainer.devices=2")
    assert two.phase_s("update") < one.phase_s("update")
    assert two.phases["update"].get("collectives", 0) >= 0


def test_vllm_decodes_graph_captured_and_sleeps_on_gpus() -> None:
    vllm = ("module.backend.name=vllm", "+module.backend.dtype=bfloat16")
    graphs = timed(*vllm, "+module.backend.engine_args.gpu_memory_utilization=0.5")
    rollout = graphs.phases["rollout"]
    assert "dispatch" not in rollout and rollout["vllm_host"] > 0
    assert rollout["vllm_wake"] == pytest.approx(rollout["vllm_sleep"]) and rollout["vllm_wake"] > 0
    assert graphs.phases["weight_sync"]["sync"] > 0
    eager = timed(
        *vllm,
        "+module.backend.engine_args.gpu_memory_utilization=0.5",
        "+module.backend.engine_args.enforce_eager=true",
        "+module.backend.sleep=false",
    )
    assert eager.phases["rollout"]["vllm_host"] > rollout["vllm_host"]
    assert "vllm_wake" not in eager.phases["rollout"]


def test_the_offload_and_vllm_readings() -> None:
    assert offload_mode({}) == "none"
    assert offload_mode({"offload": "fsdp"}) == "fsdp"
    assert offload_mode({"offload": "between_phases"}) == "between_phases"
    with pytest.raises(ConfigError, match=r"'sometimes'.*none, fsdp, between_phases"):
        offload_mode({"offload": "sometimes"})
    # the older spelling: true is FSDP2's CPU offload, false leaves any other layout as it is
    assert offload_mode({"offload": "none", "cpu_offload": True}) == "fsdp"
    assert offload_mode({"offload": "between_phases", "cpu_offload": False}) == "between_phases"
    assert offload_mode({"offload": "between_phases", "cpu_offload": None}) == "between_phases"
    for contradiction in ({"offload": "fsdp", "cpu_offload": False},
                          {"offload": "between_phases", "cpu_offload": True}):  # fmt: skip
        with pytest.raises(ConfigError, match=r"cpu_offload .* contradicts"):
            offload_mode(contradiction)
    # the shipped paper layout takes the older key as a device override, and keeps its layout
    kept = config("trainer.strategy.cpu_offload=false")
    assert config().trainer.strategy.cpu_offload is None
    memory = make_plan(kept, devices=(("cuda:0", 80 * 2**30),) * 2, fixes=False)
    assert memory.settings.offload == "between_phases"
    assert vllm_levers({}, gpu=True) == (True, True)
    assert vllm_levers({}, gpu=False) == (False, False)
    assert vllm_levers({"engine_args": {"enforce_eager": True}, "sleep": False}, gpu=True) == (
        False,
        False,
    )


def test_a_cpu_plan_is_timed_on_the_probed_cpu() -> None:
    cfg = config("module.old_logprobs=trainer", name="train")
    memory = make_plan(cfg, 1, devices=(("cpu", 8 * 2**30),), fixes=False)
    plan = make_time_plan(cfg, memory)
    assert plan.device.kind == "cpu" and plan.device.source == "probe_cpu"
    assert {"rollout", "old_logprobs", "update", "step"} == set(plan.phases)
    # one process, no link: nothing to offload or gather
    assert plan.phases["rollout"]["dispatch"] > 0 and "offload" not in plan.phases
    fewer = plan_time(
        replace(memory.settings, max_new_tokens=80), TimeSettings(max_steps=60), plan.device
    )
    assert fewer.phase_s("rollout") < plan.phase_s("rollout")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tandem.plan", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_cli_prints_the_time_table_and_its_json_fields() -> None:
    out = run_cli("--config-name", "reproduce_paper", "--devices", "2xh100", "experiment=grpo")
    assert out.returncode == 0, out.stderr
    assert "Time plan, computed (2 x H100 80 GB SXM5" in out.stdout
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["fits"] is True and result["devices"][0]["capacity_gib"] == 80.0
    phases = result["phase_s"]
    assert {"rollout", "update", "step"} <= set(phases)
    assert result["step_s"] == pytest.approx(sum(phases.values()), abs=1e-3)
    assert result["run_h"] == pytest.approx(result["step_s"] * 300 / 3600, rel=1e-3)
    assert result["time"]["device"] == "h100" and result["time"]["terms_s"]["rollout"]


def test_the_cli_refuses_a_device_it_does_not_know() -> None:
    out = run_cli("--config-name", "reproduce_paper", "--devices", "2xb200")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "'2xb200'" in out.stderr and "a100, h100, h200" in out.stderr
    # sizes alone plan memory only for a GPU config: the kind is asked for
    out = run_cli("--config-name", "reproduce_paper", "--devices", "2x80")
    assert out.returncode == 0 and "no time plan: name the GPUs' kind" in out.stdout
    assert json.loads(out.stdout.strip().splitlines()[-1])["step_s"] is None


def test_the_torch_engines_decode_on_a_gpu_is_the_hosts_dispatch() -> None:
    plan = timed("experiment=paper/trl")
    rollout = plan.phases["rollout"]
    # each decode step dispatches both 36-layer models' ops and the engine's, 10 us each on the
    # host, which the cards (the junior on its own) do not keep up with: 2 passes of 64 rows
    host = (2 * (76 * 36 + 34) + 290) * 10e-6
    steps = 2 * 2999
    assert rollout["decode"] + rollout["dispatch"] + rollout["sampling"] == pytest.approx(
        steps * host, rel=0.01
    )
    assert rollout["dispatch"] > rollout["decode"]
