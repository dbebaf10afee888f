"""Every chapter notebook runs, and nbgrader grades it as intended.

Generic over the chapters found in ``autograder/source/``. To keep kernels few
(three per chapter), one ``nbgrader autograde`` in a temporary course directory
with its own gradebook grades three submissions of each chapter:

* ``filled``    — the release with every solution cell taken from the source.
                  It is checked to be the source notebook cell for cell (only
                  the hidden tests differ, and autograde puts them back), so its
                  run is the source notebook executed top to bottom: no cell may
                  fail, the visible tests must pass and the score is full marks;
* ``untouched`` — the release as students get it: 0 points, and only the test
                  cells fail, with NotImplementedError;
* ``one``       — the release with only the first exercise solved: exactly that
                  exercise's points.

nbgrader executes with nbconvert's ExecutePreprocessor, i.e. nbclient.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.release import CONFIG_FILE, SOURCE_DIR, chapters, make_course_dir

CHAPTERS = chapters()
STUDENTS = ("filled", "untouched", "one")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHAPTERS, reason="no chapter in autograder/source")]


def kernel_env() -> dict[str, str]:
    """One core, like Binder; short training budgets (TDD_QUICK); the environment's scripts (nbgrader's alembic) on PATH."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONHASHSEED="0", TDD_QUICK="1")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def error_cells(nb) -> list[tuple[int, str, str]]:
    """(cell index, grade_id, exception name) of every cell whose output is an error."""
    found = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append((i, nbgrader_meta(cell).get("grade_id", ""), out.get("ename", "")))
    return found


def solution_sources(nb) -> dict[str, str]:
    return {nbgrader_meta(c)["grade_id"]: c.source for c in nb.cells if nbgrader_meta(c).get("solution")}


def points_of(nb) -> dict[str, float]:
    return {nbgrader_meta(c)["grade_id"]: float(nbgrader_meta(c)["points"]) for c in nb.cells if nbgrader_meta(c).get("grade")}




def run_nbgrader(course: Path, *args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args, "--force"], cwd=course, env=kernel_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A temporary nbgrader course directory with every chapter generated and autograded."""
    root = tmp_path_factory.mktemp("nbgrader-course")
    (root / "nbgrader_config.py").write_text(CONFIG_FILE.read_text())
    make_course_dir(root)
    for chapter in CHAPTERS:
        run_nbgrader(root, "generate_assignment", chapter)
        source = nbformat.read(root / "source" / chapter / f"{chapter}.ipynb", as_version=4)
        release_path = root / "release" / chapter / f"{chapter}.ipynb"
        solutions = solution_sources(source)
        first = next(iter(solutions))
        for student in STUDENTS:
            nb = nbformat.read(release_path, as_version=4)
            for cell in nb.cells:
                grade_id = nbgrader_meta(cell).get("grade_id")
                if grade_id in solutions and (student == "filled" or (student == "one" and grade_id == first)):
                    cell.source = solutions[grade_id]
            target = root / "submitted" / student / chapter / f"{chapter}.ipynb"
            target.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, target)
        run_nbgrader(root, "autograde", chapter)
    return root


def scores(course: Path, chapter: str, student: str) -> tuple[float, float, dict[str, float]]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        submission = gb.find_submission(chapter, student)
        notebook = submission.notebooks[0]
        per_cell = {g.name: g.score for g in notebook.grades}
        return submission.score, submission.max_score, per_cell


def autograded(course: Path, chapter: str, student: str):
    return nbformat.read(course / "autograded" / student / chapter / f"{chapter}.ipynb", as_version=4)


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


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_release_with_solutions_is_the_source(course, chapter):
    source = nbformat.read(SOURCE_DIR / chapter / f"{chapter}.ipynb", as_version=4)
    filled = nbformat.read(course / "submitted" / "filled" / chapter / f"{chapter}.ipynb", as_version=4)
    assert [c.cell_type for c in filled.cells] == [c.cell_type for c in source.cells]
    for i, (a, b) in enumerate(zip(filled.cells, source.cells)):
        assert without_hidden_tests(a.source) == without_hidden_tests(b.source), f"{chapter}: cell {i} differs"
        assert nbgrader_meta(a).get("grade_id") == nbgrader_meta(b).get("grade_id")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_source_notebook_runs_and_gets_full_marks(course, chapter):
    nb = autograded(course, chapter, "filled")
    assert not error_cells(nb), f"{chapter}: cells fail when run top to bottom: {error_cells(nb)}"
    assert any(c.cell_type == "code" and c.outputs for c in nb.cells)
    for cell in nb.cells:
        if nbgrader_meta(cell).get("grade"):
            text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
            assert "visible checks passed" in text, f"{chapter}: {nbgrader_meta(cell)['grade_id']} printed {text!r}"
    score, max_score, per_cell = scores(course, chapter, "filled")
    source = nbformat.read(SOURCE_DIR / chapter / f"{chapter}.ipynb", as_version=4)
    assert max_score == sum(points_of(source).values()) > 0
    assert score == max_score, f"{chapter}: the solved notebook scores {score}/{max_score}: {per_cell}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_release_stubs_fail_only_in_test_cells(course, chapter):
    score, max_score, per_cell = scores(course, chapter, "untouched")
    assert score == 0, f"{chapter}: the untouched release scores {score}: {per_cell}"
    nb = autograded(course, chapter, "untouched")
    errors = error_cells(nb)
    graded = {nbgrader_meta(c)["grade_id"] for c in nb.cells if nbgrader_meta(c).get("grade")}
    assert {grade_id for _, grade_id, _ in errors} == graded, (
        f"{chapter}: with the stubs, exactly the test cells must fail; errors: {errors}")
    assert all(ename == "NotDone" for *_, ename in errors), errors
    for cell in nb.cells:  # a failing check reads as one line, not a traceback through the checks' code
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                assert len(out["traceback"]) == 1 and "✗" in out["traceback"][0], out["traceback"]
                assert "not done yet" in out["traceback"][0]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_release_one_exercise_solved_gets_its_points(course, chapter):
    source = nbformat.read(SOURCE_DIR / chapter / f"{chapter}.ipynb", as_version=4)
    first = next(iter(solution_sources(source))).removesuffix("_solution")
    points = points_of(source)[f"{first}_tests"]
    score, _, per_cell = scores(course, chapter, "one")
    assert per_cell[f"{first}_tests"] == points, per_cell
    assert score == points, f"{chapter}: only {first} solved, expected {points} points, got {score}: {per_cell}"
