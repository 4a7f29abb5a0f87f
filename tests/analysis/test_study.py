"""The study: finding finished runs, evaluating them once, measuring their inputs (summaries,
pull-back), writing them, and the page rendered from them, end to end on tiny stand-in runs."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tandem.analysis import inputs, study
from tandem.analysis.claims import CLAIMS
from tandem.analysis.measure import flatten, measure, render_folder, validation
from tandem.analysis.problems import metric_arms
from tandem.analysis.sections import drift_section
from tandem.analysis.study import Study, find_runs
from tandem.modules.models import load_causal_lm, load_tokenizer

CONF = str(Path(__file__).resolve().parents[2] / "conf")
EVAL = [
    "eval.tiny.limit=4",
    "eval.tiny.n=2",
    "eval.tiny.ks=[1,2]",
    "eval.tiny.max_new_tokens=48",
    "eval.tiny_greedy.limit=4",
    "eval.tiny_greedy.max_new_tokens=48",
    "threads=1",
    "progress=false",
]


def fake_run(root: Path, arm: str, seed: int, scale: float | None, direction: dict) -> Path:
    """A run folder as the reproduce sweep leaves it; its senior is the base moved by
    ``scale`` x ``direction`` (None: unfinished, no exported senior)."""
    folder = root / f"{arm}-seed{seed}"
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={arm}", f"seed={seed}", "output_dir=x"])
    (folder / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, folder / ".hydra" / "config.yaml")
    if scale is not None:
        model = load_causal_lm("tiny")
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.add_(scale * direction[name])
        model.save_pretrained(folder / "senior")
        load_tokenizer("tiny").save_pretrained(folder / "senior")
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("study")
    gen = torch.Generator().manual_seed(0)
    base = load_causal_lm("tiny")
    direction = {n: 0.05 * torch.randn(p.shape, generator=gen) for n, p in base.named_parameters()}
    # GRPO moves the base along a direction; "Tandem RL" moves half as far along the same one,
    # so every item GRPO displaced is closer to the base under it
    fake_run(root, "grpo", 0, 1.0, direction)
    fake_run(root, "trl", 0, 0.5, direction)
    fake_run(root, "kl_reg", 0, None, direction)
    # a second GRPO seed, as far along a direction of its own: the null
    other = {n: 0.05 * torch.randn(p.shape, generator=gen) for n, p in base.named_parameters()}
    fake_run(root, "grpo", 1, 1.0, other)
    return root


def test_find_runs_keeps_finished_runs_only(runs: Path) -> None:
    found, unfinished = find_runs(runs)
    assert [(r.arm, r.seed) for r in found] == [("grpo", 0), ("grpo", 1), ("trl", 0)]
    assert [p.name for p in unfinished] == ["kl_reg-seed0"]
    assert found[0].steps == 60  # conf/trainer/cpu.yaml


def tiny_study(root: Path) -> Study:
    return dataclasses.replace(
        Study.load("tiny"), runs=root, out=root / "page.md", data=root / "data"
    )


def test_measure_evaluates_once_writes_the_inputs_and_renders_from_them(runs: Path) -> None:
    found = tiny_study(runs)
    folder = measure(found, EVAL, "python -m tandem.analysis.study")
    assert (runs / "eval_base" / "results.json").is_file()
    got = inputs.read(folder)
    assert [(r.arm, r.seed) for r in got.runs] == [("grpo", 0), ("grpo", 1), ("trl", 0)]
    assert got.base["metrics"]["drift/kl"] == pytest.approx(0.0, abs=1e-6), "base against itself"
    # each evaluation's commit is recorded beside it and carried into the inputs
    assert got.runs[0].evaluated == got.study["measured_at"]
    # every figure rebuilt from the committed summaries equals the evaluation's own
    for run in got.runs:
        results = json.loads((runs / run.name / "eval" / "results.json").read_text())
        table = results["sets"]["tiny"]
        for metric in ("solo/pass@2", "handoff/pass@1", "drift/kl", "legibility/junior_ce"):
            arms, _ = metric_arms({"one": [run.problems]}, metric)
            assert arms["one"].runs[0, 0] == pytest.approx(table[metric], abs=1e-5), metric
    # the farther senior drifts more from the base
    kl = {r.name: r.metrics["drift/kl"] for r in got.runs}
    assert kl["grpo-seed0"] > kl["trl-seed0"] > 0.0
    # the pull-back of every run against every GRPO seed, with an influence per problem
    refs = got.pullback["references"]
    assert sorted(refs) == ["0", "1"] and sorted(refs["0"]["runs"]) == ["grpo-seed1", "trl-seed0"]
    assert sorted(refs["1"]["runs"]) == ["grpo-seed0"]
    pair = refs["0"]["runs"]["trl-seed0"]
    assert len(pair["influence"]) == 4 and pair["items"] == 56  # 5% of 1,110 items
    assert abs(sum(pair["influence"])) < 1e-6
    # a finished evaluation is reused, not redone, and the inputs come out the same
    results = runs / "trl-seed0" / "eval" / "results.json"
    stamp = results.stat().st_mtime_ns
    before = {p.name: p.read_bytes() for p in folder.rglob("*.json")}
    measure(found, EVAL, "python -m tandem.analysis.study")
    assert results.stat().st_mtime_ns == stamp
    assert {p.name: p.read_bytes() for p in folder.rglob("*.json")} == before
    page = render_folder(folder).read_text()
    for claim in CLAIMS:
        assert claim.title in page
    assert "## Verdicts" in page and "## Calibration: GRPO seeds against GRPO seeds" in page
    assert "| `greedy/solo/pass@1` |" in page and "0.0220 / 0.0260" in page
    assert "## The pull-back, seed by seed" in page and "| 0 | `trl-seed0` |" in page
    assert "| grpo | " in page and "union of 2 seeds" in page
    # one Tandem RL seed gives no interval: no verdict is drawn from it
    assert "| 1 | `solo/pass@1` | ±0.02 | +" in page and "No interval" in page
    # the page from the committed inputs alone, with no run on disk, is the same
    shutil.rmtree(runs / "grpo-seed0" / "eval")
    again = study.main(["--from-results", str(folder)])
    assert again.read_text() == page


def test_an_interrupted_evaluation_is_redone_whole(tmp_path: Path, monkeypatch) -> None:
    calls = []

    def fake_run_evaluation(cfg):
        out = Path(cfg.output_dir)
        assert out.name.endswith(".partial")
        out.mkdir(parents=True, exist_ok=True)
        calls.append(out)
        if len(calls) == 1:
            raise KeyboardInterrupt  # killed mid-way: nothing under the final name
        (out / "results.json").write_text('{"macro": {"solo/pass@1": 0.5}}')

    import tandem.evaluate

    monkeypatch.setattr(tandem.evaluate, "run", fake_run_evaluation)
    with pytest.raises(KeyboardInterrupt):
        study.evaluate("tiny", tmp_path / "eval")
    assert not (tmp_path / "eval").exists()
    assert study.evaluate("tiny", tmp_path / "eval")["macro"]["solo/pass@1"] == 0.5
    assert not (tmp_path / "eval.partial").exists()


def test_validation_curves_read_resumed_logs(tmp_path: Path) -> None:
    def log(folder: Path, version: int, rows: list[tuple[int, float, float]]) -> None:
        path = folder / "csv" / f"version_{version}" / "metrics.csv"
        path.parent.mkdir(parents=True)
        lines = ["step,train/reward,val/solo/accuracy,val/tandem/accuracy"]
        lines += [f"{s},,{solo},{tandem}" for s, solo, tandem in rows]
        lines += ["5,0.5,,"]  # a training row: no validation values
        path.write_text("\n".join(lines) + "\n")

    run = tmp_path / "grpo-seed0"
    log(run, 0, [(19, 0.4, 0.3)])
    log(run, 1, [(39, 0.5, 0.4)])  # resumed: a second CSV version
    assert validation(run) == {
        "val/solo/accuracy": {"19": 0.4, "39": 0.5},
        "val/tandem/accuracy": {"19": 0.3, "39": 0.4},
    }


def test_studies_name_their_sets_and_merge_overrides() -> None:
    paper = Study.load("paper")
    assert paper.sets == ("amc23_25", "aime24", "aime25", "aime26", "minerva")
    assert paper.checkpoint == "selected" and paper.greedy is None
    merged = paper.overrides(["device=cpu", "eval.aime24.n=2"])
    assert merged[0] == "eval=[amc23_25,aime24,aime25,aime26,minerva]"
    assert "device=cpu" in merged and "device=cuda:0" not in merged, "the last value wins"
    assert "handoff_rounds=150" in merged and "eval.aime24.n=2" in merged
    with pytest.raises(FileNotFoundError, match="the studies are"):
        Study.load("papr")
    with pytest.raises(ValueError, match="checkpoint"):
        dataclasses.replace(paper, checkpoint="best")


def test_flatten_takes_the_mean_over_the_study_sets() -> None:
    paper = Study.load("paper")
    results = {"sets": {s: {"solo/pass@1": float(i)} for i, s in enumerate(paper.sets)}}
    results["sets"]["aime24"]["only/here"] = 1.0
    assert flatten(results, paper) == {"solo/pass@1": 2.0}, "metrics of every set, averaged"


def test_each_choice_of_senior_has_its_own_evaluation(tmp_path: Path) -> None:
    from tandem.analysis.study import Run

    run = Run(tmp_path / "trl-seed0", "trl", 0, 60)
    (run.path / "checkpoints").mkdir(parents=True)
    assert run.evaluated("selected") == (str(run.senior), run.senior, run.path / "eval")
    (run.path / "checkpoints" / "best-20.ckpt").write_bytes(b"")
    (run.path / "checkpoints" / "best-100.ckpt").write_bytes(b"")
    source, senior, out = run.evaluated("selected")
    assert source.endswith("best-100.ckpt") and senior == out / "senior" == run.path / "eval/senior"
    # the last step's evaluation never reuses the selected one's results
    assert run.evaluated("last") == (str(run.senior), run.senior, run.path / "eval_last")


def test_a_study_states_every_margin_before_the_data() -> None:
    tiny = Study.load("tiny")
    margins = dict(tiny.margins)
    del margins["drift/kl"]
    with pytest.raises(ValueError, match=r"margins lacks \['drift/kl'\]"):
        dataclasses.replace(tiny, margins=margins)
    with pytest.raises(ValueError, match=r"margins.drift/kl .* positive margin"):
        dataclasses.replace(tiny, margins={**tiny.margins, "drift/kl": {"margin": 0, "reason": ""}})
    for name in ("tiny", "notation", "paper"):
        assert all(m["reason"] for m in Study.load(name).margins.values())


def run_inputs(arm: str, seed: int, metrics: dict) -> inputs.RunInputs:
    return inputs.RunInputs(arm, seed, f"x/{arm}-seed{seed}", 60, [], "abc", metrics, {}, {})


def world(folder: str, grpo: dict[str, list[float]]) -> inputs.Inputs:
    """Inputs with GRPO's per-seed ``grpo[metric]`` and a trl arm far away."""
    runs = [run_inputs("grpo", i, {k: v[i] for k, v in grpo.items()}) for i in range(3)]
    runs += [run_inputs("trl", i, {"drift/kl": 9.0}) for i in range(3)]
    spec = {"runs": folder, "data": f"docs/results/data/{folder}", "checkpoint": "selected"}
    return inputs.Inputs(Path(folder), {**spec, "compare": "tiny"}, {}, runs, {})


