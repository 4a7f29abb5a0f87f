"""python -m tandem.evaluate: configs, the checked tiny-world example, local files, checkpoints.

The checked example evaluates the tiny world's base against itself: its drift must be 0, its
overlap with itself 1, the junior's cross-entropy the senior's own sampled NLL, and its pass@k
curve must rise with k.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from tandem.config import ConfigError
from tandem.evaluate import default_label, run
from tandem.evaluation.config import validate_eval_config
from tandem.evaluation.models import senior_base
from tandem.evaluation.records import read_records
from tandem.evaluation.results import format_tables, log_to_aim, macro_average
from tandem.modules.export import check_senior, save_senior
from tandem.modules.models import load_causal_lm, load_tokenizer

CONF = str(Path(__file__).resolve().parents[1] / "conf")
EVAL_SETS = ["tiny", "math500", "aime24", "aime25", "aime26", "amc23", "amc23_25", "minerva"]
# quick runs: one torch thread (fastest on a small shared CPU), no Aim, no progress bar
QUICK = ["threads=1", "aim=false", "progress=false"]


def eval_config(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="evaluate", overrides=list(overrides))


def test_every_eval_set_composes_and_validates() -> None:
    cfg = eval_config(f"eval=[{','.join(EVAL_SETS)}]", "output_dir=x")
    assert list(cfg.eval) == EVAL_SETS
    assert cfg.eval.math500.source.path == "HuggingFaceH4/MATH-500"
    assert cfg.sampler.name == "step"
    validate_eval_config(cfg)
    files = [f"eval.{s}.source.data_files=f.jsonl" for s in ("amc24", "amc25", "local")]
    validate_eval_config(eval_config("eval=[amc24,amc25,local]", "output_dir=x", *files))


def test_bad_config_reports_every_problem_at_once() -> None:
    cfg = eval_config(
        "eval=[tiny,local]",
        "output_dir=x",
        "eval.tiny.ks=[1,16]",
        "eval.tiny.temperature=-1",
        "sampler.name=stpe",
        "solo=false",
        "junior=/no/such/folder",
    )
    with pytest.raises(ConfigError) as err:
        validate_eval_config(cfg)
    message = str(err.value)
    assert "6 problem(s)" in message
    assert "eval.local.source.data_files is required but missing" in message
    assert "eval.tiny.ks ([1, 16]) must be a non-empty list of integers in [1, n=8]" in message
    assert "eval.tiny.temperature (-1) must be a number >= 0" in message
    assert "Did you mean 'step'?" in message
    assert "drift=true needs solo=true" in message
    assert "junior ('/no/such/folder') is not a model folder" in message


@pytest.fixture(scope="module")
def base_vs_itself(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("base_vs_itself")
    cfg = eval_config(
        f"output_dir={out}",
        "senior=tiny",
        "junior=tiny",
        "eval.tiny.limit=8",
        "eval.tiny.n=8",
        "eval.tiny.ks=[1,2,4,8]",
        *QUICK,
    )
    return run(cfg), out


def test_base_against_itself_has_no_drift_and_full_overlap(base_vs_itself) -> None:
    results, _ = base_vs_itself
    table = results["sets"]["tiny"]
    assert table["drift/kl"] == pytest.approx(0.0, abs=1e-6)
    assert table["legibility/overlap"] == pytest.approx(1.0, abs=1e-5)
    assert table["legibility/junior_ce"] > 0
    assert 0 < table["handoff/senior_share"] < 1 and table["handoff/handoffs"] > 0


def test_base_pass_at_k_rises_with_k(base_vs_itself) -> None:
    results, _ = base_vs_itself
    table = results["sets"]["tiny"]
    for mode in ("solo", "handoff"):
        curve = [table[f"{mode}/pass@{k}"] for k in (1, 2, 4, 8)]
        assert all(a <= b + 1e-12 for a, b in itertools.pairwise(curve)), curve
    solo = [table[f"solo/pass@{k}"] for k in (1, 2, 4, 8)]
    assert solo[-1] > solo[0], f"the base solves no problem of 8 in 8 samples: {solo}"


def test_records_hold_every_generation(base_vs_itself) -> None:
    results, out = base_vs_itself
    records = list(read_records(out / "generations" / "tiny.jsonl"))
    assert len(records) == 2 * 8 * 8
    solo = [r for r in records if r["mode"] == "solo"]
    handoff = [r for r in records if r["mode"] == "handoff"]
    assert {(r["problem_index"], r["sample"]) for r in solo} == {
        (i, j) for i in range(8) for j in range(8)
    }
    for r in records:
        n = r["length"]
        assert len(r["tokens"]) == len(r["authors"]) == len(r["senior_logprobs"]) == n
        assert len(r["junior_logprobs"]) == n
        assert "".join(text for _, text in r["spans"]) == r["text"]
    assert any({a for a, _ in r["spans"]} == {"senior", "junior"} for r in handoff)
    # the junior is the senior: teacher-forced junior log-probs are the sampled senior's
    sampled = torch.tensor([x for r in solo for x in r["senior_logprobs"]])
    forced = torch.tensor([x for r in solo for x in r["junior_logprobs"]])
    torch.testing.assert_close(forced, sampled, atol=2e-4, rtol=1e-4)
    # the paper's junior CE: each CoT's mean NLL, then the mean over CoTs; the pooled one
    # weighs every token the same
    table = results["sets"]["tiny"]
    per_cot = [-sum(r["senior_logprobs"]) / r["length"] for r in solo]
    assert table["legibility/junior_ce"] == pytest.approx(sum(per_cot) / len(per_cot), rel=1e-4)
    assert table["legibility/junior_ce_pooled"] == pytest.approx(-float(sampled.mean()), rel=1e-4)
    assert abs(table["legibility/junior_ce"] - table["legibility/junior_ce_pooled"]) > 1e-4
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["set"] for r in rows] == ["tiny", "macro"]
    assert json.loads((out / "results.json").read_text())["junior"] == "tiny"


def test_macro_average_weighs_every_set_the_same() -> None:
    tables = {
        "aime24": {"solo/pass@1": 0.2, "legibility/junior_ce": 0.3},
        # a big set counts once too; a NaN is left out, not averaged in
        "minerva": {"solo/pass@1": 0.6, "legibility/junior_ce": math.nan, "handoff/pass@1": 0.5},
    }
    macro = macro_average(tables)
    assert macro.keys() == {"solo/pass@1", "legibility/junior_ce", "handoff/pass@1"}
    assert macro["solo/pass@1"] == pytest.approx(0.4)
    assert macro["legibility/junior_ce"] == pytest.approx(0.3)
    assert macro["handoff/pass@1"] == pytest.approx(0.5)


def test_local_file_set_reports_unusable_rows_and_macro_averages(tmp_path: Path) -> None:
    rows = [
        {"question": "Ava has 3 apples. Ava finds 4 more apples. How many apples?", "gold": "7"},
        {"question": "Ben has 9 pens. Ben loses 2 pens. How many pens?", "gold": ""},
        {"question": "Kira has 5 cups. How many cups?", "gold": None},
    ]
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    cfg = eval_config(
        "eval=[tiny,local]",
        f"output_dir={out}",
        f"eval.local.source.data_files={data}",
        "eval.local.source.problem_column=question",
        "eval.local.source.answer_column=gold",
        "eval.local.n=2",
        "eval.local.ks=[1,2]",
        "eval.local.max_new_tokens=32",
        "eval.tiny.limit=2",
        "eval.tiny.n=2",
        "eval.tiny.ks=[1,2]",
        "eval.tiny.max_new_tokens=32",
        "handoff=false",
        *QUICK,
    )
    results = run(cfg)
    report = results["reports"]["local"]
    assert report["kept"] == 1 and report["unusable"] == 2 and report["problems"] == 1
    assert report["reasons"] == {"empty answer": 1, "missing answer": 1}
    assert report["example"]["question"].startswith("Ben")
    sets, macro = results["sets"], results["macro"]
    for key in ("solo/response_length", "drift/kl", "solo/pass@2", "legibility/junior_ce"):
        assert macro[key] == pytest.approx((sets["tiny"][key] + sets["local"][key]) / 2)
    assert "handoff/pass@1" not in macro


def test_checkpoint_is_exported_and_drifts_from_its_base(tmp_path: Path) -> None:
    model = load_causal_lm("tiny")
    g = torch.Generator().manual_seed(0)
    state = {}
    for name, p in model.state_dict().items():
        noise = torch.randn(p.shape, generator=g) * 0.2 * p.float().std().clamp(min=1e-3)
        state[f"senior.{name}"] = p + noise if p.is_floating_point() else p
    ckpt = tmp_path / "last.ckpt"
    torch.save(
        {
            "hyper_parameters": {"model": "tiny", "dtype": "float32"},
            "state_dict": state,
            "callbacks": {"JuniorCallback": {"name_or_path": "tiny"}},
        },
        ckpt,
    )
    assert senior_base(str(ckpt)) == "tiny"
    out = tmp_path / "out"
    cfg = eval_config(
        f"senior={ckpt}",
        f"output_dir={out}",
        "eval.tiny.limit=2",
        "eval.tiny.n=2",
        "eval.tiny.ks=[1,2]",
        "eval.tiny.max_new_tokens=48",
        "handoff=false",
        *QUICK,
    )
    results = run(cfg)
    assert (out / "senior" / "config.json").is_file()
    assert results["junior"] == "tiny" and results["label"] == "last.ckpt"
    table = results["sets"]["tiny"]
    assert table["drift/kl"] > 1e-3
    assert table["legibility/overlap"] < 1 - 1e-3
    assert results["config"]["senior"] == str(ckpt)


@pytest.mark.slow
def test_command_line_writes_to_the_hydra_run_dir(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "tandem.evaluate",
        f"hydra.run.dir={tmp_path / 'run'}",
        "eval.tiny.limit=2",
        "eval.tiny.n=2",
        "eval.tiny.ks=[1,2]",
        "eval.tiny.max_new_tokens=32",
        *QUICK,
    ]
    subprocess.run(command, check=True, cwd=Path(CONF).parent, capture_output=True, timeout=300)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["output_dir"] == str(tmp_path / "run")
    assert (tmp_path / "run" / "generations" / "tiny.jsonl").is_file()


def test_a_cut_short_senior_export_is_refused_in_one_line(tmp_path: Path) -> None:
    # what a kill during the old, non-atomic export left: a run folder whose senior has an
    # empty config.json
    senior = tmp_path / "run" / "senior"
    save_senior(load_causal_lm("tiny"), load_tokenizer("tiny"), senior, step=3)
    assert check_senior(senior) is None
    (senior / "config.json").write_bytes(b"")
    assert "config.json is missing or not the size" in check_senior(senior)
    (senior / "export.json").unlink()
    (tmp_path / "run" / "run_info.json").write_text("{}")
    command = [sys.executable, "-m", "tandem.evaluate", f"senior={senior}", *QUICK]
    command.append(f"hydra.run.dir={tmp_path / 'eval'}")
    r = subprocess.run(command, cwd=Path(CONF).parent, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        f"tandem.evaluate: senior={senior}: {senior} has no export.json: its export was cut "
        "short. Export it again (python -m tandem.train run_name=<its run> ckpt_path=last "
        "re-exports a finished run), or give another senior."
    ]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("evall=tiny", "evall is not a key"),  # Hydra's composition error
        ("eval.tiny.n=0", "eval.tiny"),  # our check
    ],
)
def test_the_command_line_reports_a_config_problem_in_one_message(tmp_path, override, named):
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.evaluate", f"hydra.run.dir={tmp_path}", override],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "HYDRA_FULL_ERROR" not in proc.stderr
    assert proc.stderr.startswith("config error: ") and named in proc.stderr


# -- labels, the printed table, the base beside the senior -------------------------------------


def test_a_senior_is_labelled_by_its_training_runs_name(tmp_path: Path) -> None:
    run_dir = tmp_path / "outputs" / "trl-seed0"
    (run_dir / "checkpoints").mkdir(parents=True)
    sweep = tmp_path / "multirun" / "tiny_world"
    (sweep / "3").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("{}")
    assert default_label(str(run_dir / "senior")) == "trl-seed0"
    assert default_label(str(run_dir / "checkpoints" / "step-40.ckpt")) == "trl-seed0:step-40"
    assert default_label(str(sweep / "3" / "senior")) == "tiny_world/3"
    assert default_label("tiny") == "tiny"
    assert default_label(str(tmp_path / "Qwen3-4B")) == "Qwen3-4B"


def test_the_printed_table_is_rounded_with_a_column_per_model() -> None:
    senior = {
        "label": "trl-seed0",
        "sets": {"tiny": {"solo/pass@1": 0.49218751, "drift/kl": 0.0123456}},
    }
    base = {"label": "tiny (base)", "sets": {"tiny": {"solo/pass@1": 0.3541666}}}
    for r in (senior, base):
        r["macro"] = macro_average(r["sets"])
    text = format_tables([senior, base])
    lines = text.splitlines()
    assert lines[0].split() == ["tiny", "trl-seed0", "tiny", "(base)"]
    assert lines[1].split() == ["solo/pass@1", "0.492", "0.354"]
    assert lines[2].split() == ["drift/kl", "0.012", "-"]  # the base was not measured on it
    assert "macro" not in text and "0.49218751" not in text  # one set: its own average
    senior["sets"]["aime24"] = {"solo/pass@1": 0.1}
    senior["macro"] = macro_average(senior["sets"])
    blocks = format_tables([senior, base]).split("\n\n")
    assert [b.split()[0] for b in blocks] == ["tiny", "aime24", "macro"]
    assert blocks[1].splitlines()[1].split() == ["solo/pass@1", "0.100", "-"]


def test_with_base_scores_the_base_beside_the_senior_in_one_command(tmp_path: Path, caplog) -> None:
    model = load_causal_lm("tiny")
    g = torch.Generator().manual_seed(0)
    state = {
        f"senior.{name}": p + torch.randn(p.shape, generator=g) * 0.2 * p.float().std()
        if p.is_floating_point()
        else p
        for name, p in model.state_dict().items()
    }
    ckpt = tmp_path / "outputs" / "my-run" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    hyper = {"model": "tiny", "dtype": "float32"}
    torch.save({"hyper_parameters": hyper, "state_dict": state}, ckpt)
    out = tmp_path / "eval"
    quick = ["eval.tiny.limit=4", "eval.tiny.n=2", "eval.tiny.ks=[1,2]"]
    cfg = eval_config(
        f"senior={ckpt}", f"output_dir={out}", "with_base=true", "drift=false", *quick, *QUICK
    )
    with caplog.at_level("INFO"):
        results = run(cfg)
    assert results["label"] == "my-run:last"
    assert results["base"]["label"] == "tiny (base)"
    base = json.loads((out / "base" / "results.json").read_text())
    assert base["senior"] == "tiny" and base["label"] == "tiny (base)"
    assert json.loads((out / "results.json").read_text())["base"]["macro"] == base["macro"]
    (printed,) = [r.getMessage() for r in caplog.records if "results in" in r.getMessage()]
    assert "my-run:last" in printed and "tiny (base)" in printed
    row = next(line for line in printed.splitlines() if "solo/pass@1" in line).split()
    assert row[1:] == [f"{results['sets']['tiny']['solo/pass@1']:.3f}",
                       f"{base['sets']['tiny']['solo/pass@1']:.3f}"]  # fmt: skip


def test_an_evaluations_aim_run_is_named_by_its_label(tmp_path: Path) -> None:
    from aim import Repo
    from aim.sdk.index_manager import RepoIndexManager

    sets = {"tiny": {"solo/pass@1": 0.5}}
    results = {"label": "trl-seed0", "output_dir": "x", "sets": sets, "macro": sets["tiny"]}
    run_hash = log_to_aim(tmp_path / "aim", "eval", results, {})
    repo = Repo.from_path(str(tmp_path / "aim"))
    RepoIndexManager.get_index_manager(repo).index(run_hash)
    (aim_run,) = list(Repo.from_path(str(tmp_path / "aim")).iter_runs())
    assert aim_run.name == "eval: trl-seed0" and aim_run["results_dir"] == "x"


def test_a_stop_left_raised_by_an_earlier_run_does_not_stop_an_evaluation(tmp_path) -> None:
    # a training run stopped by a signal leaves the module's flag raised in its process (a
    # notebook's kernel, a test worker); an evaluation started after it is a run of its own
    from tandem.runs import stop

    stop.request(15)
    try:
        cfg = eval_config(
            f"output_dir={tmp_path}",
            "senior=tiny",
            "eval.tiny.limit=2",
            "eval.tiny.n=2",
            "eval.tiny.ks=[1,2]",
            "eval.tiny.max_new_tokens=16",
            *QUICK,
        )
        results = run(cfg)
    finally:
        stop.clear()
    assert results["sets"]["tiny"]["solo/pass@1"] >= 0
