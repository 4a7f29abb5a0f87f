"""The study: finding finished runs, evaluating them once, the displacement per seed, the
intervals and verdicts, and the page, end to end on tiny stand-in runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tandem.analysis import study
from tandem.analysis.claims import CLAIMS
from tandem.analysis.study import Study, collect, find_runs, flatten, render
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
    return dataclasses.replace(Study.load("tiny"), runs=root)


def test_collect_evaluates_once_and_measures_displacement(runs: Path) -> None:
    values, base, found = collect(tiny_study(runs), EVAL)
    assert (runs / "eval_base" / "results.json").is_file()
    assert base["drift/kl"] == pytest.approx(0.0, abs=1e-6), "the base against itself"
    for arm, seeds in (("grpo", [0.0, 1.0]), ("trl", [0.0])):
        assert values[arm]["seed"] == seeds
        assert len(values[arm]["solo/pass@1"]) == len(seeds)
        assert 0.0 <= values[arm]["handoff/pass@2"][0] <= 1.0
    # the farther senior drifts more from the base, and its displaced items come back under trl
    assert values["grpo"]["drift/kl"][0] > values["trl"]["drift/kl"][0] > 0.0
    assert values["trl"]["pulled_back"][0] > 0.9
    # half-way back along GRPO's own direction: the further GRPO moved an item, the further
    # Tandem RL moves it back
    assert values["trl"]["pullback_rho"][0] < -0.5 and values["trl"]["pullback_p"][0] < 0.01
    assert values["trl"]["pullback_n"] == [500]
    assert "pulled_back" not in values["grpo"]
    # read both ways round: GRPO, further out, is seldom closer to the base than TRL
    assert values["trl"]["pulled_back_swapped"][0] < 0.3
    assert values["trl"]["pulled_back_asymmetry"][0] > 0.6
    # the null: each GRPO seed against the other, one pair each way round
    assert len(values["grpo"]["null/pulled_back"]) == 2
    assert len(values["grpo"]["null/pulled_back_asymmetry"]) == 2
    results = runs / "trl-seed0" / "eval" / "results.json"
    stamp = results.stat().st_mtime_ns
    again, _, _ = collect(tiny_study(runs), EVAL)
    assert results.stat().st_mtime_ns == stamp, "a finished evaluation is reused, not redone"
    assert again == values
    # a comparison with another world needs its evaluations only, not its pull-back
    (runs / "grpo-seed0" / "eval" / "displacement.json").unlink()
    measured, _, _ = collect(tiny_study(runs), EVAL, pullback=False)
    assert "pulled_back" not in measured["trl"]
    assert not (runs / "grpo-seed0" / "eval" / "displacement.json").exists()
    assert measured["trl"]["drift/kl"] == values["trl"]["drift/kl"]
    page = render(
        values, base, found, tiny_study(runs), "python -m tandem.analysis.study", margin=0.05
    )
    for claim in CLAIMS:
        assert claim.title in page
    assert "| `drift/kl` | 0.000 |" in page
    assert "| `greedy/solo/pass@1` |" in page
    assert "0.022 / 0.026" in page
    assert "equivalent within ±0.05" in page
    assert "| `pullback_rho` | - | n/a |" in page  # grpo is the reference: no value of its own
    assert "Per seed: rho -" in page and "n = 500)" in page
    assert "## Verdicts before and after the null" in page
    # one Tandem RL seed: the null can be set beside it, but gives no interval to judge by
    assert "No interval with one Tandem RL seed" in page
    assert "| `spearman_top` |" in page
    assert "## Problems: paired intervals and coverage" in page
    assert "| `solo/pass@1` | " in page and "(4 problems)" in page
    assert "| grpo | " in page and "union of 2 seeds" in page


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


def test_validation_curves_average_seeds_and_read_resumed_logs(tmp_path: Path) -> None:
    from tandem.analysis.study import Run, curves_section

    def log(folder: Path, version: int, rows: list[tuple[int, float, float]]) -> None:
        path = folder / "csv" / f"version_{version}" / "metrics.csv"
        path.parent.mkdir(parents=True)
        lines = ["step,train/reward,val/solo/accuracy,val/tandem/accuracy"]
        lines += [f"{s},,{solo},{tandem}" for s, solo, tandem in rows]
        lines += ["5,0.5,,"]  # a training row: no validation values
        path.write_text("\n".join(lines) + "\n")

    a, b = tmp_path / "grpo-seed0", tmp_path / "grpo-seed1"
    log(a, 0, [(19, 0.4, 0.3)])
    log(a, 1, [(39, 0.5, 0.4)])  # resumed: a second CSV version
    log(b, 0, [(19, 0.6, 0.5), (39, 0.7, 0.6)])
    runs = [Run(a, "grpo", 0, 40), Run(b, "grpo", 1, 40)]
    table = "\n".join(curves_section(runs, ["grpo"]))
    assert "| 19 | 0.500 / 0.400 |" in table
    assert "| 39 | 0.600 / 0.500 |" in table


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


def _drift(kl, ce, solo, handoff, greedy=None):
    grpo = {"drift/kl": kl, "legibility/junior_ce": ce, "solo/pass@1": solo}
    grpo["handoff/pass@1"] = handoff
    if greedy:
        grpo["greedy/solo/pass@1"], grpo["greedy/handoff/pass@1"] = greedy
    return {"grpo": grpo, "trl": {"drift/kl": [9.0, 9.0, 9.0]}}


def test_drift_section_sets_grpo_against_another_world(tmp_path: Path) -> None:
    here = Study("t", tmp_path / "here", tmp_path / "p.md", "tiny", ("tiny",), compare="tiny")
    other = Study("t", Path("multirun/tiny_world"), tmp_path / "q.md", "tiny", ("tiny",))
    ours = _drift([0.20, 0.22, 0.25], [0.30, 0.35, 0.40], [0.20, 0.19, 0.21], [0.10, 0.12, 0.11])
    theirs = _drift(
        [0.007, 0.008, 0.006],
        [0.30, 0.36, 0.41],
        [0.35, 0.36, 0.34],
        [0.36, 0.37, 0.35],
        greedy=([0.5, 0.5, 0.5], [0.51, 0.52, 0.53]),
    )
    lines = study.drift_section(ours, theirs, here, other)
    text = "\n".join(lines)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ")}
    # each seed's drop is its own solo minus its own handoff: 0.10, 0.07, 0.10 here
    assert "0.090 [" in rows["solo minus handoff pass@1"]
    assert "-0.010 [" in rows["solo minus handoff pass@1"]
    verdicts = {line.split(":")[0][2:]: line for line in lines if line.startswith("- ")}
    assert "larger here" in verdicts["KL to the base (nats per token)"]
    assert "larger here" in verdicts["solo minus handoff pass@1"]
    # the same cross-entropies in both worlds: no difference to detect
    assert (
        "contains zero"
        in verdicts["the junior's cross-entropy on the senior's text (nats per token)"]
    )
    # a measure one world lacks is said to be missing, not dropped
    assert "not measured" in verdicts["greedy solo minus handoff accuracy"]
    # only GRPO is compared: the trl arm's values appear nowhere
    assert "9.000" not in text
    assert "`multirun/tiny_world`" in lines[0]


def test_a_comparison_without_runs_says_so(tmp_path: Path, monkeypatch) -> None:
    empty = Study("t", tmp_path / "none", tmp_path / "q.md", "tiny", ("tiny",))
    monkeypatch.setattr(Study, "load", classmethod(lambda cls, name: empty))
    here = Study("t", tmp_path / "here", tmp_path / "p.md", "tiny", ("tiny",), compare="tiny")
    lines = study.against(here, {}, [])
    assert lines[0].startswith("## GRPO's drift") and "no finished training run" in lines[2]
    assert study.against(dataclasses.replace(here, compare=None), {}, []) == []


def test_the_notation_study_is_set_against_the_tiny_world() -> None:
    assert Study.load("notation").compare == "tiny"
    assert Study.load("tiny").compare is None


def test_the_comparison_can_be_left_out_from_the_command_line(tmp_path: Path, monkeypatch) -> None:
    seen = []

    def fake_collect(found, overrides, pullback=True):
        seen.append(found.compare)
        raise SystemExit(0)  # stop before evaluating anything

    monkeypatch.setattr(study, "collect", fake_collect)
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
