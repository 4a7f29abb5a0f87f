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


# the time plan's table: each row's devices and the overrides its layout column names
TIME_ROWS = {
    ("2 x A100 80 GB", "as shipped"): ("a100", 2, ()),
    ("2 x H100 80 GB", "as shipped"): ("h100", 2, ()),
    ("1 x H200 141 GB", "`model.junior_device=null`"): ("h200", 1, ("model.junior_device=null",)),
    ("2 x A100 80 GB", "FSDP2 over both cards"): ("a100", 2, "fsdp"),
    ("2 x H100 80 GB", "FSDP2 over both cards"): ("h100", 2, "fsdp"),
    ("2 x A100 80 GB", "the vLLM pair"): ("a100", 2, "vllm"),
    ("2 x H100 80 GB", "the vLLM pair"): ("h100", 2, "vllm"),
    ("1 x H200 141 GB", "the vLLM pair"): ("h200", 1, ("model.junior_device=null", "vllm")),
}
FSDP_BOTH = (
    "trainer=fsdp_gpu",
    "trainer.devices=2",
    "model.junior_device=null",
    "trainer.strategy.activation_checkpointing=true",
    "generation.kv_cache_gib=32",
)
VLLM = (
    "module.backend.name=vllm",
    "+module.backend.dtype=bfloat16",
    "+module.backend.engine_args.gpu_memory_utilization=0.5",
)


def test_the_time_tables_figures_are_the_plans() -> None:
    from hydra import compose, initialize_config_dir

    from tandem.plan import make_plan
    from tandem.plan.devices import named
    from tandem.plan.time import make_time_plan

    text = GUIDE[GUIDE.index("**The time plan.**") :]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and "min |" in line and "measured by them" not in line
    ]
    assert len(rows) == len(TIME_ROWS)
    for row in rows:
        kind, count, layout = next(
            v
            for (devices, start), v in TIME_ROWS.items()
            if row[0] == devices and row[1].startswith(start)
        )
        overrides = {"fsdp": FSDP_BOTH, "vllm": VLLM}.get(layout) or tuple(
            x for part in layout for x in ({"vllm": VLLM}.get(part) or (part,))
        )
        device = named(kind)
        devices = tuple((f"cuda:{i}", device.memory) for i in range(count))
        figures = []
        for arm in ("experiment=paper/trl", "experiment=grpo"):
            with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
                cfg = compose("reproduce_paper", [arm, *overrides])
            timed = make_time_plan(cfg, make_plan(cfg, devices=devices, fixes=False), device)
            figures.append(timed)
        trl, grpo = figures
        computed = [
            f"{trl.step_s / 60:.1f} min",
            f"{grpo.step_s / 60:.1f} min",
            f"{trl.run_h:.0f} / {grpo.run_h:.0f} h",
        ]
        assert row[7:10] == computed, f"{row[:2]}: the plan now gives {computed}"
        assert row[2] == f"{trl.phase_s('rollout'):.0f}", f"{row[:2]}: rollout"
