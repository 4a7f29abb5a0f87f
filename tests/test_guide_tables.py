"""The guide's reference sections keep up with the code: every option of every config group is
in its table, and every key a run logs is in "What is logged"."""

from __future__ import annotations

import re
from pathlib import Path

from tandem.train import run
from tests.modules.test_train import config, metrics_rows
from tests.paper_layouts import AUTHORS, ONE_PROCESS, TORCH

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "guide.md").read_text()
# the groups of conf/train.yaml, in the table's first column
TRAIN_GROUPS = (
    "sampler", "reward", "model", "data", "trainer", "logger", "module", "backend", "experiment",
    "recipe", "world",
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


# the plan tables' layouts: the overrides each row's layout column names, on reproduce_paper
LAYOUTS = {
    "as shipped": (),
    "`trainer=paper_gpus`": ONE_PROCESS,
    "`backend=torch`": TORCH,
    "`backend=torch trainer=paper_gpus`": (*TORCH, *ONE_PROCESS),
    "the authors' layout": AUTHORS,
}
# the memory table's rows: (devices, layout) -> (count, GiB each)
MEMORY_ROWS = {
    ("2 x 80 GB", "as shipped"): (2, 80),
    ("2 x 80 GB", "`backend=torch`"): (2, 80),
    ("2 x 80 GB", "the authors' layout"): (2, 80),
    ("1 x 80 GB", "`backend=torch trainer=paper_gpus`"): (1, 80),
    ("1 x 141 GB", "`trainer=paper_gpus`"): (1, 141),
    ("1 x 141 GB", "`backend=torch trainer=paper_gpus`"): (1, 141),
}
# the time table's rows: (devices, layout) -> (kind, count)
TIME_ROWS = {
    ("2 x A100 80 GB", "as shipped"): ("a100", 2),
    ("2 x H100 80 GB", "as shipped"): ("h100", 2),
    ("1 x H200 141 GB", "`trainer=paper_gpus`"): ("h200", 1),
    ("2 x A100 80 GB", "`backend=torch`"): ("a100", 2),
    ("2 x H100 80 GB", "`backend=torch`"): ("h100", 2),
    ("2 x A100 80 GB", "the authors' layout"): ("a100", 2),
    ("2 x H100 80 GB", "the authors' layout"): ("h100", 2),
    ("1 x H200 141 GB", "`backend=torch trainer=paper_gpus`"): ("h200", 1),
}


def table_rows(title: str, marker: str) -> list[list[str]]:
    """The cells of the table after ``title`` whose rows hold ``marker``."""
    text = GUIDE[GUIDE.index(title) :]
    text = text[: text.index("\n\n", text.index("\n|"))]
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and marker in line and "measured by them" not in line
    ]


def layout_of(rows: dict, row: list[str]) -> tuple[tuple, tuple[str, ...]]:
    """The row's devices and its layout's overrides (the longest layout its cell starts with)."""
    key = max(
        (k for k in rows if row[0] == k[0] and row[1].startswith(k[1])), key=lambda k: len(k[1])
    )
    return rows[key], LAYOUTS[key[1]]


def paper_config(arm: str, overrides: tuple[str, ...]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("reproduce_paper", [arm, *overrides])


def test_the_memory_tables_figures_are_the_plans() -> None:
    from tandem.plan import make_plan

    rows = table_rows("**The memory plan.**", "GiB, ")
    assert len(rows) == len(MEMORY_ROWS)
    for row in rows:
        (count, gib), overrides = layout_of(MEMORY_ROWS, row)
        devices = tuple((f"cuda:{i}", gib * 2**30) for i in range(count))
        plan = make_plan(paper_config("experiment=paper/trl", overrides), devices=devices)
        phases = ("rollout", "old_logprobs", "update", "step")
        cells = [
            " / ".join(f"{d.total(p) / 2**30:.1f}" for d in plan.devices if d.phases)
            for p in phases
        ]
        verdict = "fits" if plan.fits else "does not fit"
        assert row[2:6] == cells, f"{row[:2]}: the plan now gives {cells}"
        assert row[6] == f"{plan.peak / 2**30:.1f} GiB, {verdict}", f"{row[:2]}: its peak"


def test_the_time_tables_figures_are_the_plans() -> None:
    from tandem.plan import make_plan
    from tandem.plan.devices import named
    from tandem.plan.time import make_time_plan

    rows = table_rows("**The time plan.**", "min |")
    assert len(rows) == len(TIME_ROWS)
    for row in rows:
        (kind, count), overrides = layout_of(TIME_ROWS, row)
        device = named(kind)
        devices = tuple((f"cuda:{i}", device.memory) for i in range(count))
        figures = []
        for arm in ("experiment=paper/trl", "experiment=grpo"):
            cfg = paper_config(arm, overrides)
            plan = make_plan(cfg, devices=devices, fixes=False)
            assert plan.fits, f"{row[:2]}: does not fit"
            figures.append(make_time_plan(cfg, plan, device))
        trl, grpo = figures
        computed = [
            f"{trl.step_s / 60:.1f} min",
            f"{grpo.step_s / 60:.1f} min",
            f"{trl.run_h:.0f} / {grpo.run_h:.0f} h",
        ]
        assert row[7:10] == computed, f"{row[:2]}: the plan now gives {computed}"
        assert row[2] == f"{trl.phase_s('rollout'):.0f}", f"{row[:2]}: rollout"
