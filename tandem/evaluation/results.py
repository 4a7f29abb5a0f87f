"""Result tables: one per eval set plus the macro average, as JSON and CSV, and to Aim.

``results.json`` holds the run's description (label, senior, junior, sampler, config), every
set's table (metric -> value), each set's data report (unusable rows) and the macro average;
``results.csv`` holds one row per set and a last row ``macro``. The macro average of a metric is
the plain mean over the sets that report it (each set weighs the same, whatever its size), and
every metric of the tables gets one. For the paper's figures this is the whole recipe: pass@k
is the mean over a set's problems, then the macro mean over sets; ``legibility/junior_ce`` the
mean over a set's chains of thought of each one's mean NLL per token, then the macro mean over
sets (the authors' ``macro_ce``). The per-token figures (drift, overlap,
``legibility/junior_ce_pooled``) pool tokens within a set and are then macro-averaged the same.

``format_tables`` is what ``tandem.evaluate`` prints: per set, one row per metric and one
column per evaluated model (the senior, its base beside it), rounded.

What this file leaves out: computing the values (``tandem.evaluation.runner``).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

MACRO = "macro"


def macro_average(tables: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per metric, the mean over the sets that report it (NaN values are left out)."""
    keys = sorted({k for table in tables.values() for k in table})
    out = {}
    for key in keys:
        values = [t[key] for t in tables.values() if key in t and not math.isnan(t[key])]
        if values:
            out[key] = sum(values) / len(values)
    return out


def write_results(
    folder: str | Path, tables: dict[str, dict[str, float]], meta: dict[str, Any]
) -> dict[str, Any]:
    """Write ``results.json`` and ``results.csv`` to ``folder``; returns what the JSON holds."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    macro = macro_average(tables)
    results = {**meta, "sets": tables, MACRO: macro}
    (folder / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    columns = sorted({k for t in (*tables.values(), macro) for k in t}, key=_column_order)
    with (folder / "results.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["set", *columns])
        for name, table in [*tables.items(), (MACRO, macro)]:
            writer.writerow([name, *(_cell(table.get(c)) for c in columns)])
    return results


def log_to_aim(
    repo: str | Path, experiment: str, results: dict[str, Any], params: dict[str, Any]
) -> str:
    """Track every value as ``eval/<metric>`` with context ``{"set": name}``; returns the run hash.

    The run's ``hparams`` hold ``params`` (the config) and its ``results_dir`` the folder with
    the JSON, CSV and generations, so that a notebook can go from Aim to the records.
    """
    from aim import Run  # imported here: Aim starts slowly and is optional

    run = Run(repo=str(repo), experiment=experiment, system_tracking_interval=None)
    try:
        run["hparams"] = params
        run["label"] = results.get("label")
        # shown in Aim's run list instead of the hash
        run.name = f"eval: {results.get('label')}"
        run["results_dir"] = str(results.get("output_dir"))
        for name, table in [*results["sets"].items(), (MACRO, results[MACRO])]:
            for metric, value in table.items():
                if not math.isnan(value):
                    run.track(float(value), name=f"eval/{metric}", context={"set": name})
        return run.hash
    finally:
        run.close()


def format_tables(results: list[dict[str, Any]], digits: int = 3) -> str:
    """The tables of one or more evaluations (``results.json`` contents) side by side: a block
    per set and one for the macro average, a row per metric, a column per evaluation's label."""
    labels = [str(r.get("label")) for r in results]
    sets = list(dict.fromkeys(s for r in results for s in r["sets"]))
    blocks = []
    # the macro average of one set is that set again
    for name in [*sets, MACRO] if len(sets) > 1 else sets:
        tables = [r[MACRO] if name == MACRO else r["sets"].get(name, {}) for r in results]
        metrics = sorted({k for t in tables for k in t}, key=_column_order)
        if not metrics:
            continue
        width = max(len(m) for m in metrics) + 2
        columns = [max(len(label), digits + 3) for label in labels]
        head = f"{name:<{width}}" + "  ".join(
            f"{x:>{w}}" for x, w in zip(labels, columns, strict=True)
        )
        rows = [head]
        for metric in metrics:
            cells = [_rounded(t.get(metric), digits) for t in tables]
            rows.append(
                f"  {metric:<{width - 2}}"
                + "  ".join(f"{c:>{w}}" for c, w in zip(cells, columns, strict=True))
            )
        blocks.append("\n".join(rows))
    return "\n\n".join(blocks)


def _rounded(value: float | None, digits: int) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def _column_order(key: str) -> tuple[Any, ...]:
    # solo before handoff before the rest; pass@k by k, not by its text
    mode, _, metric = key.partition("/")
    rank = {"solo": 0, "handoff": 1, "drift": 2, "legibility": 3}.get(mode, 4)
    if metric.startswith("pass@") and metric[5:].isdigit():
        return (rank, 0, int(metric[5:]), metric)
    return (rank, 1, 0, metric)


def _cell(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"
