"""``trainer=fsdp`` end to end on 2 CPU processes (gloo): Tandem RL with the senior sharded per
decoder layer, distributed checkpoints, SIGKILL and resume, the gathered export, evaluation, the
same senior as ``trainer=ddp``, and the same run with rollouts read layer by layer.

Five training runs of 3 steps are shared by the tests (a module fixture): straight, the same
killed inside step 2 and resumed, ``trainer=ddp``, and ``rollout_gather=per_layer``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tandem.assets import TINY_WORLD
from tandem.evaluate import run as evaluate
from tandem.modules.export import export_checkpoint, load_checkpoint_file
from tandem.runs.checkpoints import is_distributed_checkpoint, newest_verified, verify
from tests.modules.test_train import TINY, cli, metrics_rows

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
MAX_NEW_TOKENS = int(next(o for o in TINY if o.startswith("generation.max_new")).split("=")[1])
COMMON = [f"trainer.max_steps={STEPS}", "threads=1", "checkpoint_every_n_steps=1"]


def train(
    out: Path, *overrides: str, fault: str | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TANDEM_FAULT", None)
    if fault:
        env["TANDEM_FAULT"] = fault
    command = cli(out, *COMMON, *overrides)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fsdp")
    out = {name: root / name for name in ("fsdp", "killed", "ddp", "per_layer")}
    for name, strategy in (("fsdp", "trainer=fsdp"), ("ddp", "trainer=ddp")):
        result = train(out[name], strategy)
        assert result.returncode == 0, result.stderr[-3000:]
    # ranks out of step would wait on each other's collectives: a hang fails here (the run
    # takes about 25 s alone on 2 cores)
    per_layer = ("trainer=fsdp", "trainer.strategy.rollout_gather=per_layer")
    result = train(out["per_layer"], *per_layer, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # every rank kills itself inside step 2, after its optimizer step: step 1 survives
    killed = train(out["killed"], "trainer=fsdp", fault="update@2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert newest_verified(out["killed"] / "checkpoints").name == "step-1.ckpt"
    resumed = train(out["killed"], "trainer=fsdp", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return out


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_sharded_run_trains_and_writes_verified_distributed_checkpoints(
    runs, tmp_path: Path
) -> None:
    out = runs["fsdp"]
    rows = [r for r in metrics_rows(out) if r.get("train/reward")]
    assert len(rows) == STEPS
    assert all(0.0 < float(r["train/senior_share"]) < 1.0 for r in rows), "a tandem run"
    last = newest_verified(out / "checkpoints")
    assert last.name == f"step-{STEPS}.ckpt" and is_distributed_checkpoint(last)
    state = load_checkpoint_file(last)
    keys = state["state_dict"].keys()
    assert keys and all(k.startswith("senior.") for k in keys), "the junior is never saved"
    optimized = state["optimizer_0"]["state"].keys()
    assert optimized and all(k.startswith("senior.") for k in optimized), "nor optimized"
    shards = sorted(p.name for p in last.glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"], "one file of shards per rank"
    # a changed shard fails the folder's checksum (on a copy: the other tests read this one)
    copy = tmp_path / last.name
    shutil.copytree(last, copy)
    shutil.copy(last.with_name(f"{last.name}.sha256"), tmp_path)
    assert verify(copy) is None
    data = bytearray((copy / shards[1]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / shards[1]).write_bytes(bytes(data))
    assert "does not match its checksum" in verify(copy)


def test_export_is_the_whole_gathered_senior(runs) -> None:
    folder = runs["fsdp"] / "senior"
    model = AutoModelForCausalLM.from_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(TINY_WORLD)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    trained, start = model.state_dict(), base.state_dict()
    assert {k: v.shape for k, v in trained.items()} == {k: v.shape for k, v in start.items()}
    assert any(not torch.equal(trained[k], start[k]) for k in start), "the senior moved"
    # the distributed checkpoint of the last step, put together offline, is that same senior
    again = export_checkpoint(
        runs["fsdp"] / "checkpoints" / f"step-{STEPS}.ckpt", folder.parent / "x"
    )
    a, b = weights(folder), weights(again)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigkill_and_resume_give_the_straight_senior(runs) -> None:
    a, b = weights(runs["fsdp"] / "senior"), weights(runs["killed"] / "senior")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_ddp_reaches_the_same_senior(runs) -> None:
    a, b = weights(runs["fsdp"] / "senior"), weights(runs["ddp"] / "senior")
    base = weights(TINY_WORLD)
    for k in a:
        moved = (a[k] - base[k]).abs().max()
        # the two reduce gradients in different orders: equal up to float rounding
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=f"{k} moved {moved}")


def test_per_layer_rollouts_train_the_same_senior(runs) -> None:
    whole, per_layer = metrics_rows(runs["fsdp"]), metrics_rows(runs["per_layer"])
    train_rows = [r for r in per_layer if r.get("train/reward")]
    lengths = [float(r["train/response_length"]) for r in train_rows]
    # rows ended at different steps (EOS before max_new_tokens), so ranks finished apart
    assert len(train_rows) == STEPS and min(lengths) < MAX_NEW_TOKENS, lengths
    assert any(r.get("val/tandem/accuracy") for r in per_layer), "validation generated too"
    assert len(whole) == len(per_layer)
    for a, b in zip(whole, per_layer, strict=True):
        keys = [k for k in a if a[k] and not k.startswith("time/")]
        assert keys == [k for k in b if b[k] and not k.startswith("time/")]
        # the same rollouts: the same rewards, lengths, shares, losses and validation figures
        assert [float(b[k]) for k in keys] == pytest.approx([float(a[k]) for k in keys]), keys
    a, b = weights(runs["fsdp"] / "senior"), weights(runs["per_layer"] / "senior")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], msg=k)


def test_evaluate_reads_the_export_and_the_distributed_checkpoint(runs, tmp_path: Path) -> None:
    quick = ["threads=1", "aim=false", "progress=false", "eval.tiny.limit=2", "eval.tiny.n=2"]
    quick += ["eval.tiny.ks=[1,2]", "eval.tiny.max_new_tokens=32", "handoff=false"]
    conf = str(ROOT / "conf")
    results = {}
    for name, senior in (
        ("export", runs["fsdp"] / "senior"),
        ("ckpt", runs["fsdp"] / "checkpoints" / f"step-{STEPS}.ckpt"),
    ):
        overrides = [f"senior={senior}", "junior=tiny", f"output_dir={tmp_path / name}", *quick]
        with initialize_config_dir(config_dir=conf, version_base="1.3"):
            results[name] = evaluate(compose("evaluate", overrides=overrides))["sets"]["tiny"]
    assert results["export"]["drift/kl"] > 0, "the trained senior drifted from its base"
    # the same senior read two ways: the same tables
    assert results["export"] == pytest.approx(results["ckpt"])


@pytest.mark.slow
def test_kills_in_the_checkpoint_and_the_export_of_a_sharded_run(runs, tmp_path: Path) -> None:
    out = tmp_path / "killed"
    # rank 0 dies with step 2's shards and checksums written, before the folder is renamed
    r = train(out, "trainer=fsdp", fault="checkpoint@2")
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    left = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert any(name.startswith("step-2.ckpt.tmp-") for name in left), left
    assert "step-2.ckpt" not in left and newest_verified(out / "checkpoints").name == "step-1.ckpt"
    # resumed from step 1, killed while the gathered senior is written
    r = train(out, "trainer=fsdp", "ckpt_path=last", fault=f"export@{STEPS}")
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    assert not (out / "senior").exists(), "a half export is never under the final name"
    r = train(out, "trainer=fsdp", "ckpt_path=last")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not [p for p in (out / "checkpoints").iterdir() if ".tmp-" in p.name]
    a, b = weights(runs["fsdp"] / "senior"), weights(out / "senior")
    assert all(torch.equal(a[k], b[k]) for k in a)
