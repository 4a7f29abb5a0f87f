"""The training job end to end on the tiny world: outputs, junior isolation, exact resume."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from tandem.assets import TINY_WORLD
from tandem.provenance import run_commits
from tandem.runs import RunRefused
from tandem.train import run

CONF = str(Path(__file__).resolve().parents[2] / "conf")
TINY = [
    "+data.sizes={train:64,validation:8}",
    "batch_size=8",
    "group_size=4",
    "generation.max_new_tokens=24",
    "validation.every_n_steps=2",
    "validation.size=4",
    "logger=csv",
    "checkpoint_every_n_steps=1",
    "module.optimizer.lr=1e-3",
    # 24 tokens cannot reach an answer, so rewards are all 0 and GRPO's advantages vanish;
    # the imitation term keeps a gradient flowing so that these runs move the senior
    "module.loss.lambda_jun=0.1",
    "trainer.enable_progress_bar=false",
]


def config(out: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("train", overrides=[*TINY, f"output_dir={out}", *overrides])


def senior_weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def metrics_rows(out: Path) -> list[dict[str, str]]:
    (path,) = out.glob("csv/version_*/metrics.csv")
    with path.open() as f:
        return list(csv.DictReader(f))


def test_tiny_run_trains_the_senior_only(tmp_path: Path) -> None:
    run(config(tmp_path, "trainer.max_steps=2"))
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    keys = ckpt["state_dict"].keys()
    assert keys and all(k.startswith("senior.") for k in keys), "only the senior is saved"
    (opt,) = ckpt["optimizer_states"]
    n_senior = sum(1 for k in keys if not k.endswith("lm_head.weight"))
    assert len(opt["param_groups"][0]["params"]) == n_senior, "the junior is never optimized"
    assert ckpt["global_step"] == 2
    base, trained = senior_weights(TINY_WORLD), senior_weights(tmp_path / "senior")
    assert base.keys() == trained.keys()
    assert any(not torch.equal(base[k], trained[k]) for k in base), "the senior moved"
    rows = [r for r in metrics_rows(tmp_path) if r.get("train/reward")]
    assert len(rows) == 2
    for row in rows:
        assert 0.0 < float(row["train/senior_share"]) < 1.0, "word sampler at p=0.5"
        assert float(row["train/handoffs_per_rollout"]) > 0
        for key in (
            "train/loss",
            "train/clip_fraction",
            "train/kl",
            "time/generate",
            "time/reward",
            "time/update",
            "time/tokens_per_second",
            "train/lr",
        ):
            assert row[key] != "", key
    val = [r for r in metrics_rows(tmp_path) if r.get("val/tandem/accuracy")]
    assert val and 0.0 <= float(val[-1]["val/solo/accuracy"]) <= 1.0


def test_resume_gives_the_same_senior_as_a_straight_run(tmp_path: Path) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(config(straight, "trainer.max_steps=4"))
    run(config(resumed, "trainer.max_steps=2"))
    run(config(resumed, "trainer.max_steps=4", "ckpt_path=last"))
    a, b = senior_weights(straight / "senior"), senior_weights(resumed / "senior")
    base = senior_weights(TINY_WORLD)
    assert any(not torch.equal(a[k], base[k]) for k in a), "the runs must move the senior"
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # each start records the code it ran under
    assert [step for _, step in run_commits(resumed)] == [0, 2]
    assert [step for _, step in run_commits(straight)] == [0]


def test_several_updates_per_batch_of_rollouts(tmp_path: Path) -> None:
    run(
        config(
            tmp_path,
            "trainer.max_steps=1",
            "module.num_iterations=2",
            "module.mini_batches=2",
            "checkpoint_every_n_steps=100",
            # counted in training steps: the one batch is a validation's due
            "validation.every_n_steps=1",
        )
    )
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    # one batch of rollouts fed 2 passes x 2 mini-batches = 4 optimizer steps
    assert ckpt["global_step"] == 1
    assert ckpt["tandem_steps"]["optimizer_steps"] == 4
    (row,) = [r for r in metrics_rows(tmp_path) if r.get("train/reward")]
    # the second pass sees weights the first pass moved: the mean ratio leaves 1
    assert float(row["train/ratio_mean"]) != 1.0
    assert [r for r in metrics_rows(tmp_path) if r.get("val/tandem/accuracy")]


@pytest.mark.parametrize("sampler", ["solo", "sentence"])
def test_other_samplers_train(tmp_path: Path, sampler: str) -> None:
    run(config(tmp_path, "trainer.max_steps=1", f"sampler={sampler}"))
    (row,) = [r for r in metrics_rows(tmp_path) if r.get("train/reward")]
    share = float(row["train/senior_share"])
    assert share == 1.0 if sampler == "solo" else share <= 1.0


def cli(out: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tandem.train",
        *TINY,
        f"hydra.run.dir={out}",
        f"output_dir={out}",
        *overrides,
    ]


@pytest.mark.slow
def test_sigkill_then_resume_matches_a_straight_run(tmp_path: Path) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run(config(straight, "trainer.max_steps=6"))
    proc = subprocess.Popen(
        cli(killed, "trainer.max_steps=6"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    last = killed / "checkpoints" / "last.ckpt"

    def saved_step() -> int:
        # checkpoints are written atomically, so a file that exists is whole
        return torch.load(last, weights_only=False)["global_step"] if last.exists() else -1

    deadline = time.time() + 600
    while saved_step() < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 3 <= saved_step() < 6, "killed mid-run, after step 3 was saved"
    assert not (killed / "senior").exists(), "killed before the end"
    subprocess.run(
        cli(killed, "trainer.max_steps=6", "ckpt_path=last"),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    a, b = senior_weights(straight / "senior"), senior_weights(killed / "senior")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_ddp_on_two_cpu_processes(tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    result = subprocess.run(
        cli(out, "trainer=ddp", "trainer.max_steps=2"), capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [r for r in metrics_rows(out) if r.get("train/reward")]
    assert len(rows) == 2
    assert (out / "senior" / "model.safetensors").exists()
    base, trained = senior_weights(TINY_WORLD), senior_weights(out / "senior")
    assert any(not torch.equal(base[k], trained[k]) for k in base)


def aim_runs(repo: Path) -> list:
    """The runs of the Aim repository at ``repo``, indexed first so that their names and
    metrics can be read."""
    from aim import Repo
    from aim.sdk.index_manager import RepoIndexManager

    aim_repo = Repo.from_path(str(repo))
    indexer = RepoIndexManager.get_index_manager(aim_repo)
    for run_hash in aim_repo.list_all_runs():
        indexer.index(run_hash)
    return list(Repo.from_path(str(repo)).iter_runs())


def test_aim_logs_metrics_and_rollout_texts(tmp_path: Path, monkeypatch) -> None:
    repo = tmp_path / "aim"
    monkeypatch.setenv("TANDEM_AIM_REPO", str(repo))
    cfg = config(tmp_path / "run", "trainer.max_steps=1", "module.rollout_log_every=1")
    cfg.logger = compose_logger("aim")
    run(cfg)
    (aim_run,) = aim_runs(repo)
    names = {m.name for m in aim_run.metrics()}
    assert {"train/reward", "train/senior_share", "time/generate"} <= names
    texts = [name for name, _, _ in aim_run.iter_sequence_info_by_type("aim.text")]
    assert texts == ["rollouts"], "rollouts are logged as text"


def compose_logger(name: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("train", overrides=[f"logger={name}", "output_dir=/unused"]).logger


@pytest.mark.slow
def test_grpo_learns_a_fixed_set_of_prompts(tmp_path: Path) -> None:
    """The whole loop (rollouts, reward, advantages, masks, update) pushes reward up: on 8
    prompts seen every step, GRPO must raise the sampled accuracy well above the base's."""
    cfg = config(
        tmp_path,
        "experiment=grpo",
        "trainer.max_steps=24",
        "batch_size=64",
        "group_size=8",
        "generation.max_new_tokens=160",
        "module.loss.lambda_jun=0",
        "module.optimizer.lr=1e-4",
        "validation.every_n_steps=1000",
        "threads=1",
        "data.sizes={train:8,validation:8}",
    )
    run(cfg)
    rewards = [float(r["train/reward"]) for r in metrics_rows(tmp_path) if r.get("train/reward")]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.2, (first, last)


