"""The notebook helpers: loading results (JSON and Aim), training logs, plots and the rollout."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest

from tandem.analysis import report

matplotlib.use("Agg")


def test_results_from_json_and_from_aim_agree(eval_outputs: Path) -> None:
    results = report.load_results(eval_outputs / "results")
    saved = json.loads((eval_outputs / "results" / "base" / "results.json").read_text())
    row = results[(results["set"] == "tiny") & (results["metric"] == "solo/pass@2")]
    assert row["value"].item() == saved["sets"]["tiny"]["solo/pass@2"]
    assert set(results["set"]) == {"tiny", "macro"} and set(results["label"]) == {"base"}
    aim = report.load_results("unused", aim_repo=eval_outputs / "aim")
    key = ["label", "set", "metric"]
    merged = results.merge(aim, on=key, suffixes=("_json", "_aim"))
    assert len(merged) == len(results) == len(aim)
    assert (merged["value_json"] - merged["value_aim"]).abs().max() < 1e-9
    assert set(merged["results_dir_aim"]) == {str(eval_outputs / "results" / "base")}


def test_pass_at_k_plot_has_a_curve_per_mode(eval_outputs: Path) -> None:
    results = report.load_results(eval_outputs / "results")
    curves = report.pass_at_k(results)
    assert sorted(set(curves["mode"])) == ["handoff", "solo"]
    assert sorted(set(curves["k"])) == [1, 2]
    fig = report.plot_pass_at_k(results)
    assert len(fig.axes) == 2  # tiny and macro
    assert len(fig.axes[0].lines) == 2  # one method x (solo, handoff)
    fig = report.plot_drift_legibility(results)
    assert len(fig.axes) == 3


def test_training_curves_are_read_from_csv_logs(training_runs: Path) -> None:
    curves = report.load_training_curves(training_runs)
    assert set(curves["run"]) == {"grpo", "trl"}
    reward = curves[(curves["run"] == "trl") & (curves["key"] == "train/reward")]
    assert reward["value"].tolist() == pytest.approx([0.02 * s for s in range(10)])
    val = curves[curves["key"] == "val/tandem/accuracy"]
    assert len(val) == 4  # logged every 5 steps only: empty cells are not values
    fig = report.plot_training(curves)
    assert len(fig.axes) == 3 and len(fig.axes[0].lines) == 2
    # a validation panel's few points show as markers
    assert all(line.get_marker() == "o" for line in fig.axes[2].lines)


def test_a_sweeps_jobs_are_named_by_their_overrides(tmp_path: Path) -> None:
    for job, overrides in (("0", ["experiment=grpo", "seed=0"]), ("1", ["experiment=trl"])):
        folder = tmp_path / "multirun" / "day" / "time" / job
        logs = folder / "csv" / "version_0"
        logs.mkdir(parents=True)
        (logs / "metrics.csv").write_text("epoch,step,train/reward\n0,0,1\n")
        (folder / ".hydra").mkdir()
        lines = "".join(f"- {o}\n" for o in [*overrides, "hydra.job.chdir=false"])
        (folder / ".hydra" / "overrides.yaml").write_text(lines)
    curves = report.load_training_curves(tmp_path / "multirun")
    assert set(curves["run"]) == {"experiment=grpo,seed=0", "experiment=trl"}


def test_the_notebook_finds_single_runs_and_sweeps_by_default(
    training_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TANDEM_RUNS", raising=False)
    monkeypatch.chdir(training_runs.parent)
    (training_runs.parent / "outputs").symlink_to(training_runs)  # grpo and trl
    sweep = training_runs.parent / "multirun" / "day" / "0" / "csv" / "version_0"
    sweep.mkdir(parents=True)
    (sweep / "metrics.csv").write_text("epoch,step,train/reward\n0,0,1\n")
    paths = report.notebook_paths()
    assert paths.runs == (Path.cwd() / "outputs", Path.cwd() / "multirun")
    assert set(report.load_training_curves(paths.runs)["run"]) == {"grpo", "trl", "0"}


def test_rollout_html_colours_each_author_and_escapes_text(eval_outputs: Path) -> None:
    records = report.load_generations(eval_outputs / "results")
    assert len(records) == 2 * 3 * 2
    chosen = report.pick_rollout(records, mode="handoff")
    assert {a for a, _ in chosen["spans"]} == {"senior", "junior"}
    record = {**chosen, "spans": [["senior", "a < b\n\n"], ["junior", "so \\boxed{1}"]]}
    page = report.rollout_html(record)
    assert f'color:{report.COLORS["senior"]}" title="senior">a &lt; b' in page
    assert f'color:{report.COLORS["junior"]}" title="junior">so \\boxed{{1}}' in page
