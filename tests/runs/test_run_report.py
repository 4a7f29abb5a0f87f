"""What a run tells its user: metrics in train.log, every validation recorded, and the closing
summary that sets the base's validation accuracy against the final senior's."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import OmegaConf

from tandem.runs.report import RECORD, closing_summary, run_label, validations
from tandem.train import run
from tests.modules.test_train import config, metrics_rows


def _cfg(logger: str = "csv"):
    target = "aim.pytorch_lightning.AimLogger" if logger == "aim" else "CSVLogger"
    return OmegaConf.create(
        {"validation": {"size": 200, "temperature": 0.0}, "logger": [{"_target_": target}]}
    )


def test_the_summary_sets_the_base_against_the_final_senior(tmp_path: Path) -> None:
    lines = [
        {"step": 0, "tandem_accuracy": 0.354, "solo_accuracy": 0.36},
        {"step": 20, "tandem_accuracy": 0.41, "solo_accuracy": 0.40},
        {"step": 60, "tandem_accuracy": 0.492, "solo_accuracy": 0.5},
    ]
    (tmp_path / RECORD).write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 6')
    text = closing_summary(tmp_path, _cfg("aim"), 60, "python -m tandem.evaluate senior=X")
    first = "validation accuracy (200 prompts of the validation split, greedy): step 0 (the base)"
    assert f"{first} -> step 60" in text
    assert "tandem (senior + junior): 0.354 -> 0.492 (+0.138)" in text
    assert "solo   (senior alone): 0.360 -> 0.500 (+0.140)" in text
    assert f"the senior: {tmp_path / 'senior'}" in text and "`aim up`" in text
    assert "next: python -m tandem.evaluate senior=X" in text and "experiment=grpo" in text


def test_validations_keep_the_latest_of_each_step_and_skip_a_cut_line(tmp_path: Path) -> None:
    (tmp_path / RECORD).write_text(
        '{"step": 0, "tandem_accuracy": 0.1}\n{"step": 5, "tandem_accuracy": 0.2}\n'
        '{"step": 0, "tandem_accuracy": 0.3}\n{"step": 9, "tand'
    )
    assert validations(tmp_path) == [
        {"step": 0, "tandem_accuracy": 0.3},
        {"step": 5, "tandem_accuracy": 0.2},
    ]
    assert validations(tmp_path / "absent") == []
    assert "no validation ran" in closing_summary(tmp_path / "absent", _cfg(), 3, "x")


def test_a_run_validates_the_base_first_logs_its_steps_and_closes_with_the_summary(
    tmp_path: Path, caplog
) -> None:
    log_file = tmp_path / "train.log"
    handler = logging.FileHandler(log_file)  # what Hydra gives a run
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO):
            metrics = run(config(tmp_path / "run", "trainer.max_steps=3"))
    finally:
        root.removeHandler(handler)
        handler.close()
    # validated before the first step (the base) and after the last (3 is not a multiple of 2)
    steps = [v["step"] for v in validations(tmp_path / "run")]
    assert steps == [0, 2, 3], steps
    text = log_file.read_text()
    for step in (1, 2, 3):
        assert f"step {step}/3: reward " in text
    assert "reward over the last 3 steps" in text and "senior share" in text
    assert "validation at step 0: accuracy tandem (senior + junior)" in text
    summary = [r.getMessage() for r in caplog.records if "run finished at step 3" in r.getMessage()]
    assert summary and "step 0 (the base) -> step 3" in summary[0]
    # the training's metrics are still returned beside the final validation's
    assert "train/reward" in metrics and "val/tandem/accuracy" in metrics
    # the metrics files put each step and validation where the run's lines do
    rows = metrics_rows(tmp_path / "run")
    assert [int(r["step"]) for r in rows if r.get("val/tandem/accuracy")] == [0, 2, 3]
    assert [int(r["step"]) for r in rows if r.get("train/reward")] == [1, 2, 3]


def test_an_aim_run_is_named_after_its_folder_and_a_resume_continues_it(
    tmp_path: Path, monkeypatch
) -> None:
    from tests.modules.test_train import aim_runs, compose_logger

    repo = tmp_path / "aim"
    monkeypatch.setenv("TANDEM_AIM_REPO", str(repo))
    folder = tmp_path / "trl-seed0"
    for steps, ckpt in ((2, "null"), (3, "last")):
        cfg = config(folder, f"trainer.max_steps={steps}", f"ckpt_path={ckpt}")
        cfg.logger = compose_logger("aim")
        run(cfg)
    (aim_run,) = aim_runs(repo)  # one Aim run, not one a start
    assert aim_run.name == "trl-seed0"
    assert aim_run["output_dir"] == str(folder.absolute())
    assert json.loads((folder / "aim_run.json").read_text())["hash"] == aim_run.hash
    rewards = next(m for m in aim_run.metrics() if m.name == "train/reward")
    # each start's steps in the one run, numbered as the run's lines number them
    assert (rewards.first_step(), rewards.last_step()) == (1, 3)


def test_a_run_in_a_sweep_is_named_by_the_sweep_and_its_job(tmp_path: Path) -> None:
    (tmp_path / "tiny_world" / "trl-seed1").mkdir(parents=True)
    (tmp_path / "tiny_world" / "multirun.yaml").write_text("{}")
    assert run_label(tmp_path / "tiny_world" / "trl-seed1") == "tiny_world/trl-seed1"
    assert run_label(tmp_path / "tiny_world") == "tiny_world"
    # a job folder that is only its number is named by its overrides
    job = tmp_path / "tiny_world" / "3" / ".hydra"
    job.mkdir(parents=True)
    recorded = "- sampler=token\n- sampler.p=0.25\n- hydra.verbose=false\n"
    (job / "overrides.yaml").write_text(recorded)
    assert run_label(job.parent) == "tiny_world/sampler=token,sampler.p=0.25"
