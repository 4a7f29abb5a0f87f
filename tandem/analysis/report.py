"""Loading and plotting for the analysis notebooks: the notebooks call these and nothing else.

Sources: evaluation outputs (``results.json`` and ``generations/<set>.jsonl`` under a folder,
searched recursively, one ``tandem.evaluate`` run per method), or the same tables from Aim; and
training logs (``csv/version_*/metrics.csv`` under training run folders). Every table comes back
as a long pandas DataFrame (``label, set, metric, value``; ``run, step, key, value``), every plot
as a matplotlib Figure, and a rollout as HTML with the senior's and the junior's text in two
colours.

What this file leaves out: computing anything (``tandem.evaluate``, ``tandem.analysis``).
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from tandem.evaluation.records import read_records

COLORS = {"senior": "#1f5fbf", "junior": "#c0392b"}
DRIFT_LEGIBILITY = ("drift/kl", "legibility/junior_ce", "legibility/overlap")
TRAINING_KEYS = ("train/reward", "train/senior_share", "val/tandem/accuracy", "val/solo/accuracy")


@dataclass(frozen=True)
class NotebookPaths:
    """Where a notebook reads from (environment variables, with defaults under the project).

    Attributes:
        results: evaluation outputs (``TANDEM_RESULTS``, default ``outputs/eval``).
        runs: folders of training runs (``TANDEM_RUNS``, several joined by ``:``; default
            ``outputs`` and ``multirun``, where sweeps write).
        aim_repo: an Aim repository to read the tables from instead of the JSON
            (``TANDEM_AIM_REPO``; None: read the JSON).
    """

    results: Path
    runs: tuple[Path, ...]
    aim_repo: Path | None


def notebook_paths() -> NotebookPaths:
    """The paths from the environment; relative defaults start at the project root."""
    root = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
    aim = os.environ.get("TANDEM_AIM_REPO")
    return NotebookPaths(
        results=Path(os.environ.get("TANDEM_RESULTS", root / "outputs" / "eval")),
        runs=tuple(Path(p) for p in runs.split(os.pathsep))
        if (runs := os.environ.get("TANDEM_RUNS"))
        else (root / "outputs", root / "multirun"),
        aim_repo=Path(aim) if aim else None,
    )


def load_results(folder: str | Path, aim_repo: str | Path | None = None) -> pd.DataFrame:
    """Every evaluation's tables: ``label, set, metric, value, results_dir`` (long format).

    Reads Aim when ``aim_repo`` is given, else every ``results.json`` under ``folder``.
    """
    if aim_repo is not None:
        return load_aim(aim_repo)
    rows = []
    for path in sorted(Path(folder).rglob("results.json")):
        results = json.loads(path.read_text())
        for name, table in [*results["sets"].items(), ("macro", results["macro"])]:
            for metric, value in table.items():
                rows.append((results["label"], name, metric, value, str(path.parent)))
    if not rows:
        raise FileNotFoundError(
            f"no results.json under {folder}: run python -m tandem.evaluate output_dir=... or "
            "set TANDEM_RESULTS to the folder that holds its outputs."
        )
    return pd.DataFrame(rows, columns=["label", "set", "metric", "value", "results_dir"])


def load_aim(repo: str | Path) -> pd.DataFrame:
    """The ``eval/*`` values of every run in an Aim repository, as ``load_results`` gives them."""
    from aim import Repo
    from aim.sdk.index_manager import RepoIndexManager

    aim_repo = Repo.from_path(str(repo))
    # closed runs are only readable once indexed, which `aim up` does in the background
    indexer = RepoIndexManager.get_index_manager(aim_repo)
    for run_hash in aim_repo.list_all_runs():
        indexer.index(run_hash)
    rows = []
    for run in Repo.from_path(str(repo)).iter_runs():
        for metric in run.metrics():
            if metric.name.startswith("eval/"):
                name = metric.context.to_dict().get("set")
                value = metric.values.values_list()[-1]
                label, folder = run.get("label"), run.get("results_dir")
                rows.append((label, name, metric.name[5:], value, folder))
    return pd.DataFrame(rows, columns=["label", "set", "metric", "value", "results_dir"])


def metric_table(results: pd.DataFrame, sets: tuple[str, ...] = ("macro",)) -> pd.DataFrame:
    """A wide table: one row per (label, set), one column per metric."""
    chosen = results[results["set"].isin(sets)]
    return chosen.pivot_table(index=["label", "set"], columns="metric", values="value")


def pass_at_k(results: pd.DataFrame) -> pd.DataFrame:
    """The pass@k rows: ``label, set, mode, k, value``."""
    parts = results["metric"].str.extract(r"^(?P<mode>\w+)/pass@(?P<k>\d+)$")
    rows = results.join(parts).dropna(subset=["k"])
    rows = rows.assign(k=rows["k"].astype(int))
    return rows[["label", "set", "mode", "k", "value"]].sort_values(["label", "set", "mode", "k"])


def plot_pass_at_k(results: pd.DataFrame) -> plt.Figure:
    """pass@k against k, one panel per set; solo solid, handoff dashed, one colour per method."""
    curves = pass_at_k(results)
    sets = list(dict.fromkeys(curves["set"]))
    fig, axes = plt.subplots(1, len(sets), figsize=(4 * len(sets), 3.5), squeeze=False)
    labels = list(dict.fromkeys(curves["label"]))
    for ax, name in zip(axes[0], sets, strict=True):
        for (label, mode), rows in curves[curves["set"] == name].groupby(["label", "mode"]):
            color = f"C{labels.index(label)}"
            style = "-" if mode == "solo" else "--"
            name_ = f"{label} {mode}"
            ax.plot(rows["k"], rows["value"], style, marker="o", color=color, label=name_)
        ax.set_xscale("log", base=2)
        ax.set(title=name, xlabel="k", ylabel="pass@k", ylim=(0, 1.02))
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_drift_legibility(results: pd.DataFrame, set_name: str = "macro") -> plt.Figure:
    """Drift (KL to the base), the junior's cross-entropy and the overlap, per method."""
    rows = results[(results["set"] == set_name) & results["metric"].isin(DRIFT_LEGIBILITY)]
    table = rows.pivot_table(index="label", columns="metric", values="value")
    fig, axes = plt.subplots(1, len(DRIFT_LEGIBILITY), figsize=(4 * len(DRIFT_LEGIBILITY), 3.2))
    titles = ("KL(senior || base), nats/token", "junior CE, nats/token", "overlap sum min(p, q)")
    for ax, key, title in zip(axes, DRIFT_LEGIBILITY, titles, strict=True):
        values = table[key] if key in table else pd.Series(dtype=float)
        ax.bar(values.index.astype(str), values.values, color=[f"C{i}" for i in range(len(values))])
        ax.set(title=title)
    fig.suptitle(f"drift and legibility ({set_name})")
    fig.tight_layout()
    return fig


def load_training_curves(folder: str | Path | Sequence[str | Path]) -> pd.DataFrame:
    """Every ``csv/version_*/metrics.csv`` under ``folder`` (or each of several folders; one
    that does not exist holds none): ``run, step, key, value`` (long)."""
    folders = [folder] if isinstance(folder, str | Path) else list(folder)
    frames = []
    paths = (p for f in folders for p in sorted(Path(f).rglob("csv/version_*/metrics.csv")))
    for path in paths:
        frame = pd.read_csv(path)
        if "step" not in frame:
            continue
        keys = [c for c in frame.columns if c not in ("step", "epoch")]
        long = frame.melt(id_vars=["step"], value_vars=keys, var_name="key").dropna()
        frames.append(long.assign(run=run_name(path.parents[2])))
    if not frames:
        return pd.DataFrame(columns=["run", "step", "key", "value"])
    return pd.concat(frames, ignore_index=True)[["run", "step", "key", "value"]]


def run_name(folder: Path) -> str:
    """A run's legend name: its folder's, or for a sweep's job (folders ``0``, ``1``, ...) the
    overrides Hydra recorded for it (``experiment=trl,seed=0``)."""
    overrides = folder / ".hydra" / "overrides.yaml"
    if folder.name.isdigit() and overrides.is_file():
        items = [line[2:].strip() for line in overrides.read_text().splitlines()]
        items = [i for i in items if i and not i.startswith(("hydra.", "output_dir="))]
        if items:
            return ",".join(items)
    return folder.name


def plot_training(curves: pd.DataFrame, keys: tuple[str, ...] = TRAINING_KEYS) -> plt.Figure:
    """One panel per logged key (those of ``keys`` present), one line per run."""
    keys = tuple(k for k in keys if k in set(curves["key"])) or ("(no training logs found)",)
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for run, rows in curves[curves["key"] == key].groupby("run"):
            # markers: a validation key has a point every few steps, or one
            ax.plot(rows["step"], rows["value"], label=run, marker="o", markersize=3)
        ax.set(title=key, xlabel="step")
        if ax.has_data():
            ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def load_generations(folder: str | Path, set_name: str | None = None) -> list[dict[str, Any]]:
    """The records of every ``generations/<set>.jsonl`` under ``folder`` (one set, or all)."""
    pattern = f"generations/{set_name or '*'}.jsonl"
    return [r for path in sorted(Path(folder).rglob(pattern)) for r in read_records(path)]


def pick_rollout(records: list[dict[str, Any]], mode: str = "handoff") -> dict[str, Any]:
    """A rollout of ``mode`` written by both models, a correct one if there is one."""
    mixed = [r for r in records if r["mode"] == mode and len({a for a, _ in r["spans"]}) > 1]
    candidates = mixed or [r for r in records if r["mode"] == mode] or records
    if not candidates:
        raise ValueError("no records to show: the evaluation wrote no generations.")
    return max(candidates, key=lambda r: r["reward"])


def rollout_html(record: dict[str, Any]) -> str:
    """The rollout as HTML: the senior's spans in blue, the junior's in red."""
    spans = "".join(
        f'<span style="color:{COLORS.get(author, "#555")}" title="{author}">'
        f"{html.escape(text)}</span>"
        for author, text in record["spans"]
    )
    legend = " ".join(
        f'<span style="color:{c}; font-weight:bold">{who}</span>' for who, c in COLORS.items()
    )
    head = (
        f"<p><b>{html.escape(record['set'])}</b> problem {record['problem_index']} sample "
        f"{record['sample']} ({record['mode']}): reward {record['reward']:.0f}, gold "
        f"{html.escape(str(record['answer']))}. {legend}</p>"
        f"<p><i>{html.escape(record['problem'])}</i></p>"
    )
    return f'{head}<pre style="white-space: pre-wrap">{spans}</pre>'


def show_rollout(records: list[dict[str, Any]], mode: str = "handoff") -> Any:
    """``rollout_html(pick_rollout(...))`` as a notebook display object."""
    from IPython.display import HTML

    return HTML(rollout_html(pick_rollout(records, mode)))