def test_drift_section_sets_grpo_against_another_world() -> None:
    ours = world("here", {
        "drift/kl": [0.20, 0.22, 0.25], "legibility/junior_ce": [0.30, 0.35, 0.40],
        "solo/pass@1": [0.20, 0.19, 0.21], "handoff/pass@1": [0.10, 0.12, 0.11],
    })  # fmt: skip
    theirs = world("multirun/tiny_world", {
        "drift/kl": [0.007, 0.008, 0.006], "legibility/junior_ce": [0.30, 0.36, 0.41],
        "solo/pass@1": [0.35, 0.36, 0.34], "handoff/pass@1": [0.36, 0.37, 0.35],
        "greedy/solo/pass@1": [0.5, 0.5, 0.5], "greedy/handoff/pass@1": [0.51, 0.52, 0.53],
    })  # fmt: skip
    lines = drift_section(ours, theirs)
    text = "\n".join(lines)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ")}
    # each seed's drop is its own solo minus its own handoff: 0.10, 0.07, 0.10 here
    assert "0.090 [" in rows["solo minus handoff pass@1"]
    assert "-0.010 [" in rows["solo minus handoff pass@1"]
    verdicts = {line.split(":")[0][2:]: line for line in lines if line.startswith("- ")}
    assert "larger here" in verdicts["KL to the base (nats per token)"]
    assert "larger here" in verdicts["solo minus handoff pass@1"]
    # the same cross-entropies in both worlds: no difference to detect
    ce = "the junior's cross-entropy on the senior's text (nats per token)"
    assert "contains zero" in verdicts[ce]
    # a measure one world lacks has no difference, not a made-up one
    assert rows["greedy solo minus handoff accuracy"].endswith("| n/a |")
    # only GRPO is compared: the trl arm's values appear nowhere
    assert "9.000" not in text
    assert "`multirun/tiny_world`" in lines[0]
    # no inputs for the other world: said so
    assert "Not measured" in "\n".join(drift_section(ours, None))