def test_kl_reg_arm_is_not_plain_grpo(tmp_path: Path) -> None:
    # solo rollouts: the junior writes nothing, but the KL penalty needs its log-probs, so it
    # must read along; without them the kl_reg arm trained exactly as grpo did
    common = ["trainer.max_steps=3", "generation.max_new_tokens=96", "validation.every_n_steps=99"]
    run(config(tmp_path / "grpo", "experiment=grpo", *common))
    run(config(tmp_path / "kl", "experiment=kl_reg", "module.loss.kl_beta=1.0", *common))
    grpo, kl = (
        senior_weights(tmp_path / "grpo" / "senior"),
        senior_weights(tmp_path / "kl" / "senior"),
    )
    base = senior_weights(TINY_WORLD)
    assert any(not torch.equal(grpo[k], base[k]) for k in base), "GRPO must move the senior"
    assert any(not torch.equal(grpo[k], kl[k]) for k in grpo), "the KL term changed nothing"
    rows = [r for r in metrics_rows(tmp_path / "kl") if r.get("train/reward")]
    assert rows and all(r.get("train/kl") not in (None, "") for r in rows)
    assert float(rows[-1]["train/kl"]) > 0.0


def test_resume_honours_a_new_lr_and_refuses_a_change_of_meaning(tmp_path: Path) -> None:
    fast = [
        "validation.every_n_steps=100",
        "module.scheduler.total_iters=4",
        "module.scheduler.start_factor=0.2",
    ]
    run(config(tmp_path, *fast, "trainer.max_steps=2"))
    run(
        config(tmp_path, *fast, "trainer.max_steps=3", "ckpt_path=last", "module.optimizer.lr=5e-4")
    )
    ckpt = torch.load(tmp_path / "checkpoints" / "step-3.ckpt", weights_only=False)
    # the optimizer trains with the new lr (3 steps into a 5-step warmup), not the restored one
    assert ckpt["lr_schedulers"][0]["base_lrs"] == [5e-4]
    assert ckpt["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(5e-4 * 4 / 5)
    with (tmp_path / "csv" / "version_1" / "metrics.csv").open() as f:  # the second start's
        (row,) = [r for r in csv.DictReader(f) if r.get("train/reward")]
    assert float(row["train/lr"]) == pytest.approx(5e-4 * 4 / 5)
    starts = json.loads((tmp_path / "run_info.json").read_text())["starts"]
    assert starts[1]["changes"] == {
        "module.optimizer.lr": [1e-3, 5e-4],
        "trainer.max_steps": [2, 3],
    }
    assert (tmp_path / starts[1]["config"]).is_file()
    with pytest.raises(RunRefused, match=r"batch_size: 8 -> 16.*sampler.p: 0.5 -> 0.3"):
        run(
            config(
                tmp_path,
                *fast,
                "trainer.max_steps=3",
                "ckpt_path=last",
                "module.optimizer.lr=5e-4",
                "batch_size=16",
                "sampler.p=0.3",
            )
        )
    with pytest.raises(RunRefused, match="ckpt_path=null but run_name"):
        run(config(tmp_path, *fast, "trainer.max_steps=3", "module.optimizer.lr=5e-4"))
    # insisting is possible, and recorded (max_steps reached: nothing more trains)
    run(
        config(
            tmp_path,
            *fast,
            "trainer.max_steps=3",
            "ckpt_path=last",
            "module.optimizer.lr=5e-4",
            "sampler.p=0.3",
            "resume_changes=allow",
        )
    )
    starts = json.loads((tmp_path / "run_info.json").read_text())["starts"]
    assert len(starts) == 3 and starts[2]["changes"] == {"sampler.p": [0.5, 0.3]}


def test_a_metric_removed_from_the_config_is_not_logged_and_nothing_asks_for_it(
    tmp_path: Path,
) -> None:
    gone = ("~metrics.senior_share", "~metrics.response_length", "~metrics.truncated")
    run(config(tmp_path, "trainer.max_steps=1", *gone))
    (row,) = [r for r in metrics_rows(tmp_path) if r.get("train/reward")]
    for key in ("senior_share", "response_length", "truncated"):
        assert f"train/{key}" not in row and f"val/tandem/{key}" not in row, key
    assert "train/handoffs_per_rollout" in row


@pytest.mark.parametrize("top_p", [None, 0.95])
def test_validation_samples_with_its_own_top_p(tmp_path: Path, monkeypatch, top_p) -> None:
    from tandem.engine import base
    from tandem.modules.grpo import TandemGRPO

    seen: list[tuple[bool, float]] = []
    real = TandemGRPO.rollout

    def rollout(self, *args, **kwargs):
        made = base.SamplingParams

        def record(**params):
            seen.append((self.training, params["top_p"]))
            return made(**params)

        monkeypatch.setattr("tandem.modules.grpo.SamplingParams", record)
        try:
            return real(self, *args, **kwargs)
        finally:
            monkeypatch.setattr("tandem.modules.grpo.SamplingParams", made)

    monkeypatch.setattr(TandemGRPO, "rollout", rollout)
    override = "validation.top_p=null" if top_p is None else f"validation.top_p={top_p}"
    run(config(tmp_path, "trainer.max_steps=1", "generation.top_p=0.9", override))
    training = {p for t, p in seen if t}
    validation = {p for t, p in seen if not t}
    assert training == {0.9} and validation == {0.9 if top_p is None else top_p}
