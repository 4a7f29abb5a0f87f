"""Every bad input of a start is one message and exit status 2, with no traceback and no run
folder (or sweep folder, or Aim run) left behind: the settings that would train nothing, keys of
every component (refused before any model library loads), a batch the data cannot fill, own data
with no validation rows, model folders whose config.json is missing, empty, ``{}`` or ill-typed
or that hold no tokenizer, a refusal found only as the data loads; and ``tandem.plan``'s own
bad inputs (a negative batch, devices the run does not use, a device of 0 GiB).

``benchmarks/refusal.py`` times the same cases.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.assets import TINY_WORLD
from tests.refusal import train_cli

ROOT = Path(__file__).resolve().parents[1]
ROW = json.dumps({"problem": "What is 1 + 1?", "answer": "2"})
OWN_DATA = ["data=deepscaler", "data.path=json", "data.root=null"]


def refused(proc: subprocess.CompletedProcess) -> str:
    """The one message of a refused start (its lines after the first start with ``- ``)."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(("config error: ", "tandem.train: ")), lines
    assert all(line.startswith("- ") for line in lines[1:]), lines
    return proc.stderr


@pytest.mark.parametrize(
    "override, words",
    [
        ("sampler.p=0", "sampler.p (0) never gives the senior the pen"),
        ("generation.top_k=1", "generation.top_k (1) keeps only the likeliest token"),
        ("+trainer.max_stesp=3", "Did you mean trainer.max_steps?"),
        ("+sampler.pp=0.3", "unknown argument 'pp' (did you mean 'p'?)"),
        ("+reward.timout=3", "unknown argument 'timout' (did you mean 'timeout'?)"),
        ("+module.loss.kl_bta=1", "Did you mean module.loss.kl_beta?"),
        ("sampler.name=wrod", "unknown sampler 'wrod'"),
        ("+metrics.x=nope", "metrics.x: unknown metric 'nope'"),
        ("batch_size=100000000", "more than the 20000 training prompts"),
        (f"+junior={TINY_WORLD}", "Did you mean model.junior_name_or_path?"),
    ],
)
def test_what_the_config_shows_is_refused_before_imports(override: str, words: str) -> None:
    proc, heavy = train_cli(override, "hydra.run.dir=${oc.env:TMPDIR,/tmp}/never-made")
    assert words in refused(proc)
    assert heavy == [], f"imported {heavy} before refusing"


def test_own_data_without_validation_rows_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text(f"{ROW}\n" * 8)
    out = tmp_path / "run"
    proc, heavy = train_cli(
        *OWN_DATA, f"+data.data_files={data}", "data.holdout=0", f"hydra.run.dir={out}"
    )
    assert "data has no validation split" in refused(proc) and heavy == []
    assert not out.exists()
    one = tmp_path / "one.jsonl"
    one.write_text(f"{ROW}\n")
    proc, _ = train_cli(
        *OWN_DATA, f"+data.data_files={one}", "data.holdout=1", f"hydra.run.dir={out}"
    )
    assert "data.holdout (1) would hold out every one of the 1 rows" in refused(proc)
    assert not out.exists()


@pytest.fixture
def bad_models(tmp_path: Path) -> Path:
    """Copies of the tiny world's folder, each broken one way."""
    for name in ("empty", "braces", "typed", "missing", "untokenized"):
        shutil.copytree(TINY_WORLD, tmp_path / name, ignore=shutil.ignore_patterns("stage1"))
    (tmp_path / "empty" / "config.json").write_text("")
    (tmp_path / "braces" / "config.json").write_text("{}")
    spec = json.loads((TINY_WORLD / "config.json").read_text())
    spec["hidden_size"] = "big"
    (tmp_path / "typed" / "config.json").write_text(json.dumps(spec))
    (tmp_path / "missing" / "config.json").unlink()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tmp_path / "untokenized" / name).unlink()
    return tmp_path


@pytest.mark.parametrize(
    "key, folder, words",
    [
        ("name_or_path", "empty", "config.json is not JSON"),
        ("name_or_path", "braces", "config.json names no model_type"),
        ("name_or_path", "typed", "config.json cannot be read: TypeError: Field 'hidden_size'"),
        ("name_or_path", "missing", "has no config.json"),
        ("junior_name_or_path", "untokenized", "holds no tokenizer"),
    ],
)
def test_a_broken_model_folder_is_named(bad_models, tmp_path, key, folder, words) -> None:
    out = tmp_path / "run"
    proc, _ = train_cli(f"model.{key}={bad_models / folder}", f"hydra.run.dir={out}")
    assert words in refused(proc) and f"model.{key}" in proc.stderr
    assert not out.exists(), "a refused start leaves no folder (no run.lock, no train.log)"


def test_the_shipped_first_stage_is_a_junior_with_its_tokenizer() -> None:
    from tandem.config_models import check_model_folder

    problems: list[str] = []
    check_model_folder(problems, "model.junior_name_or_path", str(TINY_WORLD / "stage1"))
    assert problems == []


def test_a_refusal_as_the_data_loads_takes_its_start_back(tmp_path: Path) -> None:
    # no prompt fits one token: found only once the prompts are tokenized, after the start's
    # records and its Aim run were made
    out, aim = tmp_path / "run", tmp_path / "aim"
    proc, _ = train_cli(
        "data.max_prompt_tokens=1",
        "+data.sizes={train:16,validation:4}",
        "batch_size=8",
        f"hydra.run.dir={out}",
        env={**os.environ, "TANDEM_AIM_REPO": str(aim)},
    )
    assert "no train prompt is left" in refused(proc)
    assert not out.exists()
    from aim import Repo

    assert list(Repo.from_path(str(aim)).iter_runs()) == []


def test_a_refused_sweep_leaves_no_sweep_folder(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc, _ = train_cli("-m", "sampler.p=0,0.5", f"hydra.sweep.dir={sweep}")
    assert "sampler.p (0) never gives the senior the pen" in refused(proc)
    assert not sweep.exists()


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tandem.plan", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.parametrize(
    "args, words",
    [
        (["batch_size=-4"], "batch_size (-4) must be a positive integer"),
        (["--devices", "1x0"], "must be COUNTxKIND or COUNTxGIB with a count >= 1 and a size > 0"),
        (["--devices", "2x80", "trainer=gpu"], "the run uses 1 of them"),
        (["--config-name", "reproduce_paper", "--devices", "3x80"], "the run uses 2 of them"),
    ],
)
def test_the_plan_refuses_what_it_cannot_plan(args: list[str], words: str) -> None:
    proc = plan(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.startswith("config error: ") and words in proc.stderr


@pytest.mark.parametrize("folder", ["empty", "braces", "typed", "missing"])
def test_the_plan_names_a_broken_config_json(bad_models, folder: str) -> None:
    proc = plan(f"model.name_or_path={bad_models / folder}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.startswith("config error: model.name_or_path")