def test_the_notation_study_is_set_against_the_tiny_world() -> None:
    assert Study.load("notation").compare == "tiny"
    assert Study.load("tiny").compare is None


def test_the_comparison_can_be_left_out_from_the_command_line(tmp_path: Path, monkeypatch) -> None:
    import tandem.analysis.measure

    seen = []

    def fake_measure(found, overrides, command):
        seen.append(found.compare)
        raise SystemExit(0)  # stop before evaluating anything

    monkeypatch.setattr(tandem.analysis.measure, "measure", fake_measure)
    for flag, want in (([], "tiny"), (["--compare", "none"], None)):
        with pytest.raises(SystemExit):
            study.main(["--study", "notation", "--out", str(tmp_path / "p.md"), *flag])
        assert seen[-1] == want


def test_a_second_study_waits_for_the_first_evaluation_and_reads_it(tmp_path: Path, monkeypatch):
    """Two studies needing one evaluation (the base's): the second waits on its lock instead
    of deleting the first one's work, then reads its results without evaluating again."""
    import fcntl
    import threading

    import tandem.evaluate

    calls = []
    monkeypatch.setattr(tandem.evaluate, "run", lambda cfg: calls.append(cfg))
    out = tmp_path / "eval_base"
    partial = tmp_path / "eval_base.partial"
    partial.mkdir()
    (partial / "half.jsonl").write_text("the first study is writing this\n")
    got = {}
    with open(tmp_path / "eval_base.lock", "w") as first:  # the first study holds it
        fcntl.flock(first, fcntl.LOCK_EX)
        second = threading.Thread(target=lambda: got.update(study.evaluate("tiny", out)))
        second.start()
        second.join(timeout=1.0)
        assert second.is_alive(), "the second study did not wait"
        assert (partial / "half.jsonl").is_file(), "the second study deleted the first's work"
        partial.rename(out)  # the first study finishes
        (out / "results.json").write_text('{"macro": {"solo/pass@1": 0.25}}')
    second.join(timeout=10.0)
    assert not second.is_alive()
    assert got["macro"]["solo/pass@1"] == 0.25 and calls == []
