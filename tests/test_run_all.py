"""Run All on a chapter nobody has started runs every cell, and still scores 0.

The release tags each graded test cell with the registry's Run All tag (`RUN_ALL_TAG`): JupyterLab's Run All (the browser
test runs it for real, on every chapter), nbclient and nbconvert then go on past that cell's error.
nbgrader grades a test cell by the error in its output, not by its tags, and `autograder grade`
never reads the notebook's test cells at all: an unfinished exercise still scores 0 in both.

The untouched releases are run once in the session, by nbgrader (``nbgrader_course``) and graded by
``autograder grade`` in the shared batch (``grading_batch``); the tests here read those runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import nbformat
import pytest
import support
from support import sandboxed

from autograder import registry
from autograder.registry import RUN_ALL_TAG

CHAPTERS = [c for c in registry.CHAPTERS if c.release_path().is_file()]
pytestmark = pytest.mark.skipif(not CHAPTERS, reason="no chapter released in course/")


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _is_test_cell(cell) -> bool:
    return bool(_meta(cell).get("grade")) and not _meta(cell).get("solution")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.id)
def test_release_tags_exactly_the_test_cells_raises_exception(chapter):
    nb = nbformat.read(chapter.release_path(), as_version=4)
    tagged = [_meta(c).get("grade_id") for c in nb.cells if RUN_ALL_TAG in c.get("metadata", {}).get("tags", [])]
    assert tagged == [ex.tests_id for ex in chapter.exercises]
    assert all(_is_test_cell(c) for c in nb.cells if RUN_ALL_TAG in c.get("metadata", {}).get("tags", []))


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.id)
def test_untouched_release_runs_every_cell_and_each_unfinished_exercise_says_so_in_one_line(nbgrader_course, chapter):
    """The untouched release as nbgrader ran it (the session's autograde): every code cell ran, only the test
    cells failed, each with one "not done yet" line, and the cells below the first exercise showed something.
    That JupyterLab's Run All really goes on past those cells (the tag) is the browser test's."""
    nb = nbgrader_course.autograded(chapter.id).notebook("untouched")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "a code cell did not run"
    errors = {_meta(c).get("grade_id"): o for c in code for o in c.outputs if o.output_type == "error"}
    assert set(errors) == {ex.tests_id for ex in chapter.exercises}
    for grade_id, error in errors.items():
        assert error.ename == "NotDone", (grade_id, error.ename)
        assert len(error.traceback) == 1 and "not done yet" in error.traceback[0], error.traceback  # one line
    # the cells below the first unfinished exercise ran and showed something (widgets, figures, or a
    # demo's "run it again once that exercise is done")
    first_test = next(i for i, c in enumerate(nb.cells) if _is_test_cell(c))
    shown = [o for c in nb.cells[first_test + 1:] if c.cell_type == "code" and not _is_test_cell(c) for o in c.outputs]
    assert shown, "nothing was shown below the first exercise"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_nbgrader_validate_still_fails_an_untouched_release(tmp_path):
    chapter = CHAPTERS[0]
    notebook = tmp_path / chapter.notebook
    shutil.copyfile(chapter.release_path(), notebook)
    out = subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(notebook)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600, env=support.kernel_env())
    text = out.stdout + out.stderr
    assert "Success! Your notebook passes all the tests." not in text
    assert f"VALIDATION FAILED ON {len(chapter.exercises)} CELL(S)" in text, text[-3000:]
    for exercise in chapter.exercises:  # nbgrader shortens each error to its first characters
        assert f"✗ {exercise.name}:" in text, text[-3000:]


@sandboxed
def test_autograder_grade_scores_an_untouched_release_zero(grading_batch):
    """Every chapter's untouched release, graded in the shared batch: every exercise 0 points, 'missing'."""
    rows = grading_batch.rows("release_untouched")
    assert len(rows) == sum(len(c.exercises) for c in CHAPTERS)
    assert all(float(r["points"]) == 0 for r in rows), [r for r in rows if float(r["points"])]
    assert {r["status"] for r in rows} == {"missing"}, {r["status"] for r in rows}
    assert sum(float(r["max_points"]) for r in rows) == sum(c.points for c in CHAPTERS)
