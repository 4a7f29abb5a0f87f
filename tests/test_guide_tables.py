"""The guide's reference sections keep up with the code: every option of every config group is
in its table, and every key a run logs is in "What is logged"."""

from __future__ import annotations

import re
from pathlib import Path

from tandem.train import run
from tests.modules.test_train import config, metrics_rows

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "guide.md").read_text()
# the groups of conf/train.yaml, in the table's first column
TRAIN_GROUPS = (
    "sampler", "reward", "model", "data", "trainer", "logger", "module", "experiment", "recipe",
    "world",
)  # fmt: skip


def section(title: str) -> str:
    start = GUIDE.index(f"### {title}\n")
    end = GUIDE.find("\n### ", start + 1)
    return GUIDE[start:end]


def options(group: str) -> set[str]:
    folder = ROOT / "conf" / group
    return {str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml")}


def test_every_option_of_every_group_is_in_the_guides_table() -> None:
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `(\w+)` \| ([^|]*) \|", section("Config groups"), re.M)
    }
    assert set(TRAIN_GROUPS) <= set(rows), sorted(set(TRAIN_GROUPS) - set(rows))
    for group in TRAIN_GROUPS:
        missing = options(group) - set(re.findall(r"`([\w/]+)`", rows[group]))
        assert not missing, f"conf/{group}: {sorted(missing)} not in the guide's table"
    # the evaluation's own groups, in the paragraph below the table
    text = section("Config groups")
    for group in ("eval", "paper_solo", "study"):
        missing = {o for o in options(group) if f"`{o}`" not in text}
        assert not missing, f"conf/{group}: {sorted(missing)} not in the guide"


def test_every_key_a_run_logs_is_in_what_is_logged(tmp_path: Path) -> None:
    run(config(tmp_path, "trainer.max_steps=2", "validation.every_n_steps=1"))
    logged = {k for row in metrics_rows(tmp_path) for k, v in row.items() if v} - {"epoch", "step"}
    text = section("What is logged")
    named = set(re.findall(r"`([\w/@]+)`", text))
    missing = set()
    for key in logged:
        # val/<solo|tandem>/<metric>: the metrics of conf/train.yaml, named once as train/<metric>
        metric = key.partition("/")[2].partition("/")[2]
        if key.startswith("val/") and metric != "accuracy":
            key = f"train/{metric}"
        if key not in named:
            missing.add(key)
    assert not missing, f"logged but not in the guide: {sorted(missing)}"
