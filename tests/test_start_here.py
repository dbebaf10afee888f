"""course/00_start_here.ipynb runs top to bottom without an error and shows what it promises."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import nbformat
import pytest

from autograder import registry

NOTEBOOK = Path(__file__).resolve().parent.parent / "course" / "00_start_here.ipynb"


def _text(cell) -> str:
    return "".join(o.get("text", "") + "".join(str(v) for v in o.get("data", {}).values()) for o in cell.outputs)


@pytest.mark.slow
def test_start_here_runs_without_error(start_here_run, work_folder):
    """The session's run of the notebook in a learner's work folder (conftest.py's ``start_here_run``)."""
    nb = start_here_run
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(o.output_type != "error" for c in code for o in c.outputs)
    out = "\n".join(_text(c) for c in code)
    # the wrong softmax gets its hint, PyTorch's own is refused as delegation (no answer is shown passing)
    assert "wrong_softmax is not accepted, as it should be:\n  ✗ softmax: " in out, out
    assert "torch.softmax is not accepted, as it should be" in out and "not accepted: your code calls torch's" in out
    assert "python -m solutions.train --help" in out
    assert "flash attention" in out and "torch" in out
    widget_outputs = [o for c in code for o in c.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widget_outputs, "the widget cell did not produce a widget view"
    for chapter in registry.CHAPTERS:  # the chapter table comes from the registry, with links
        assert f"]({chapter.id}/{chapter.notebook})" in out
        for module in chapter.answers:
            assert re.search(rf"chapter {chapter.number}\s+{re.escape(module)}\s+available", out), module
    # the self-check command names the first chapter's notebook in the folder the notebook runs in
    (command,) = re.findall(r"^python -m autograder check (.+)$", out, re.MULTILINE)
    assert shlex.split(command) == [str(work_folder / registry.CHAPTERS[0].id / registry.CHAPTERS[0].notebook)]


def test_start_here_is_not_an_nbgrader_assignment():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any("nbgrader" in c.metadata for c in nb.cells)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit it without outputs"


def test_start_here_says_where_the_work_is_and_needs_no_answer_module():
    """It works in a student edition (answers withheld): it imports no chapter's answer module directly."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "work folder" in text and "`work/`" in text
    answers = set(registry.answer_modules())
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert not [m for m in answers if re.search(rf"^\s*(from|import) {re.escape(m)}\b", code, re.MULTILINE)]
