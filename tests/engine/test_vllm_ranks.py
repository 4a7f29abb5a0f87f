"""One vLLM engine per rank under ``trainer=fsdp`` on 2 CPU processes (runs where vLLM is
installed, in ``.ci/vllm``): Tandem RL with ``module.backend.name=vllm`` trains 3 steps, each
rank sampling its own prompts in its own pair engine (vLLM's ``external_launcher``) with the
senior's weights gathered from the DTensor shards; a run SIGKILLed inside step 2 and resumed
ends at the straight run's senior; and every rollout each rank sampled is the sampler's replay
with that rollout's coins.

Three training runs (straight, killed, resumed) are shared by the tests (a module fixture);
``tests/engine/vllm_ranks_main.py`` saves each rank's rollouts as it samples them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.modules.test_train import TINY

pytest.importorskip("vllm", reason="vLLM is not installed (see .ci/vllm)")

from tandem.engine.vllm_backend import VLLMBackend
from tandem.runs.checkpoints import newest_verified
from tests.engine.test_vllm_pair import replay

ROOT = Path(__file__).resolve().parents[2]
MAIN = Path(__file__).with_name("vllm_ranks_main.py")
STEPS = 3
COMMON = [
    f"trainer.max_steps={STEPS}",
    "threads=1",
    "trainer=fsdp",
    "module.backend.name=vllm",
    "+module.backend.max_model_len=512",
    "+module.backend.kv_cache_gib=0.125",
]


def train(
    out: Path, tag: str, *overrides: str, fault: str | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TANDEM_ROLLOUTS": str(out / tag)}
    env.pop("TANDEM_FAULT", None)
    if fault:
        env["TANDEM_FAULT"] = fault
    env.setdefault("VLLM_HOST_IP", "127.0.0.1")
    command = [sys.executable, str(MAIN), *TINY, f"hydra.run.dir={out}", f"output_dir={out}"]
    command += [*COMMON, *overrides]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vllm_ranks")
    out = {"straight": root / "straight", "killed": root / "killed"}
    straight = train(out["straight"], "rollouts")
    assert straight.returncode == 0, straight.stderr[-3000:]
    # every rank kills itself inside step 2, after its optimizer step: step 1 survives
    killed = train(out["killed"], "before", fault="update@2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert newest_verified(out["killed"] / "checkpoints").name == "step-1.ckpt"
    resumed = train(out["killed"], "rollouts", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return out


def saved(out: Path, rank: int) -> list[dict]:
    files = sorted(
        (out / "rollouts").glob(f"rank{rank}-*.pt"), key=lambda f: int(f.stem.split("-")[1])
    )
    return [torch.load(f, weights_only=False) for f in files]


def test_each_rank_samples_its_own_rollouts_in_its_own_engine(runs) -> None:
    out = runs["straight"]
    # each process's log (Hydra's, and Lightning's second process's own)
    said = (out / "train.log").read_text() + (out / "train_ddp_process_1.log").read_text()
    for rank in (0, 1):
        assert f"one engine per rank: rank {rank} of 2 (external_launcher)" in said
    records = {rank: saved(out, rank) for rank in (0, 1)}
    tandem = {r: [x for x in records[r] if not x["sampler"].solo] for r in (0, 1)}
    # the training steps' rollouts (validation passes run greedy and solo besides)
    assert len(tandem[0]) >= STEPS and len(tandem[0]) == len(tandem[1])
    for rank in (0, 1):
        for record in records[rank]:
            r, sampler, params = record["rollouts"], record["sampler"], record["params"]
            authors, _ = replay(sampler, r, params)
            assert torch.equal(r.authors, authors), f"rank {rank}: an author is not the replay's"
        steps = [x["step"] for x in tandem[rank]]
        assert steps == sorted(steps) and steps[-1] >= 1, "the senior's weights were synced"
    for a, b in zip(tandem[0], tandem[1], strict=True):
        assert a["params"].seed != b["params"].seed, "each rank draws its own coins"
        assert not torch.equal(a["rollouts"].prompt_tokens, b["rollouts"].prompt_tokens)
    assert any(x["rollouts"].junior_mask.any() for x in tandem[0]), "a tandem run"


def test_sigkill_and_resume_give_the_straight_senior(runs) -> None:
    a = load_file(str(runs["straight"] / "senior" / "model.safetensors"))
    b = load_file(str(runs["killed"] / "senior" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # what the resumed run sampled (steps 2 and 3, the last validation), the straight run
    # sampled with the same seeds and weights, on both ranks
    for rank in (0, 1):
        straight = {key(x): x for x in saved(runs["straight"], rank)}
        resumed = saved(runs["killed"], rank)
        assert any(not x["sampler"].solo and x["step"] == 2 for x in resumed)
        for x in resumed:
            same = straight[key(x)]["rollouts"]
            assert torch.equal(x["rollouts"].tokens, same.tokens)
            assert torch.equal(x["rollouts"].authors, same.authors)


def key(record: dict) -> tuple:
    """What makes a rollout call: its seed, the weights' step, the sampler, the prompts."""
    prompts = record["rollouts"].prompt_tokens
    return (record["params"].seed, record["step"], repr(record["sampler"]), prompts.shape)


def test_tensor_parallel_engines_are_refused_before_any_starts(junior_folder, tokenizer):
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(2\) must be 1"):
        VLLMBackend("tiny", junior_folder, tokenizer, engine_args={"tensor_parallel_size": 2})
