"""The memory plan's vLLM engine in sleep mode (``_vllm_engine`` in ``tandem/plan/memory.py``):
the backend's default on GPUs sleeps through the trainer's phases, so its share of the device is
planned in the rollout only, and said."""

from __future__ import annotations

from tandem.plan import GiB, make_plan
from tests.test_plan import VLLM, devices, paper, qwen3_4b  # noqa: F401 (a fixture)

SHARE = "+module.backend.engine_args.gpu_memory_utilization=0.5"


def test_a_sleeping_vllm_engine_holds_its_share_in_the_rollout_only(qwen3_4b: str) -> None:  # noqa: F811
    asleep = make_plan(paper(qwen3_4b, *VLLM, SHARE), devices=devices(2, 80))
    awake = make_plan(
        paper(qwen3_4b, *VLLM, SHARE, "+module.backend.sleep=false"), devices=devices(2, 80)
    )
    share = int(0.5 * 80 * GiB)
    for plan in (asleep, awake):
        assert plan.devices[0].phases["rollout"]["vllm_engine"] == share
    phases = [p for p in asleep.devices[0].phases if p != "rollout"]
    assert phases, "the plan has phases besides the rollout"
    for phase in phases:
        assert "vllm_engine" not in asleep.devices[0].phases[phase], phase
        assert awake.devices[0].phases[phase]["vllm_engine"] == share, phase
        held = awake.devices[0].total(phase) - asleep.devices[0].total(phase)
        assert held == share, phase
    assert any("vLLM sleeps while the trainer updates" in n for n in asleep.notes)
    assert not any("vLLM sleeps" in n for n in awake.notes)
