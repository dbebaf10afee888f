"""Every chapter notebook runs, and nbgrader grades it as intended.

Generic over the registry's chapters. The session's nbgrader course (``nbgrader_course`` in conftest.py)
generates each chapter once and grades all its students in one ``nbgrader autograde``; a chapter is
touched only when one of its tests runs (``-k 04_encoder_decoder`` touches chapter 4 alone):

* ``filled``    — the release with every solution cell taken from the source. It is checked to be the
                  source notebook cell for cell (only the hidden tests differ, and autograde puts them
                  back), so its run is the source notebook executed top to bottom: no cell may fail, the
                  visible tests must pass and the score is full marks;
* ``untouched`` — the release as students get it: 0 points, and only the test cells fail, with
                  NotImplementedError (tests/test_run_all.py reads the same run);
* ``one``       — the release with only the first exercise solved: exactly that exercise's points.

nbgrader executes with nbconvert's ExecutePreprocessor, i.e. nbclient. The generated release is also
compared with the committed ``course/`` (``test_course_release_matches_source``).
"""

from __future__ import annotations

import nbformat
import pytest
import support
from notebook_properties_ch45 import SOLVED_LINES, solved_source_problems, untouched_release_problems
from support import nbgrader_meta, solution_sources

from autograder import registry, release

CHAPTERS = registry.ids()
pytestmark = pytest.mark.slow


def error_cells(nb) -> list[tuple[int, str, str]]:
    """(cell index, grade_id, exception name) of every cell whose output is an error."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append((i, nbgrader_meta(cell).get("grade_id", ""), out.get("ename", "")))
    return found


def points_of(nb) -> dict[str, float]:
    return {nbgrader_meta(c)["grade_id"]: float(nbgrader_meta(c)["points"]) for c in nb.cells if nbgrader_meta(c).get("grade")}


def without_hidden_tests(text: str) -> str:
    lines, hidden = [], False
    for line in text.splitlines():
        if line.strip() == "### BEGIN HIDDEN TESTS":
            hidden = True
        elif line.strip() == "### END HIDDEN TESTS":
            hidden = False
        elif not hidden:
            lines.append(line)
    return "\n".join(lines).strip()


def source(chapter: str):
    return nbformat.read(registry.get(chapter).source_path(support.SOURCE), as_version=4)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_course_release_matches_source(nbgrader_course, chapter):
    """course/ is exactly what nbgrader generates from autograder/source/ (no hand edits, no drift)."""
    problems = release.compare(nbgrader_course.release(chapter).parent, support.COURSE, [chapter])
    assert not problems, (
        "course/ differs from a fresh nbgrader release of autograder/source/ — run `make release` "
        "and commit course/:\n  " + "\n  ".join(problems)
    )


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_release_with_solutions_is_the_source(nbgrader_course, chapter):
    """The release with the answers filled in (as a learner has them: without nbgrader's solution markers) is the
    source notebook, cell for cell, but for the hidden tests and those markers."""
    filled = nbgrader_course.students(chapter)["filled"]
    src = source(chapter)
    assert [c.cell_type for c in filled.cells] == [c.cell_type for c in src.cells]
    for i, (a, b) in enumerate(zip(filled.cells, src.cells)):
        assert without_hidden_tests(a.source) == without_hidden_tests(support.SOLUTION_MARKERS.sub("", b.source)), \
            f"{chapter}: cell {i} differs"
        assert nbgrader_meta(a).get("grade_id") == nbgrader_meta(b).get("grade_id")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_source_notebook_runs_and_gets_full_marks(nbgrader_course, chapter):
    graded = nbgrader_course.autograded(chapter)
    nb = graded.notebook("filled")
    assert not error_cells(nb), f"{chapter}: cells fail when run top to bottom: {error_cells(nb)}"
    assert any(c.cell_type == "code" and c.outputs for c in nb.cells)
    for cell in nb.cells:
        if nbgrader_meta(cell).get("grade"):
            text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
            assert "visible checks passed" in text, f"{chapter}: {nbgrader_meta(cell)['grade_id']} printed {text!r}"
    score, max_score, per_cell = graded.scores("filled")
    assert max_score == sum(points_of(source(chapter)).values()) > 0
    assert score == max_score, f"{chapter}: the solved notebook scores {score}/{max_score}: {per_cell}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_release_stubs_fail_only_in_test_cells(nbgrader_course, chapter):
    graded = nbgrader_course.autograded(chapter)
    score, max_score, per_cell = graded.scores("untouched")
    assert score == 0, f"{chapter}: the untouched release scores {score}: {per_cell}"
    nb = graded.notebook("untouched")
    errors = error_cells(nb)
    tests = {nbgrader_meta(c)["grade_id"] for c in nb.cells if nbgrader_meta(c).get("grade")}
    assert {grade_id for _, grade_id, _ in errors} == tests, (
        f"{chapter}: with the stubs, exactly the test cells must fail; errors: {errors}")
    assert all(ename == "NotDone" for *_, ename in errors), errors
    for cell in nb.cells:  # a failing check reads as one line, not a traceback through the checks' code
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                assert len(out["traceback"]) == 1 and "✗" in out["traceback"][0], out["traceback"]
                assert "not done yet" in out["traceback"][0]


@pytest.mark.parametrize("chapter", [c for c in CHAPTERS if c in SOLVED_LINES])
def test_executed_chapter_prints_what_it_measures_and_shows_its_widgets(nbgrader_course, chapter):
    """The same two runs: the solved notebook prints each measured section's line (computed by the run) and
    waits for nothing; the untouched release prints what needs no exercise, and each widget says what it waits
    for (tests/notebook_properties_ch45.py)."""
    graded = nbgrader_course.autograded(chapter)
    assert solved_source_problems(chapter, graded.notebook("filled")) == []
    assert untouched_release_problems(chapter, graded.notebook("untouched")) == []


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_release_one_exercise_solved_gets_its_points(nbgrader_course, chapter):
    first = next(iter(solution_sources(source(chapter)))).removesuffix("_solution")
    points = points_of(source(chapter))[first + registry.TESTS_SUFFIX]
    score, _, per_cell = nbgrader_course.autograded(chapter).scores("one")
    assert per_cell[first + registry.TESTS_SUFFIX] == points, per_cell
    assert score == points, f"{chapter}: only {first} solved, expected {points} points, got {score}: {per_cell}"
