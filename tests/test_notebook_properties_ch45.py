"""The notebook properties of chapters 4 and 5 (tests/notebook_properties_ch45.py) flag what they should, on small
notebooks made here; the shared notebook runs call them on the executed chapters."""

from __future__ import annotations

import nbformat

from autograder.registry import TESTS_SUFFIX
from notebook_properties_ch45 import SOLVED_LINES, UNTOUCHED_LINES, solved_source_problems, untouched_release_problems

WIDGET = {"output_type": "display_data", "data": {"application/vnd.jupyter.widget-view+json": {"model_id": "x"},
                                                   "text/plain": "interactive(...)"}, "metadata": {}}


def _cell(cell_id: str, text: str = "", *, error: str | None = None, test: bool = False, widget: bool = False):
    cell = nbformat.v4.new_code_cell("pass")
    cell["id"] = cell_id
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)] if text else []
    if error:
        cell.outputs.append(nbformat.v4.new_output("error", ename="NotImplementedError" if "not done" in error
                                                   else "RuntimeError", evalue=error, traceback=[]))
    if widget:
        cell.outputs.append(nbformat.from_dict(WIDGET))
    if test:
        cell.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": cell_id + TESTS_SUFFIX, "points": 1}
    return cell


def _notebook(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


def test_untouched_release_properties_pass_a_quiet_release_and_flag_each_problem():
    chapter = "04_encoder_decoder"
    printed = "\n".join(UNTOUCHED_LINES[chapter])
    good = _notebook(_cell("a", printed, widget=True), _cell("t", "✗ teacher_forcing: not done yet",
                                                              error="not done yet", test=True))
    assert untouched_release_problems(chapter, good) == []
    noisy = _notebook(_cell("a", printed + "\n(this cell uses your teacher_forcing)", widget=True),
                      _cell("b", error="shape mismatch"), _cell("t", "passed", test=True))
    problems = untouched_release_problems(chapter, noisy)
    assert any("per-cell notice" in p for p in problems)
    assert any("cell b raised RuntimeError" in p for p in problems)
    assert any("test cell t" in p for p in problems)
    assert untouched_release_problems(chapter, _notebook(_cell("a", "training pairs"))) != []  # no widget, lines


def test_solved_source_properties_need_every_measured_line_and_no_error():
    chapter = "05_vision_transformer"
    printed = "\n".join(SOLVED_LINES[chapter])
    assert solved_source_problems(chapter, _notebook(_cell("a", printed, widget=True))) == []
    missing = solved_source_problems(chapter, _notebook(_cell("a", printed.replace("[CLS]:", ""), widget=True),
                                                        _cell("b", "(appears once exercise 7 passes)")))
    assert "nothing prints '[CLS]:'" in missing
    assert any("still waits" in p for p in missing)
    assert any("raised" in p for p in solved_source_problems(chapter, _notebook(
        _cell("a", printed, widget=True), _cell("b", error="boom"))))
