"""notebooks/analysis.ipynb runs top to bottom on a tiny evaluation's outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "analysis.ipynb"


def test_notebook_is_stored_without_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_notebook_runs_on_evaluation_outputs(
    eval_outputs: Path, training_runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TANDEM_RESULTS", str(eval_outputs / "results"))
    monkeypatch.setenv("TANDEM_RUNS", str(training_runs))
    monkeypatch.delenv("TANDEM_AIM_REPO", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    where = {"metadata": {"path": str(NOTEBOOK.parent)}}
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources=where)
    client.execute()  # raises CellExecutionError on any failing cell
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    pages = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert len(images) == 3  # pass@k, training curves, drift and legibility
    assert any('title="junior"' in p and 'title="senior"' in p for p in pages)


def test_notebook_says_how_to_run_it_with_what_the_dev_extra_installs() -> None:
    import sys

    intro = "".join(nbformat.read(NOTEBOOK, as_version=4).cells[0].source)
    command = "jupyter execute notebooks/analysis.ipynb --output=analysis_run"
    assert command in intro and "TANDEM_RUNS=multirun" in intro
    # beside this Python, where the environment's scripts are, activated or not
    assert (Path(sys.executable).parent / "jupyter-execute").is_file(), "no `jupyter execute`"
