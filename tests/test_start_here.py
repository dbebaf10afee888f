"""course/00_start_here.ipynb runs top to bottom without an error and shows what it promises."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "course" / "00_start_here.ipynb"


def _text(cell) -> str:
    return "".join(o.get("text", "") + "".join(str(v) for v in o.get("data", {}).values()) for o in cell.outputs)


@pytest.mark.slow
def test_start_here_runs_without_error(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(o.output_type != "error" for c in code for o in c.outputs)
    out = "\n".join(_text(c) for c in code)
    assert "good_softmax: visible tests passed" in out
    assert "wrong_softmax failed, as it should" in out  # the bad softmax is caught by the real check
    assert "flash attention" in out and "torch" in out
    widget_outputs = [o for c in code for o in c.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widget_outputs, "the widget cell did not produce a widget view"


def test_start_here_is_not_an_nbgrader_assignment():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any("nbgrader" in c.metadata for c in nb.cells)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit it without outputs"
