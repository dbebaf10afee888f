"""One verdict everywhere: the notebook's own test cells, ``nbgrader autograde`` and ``autograder grade``
give the same points to the same submissions (tests/one_verdict_cases.py), exercise by exercise.

* **notebook** — the release, run top to bottom in a kernel as a learner runs it (the session's
  ``learner_runs``): an exercise scores when its visible test cell runs without an error;
* **nbgrader** — the session's ``nbgrader autograde`` of the chapter (visible and hidden tests);
* **grade** — the session's sandboxed ``autograder grade`` batch (fresh seeds, hidden tests).
"""

from __future__ import annotations

import one_verdict_cases as cases
import pytest
import support
from support import nbgrader_meta, sandboxed

from autograder import registry


def notebook_points(nb, chapter: registry.Chapter) -> dict[str, float]:
    points = {}
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if meta.get("grade") and not meta.get("solution"):
            name = registry.exercise_of_grade_id(meta["grade_id"])
            failed = any(o.get("output_type") == "error" for o in cell.get("outputs", []))
            points[name] = 0.0 if failed else float(chapter.exercise(name).points)
    return points


def _check(student: str, way: str, points: dict[str, float], reasons: dict[str, str] | None = None) -> None:
    expected = cases.expected_points(student)
    assert points == expected, f"{student}, {way}: {points} != expected {expected}" + (
        f"; grade said {reasons}" if reasons else "")


# Each way is compared with the expected points (so the three agree with each other); each reads its own
# session run, so that the runs can go to different test workers.


@pytest.mark.slow
@pytest.mark.parametrize("student", list(cases.SUBMISSIONS))
def test_one_verdict_same_points_in_the_notebook(student, learner_runs):
    chapter = registry.get(cases.SUBMISSIONS[student][0])
    _check(student, "notebook", notebook_points(learner_runs.run(student, cases.submission(student)), chapter))


@pytest.mark.slow  # generates chapter 1 with nbgrader (the session's course)
@pytest.mark.parametrize("student", list(cases.SAME_AS))
def test_a_submission_read_from_another_run_is_that_runs_notebook(student, nbgrader_course):
    """``SAME_AS``: the notebook whose verdicts a submission reads is the same notebook, cell for cell (source,
    cell type and nbgrader metadata), so each way still grades this submission's very answers."""
    import nbformat
    from redteam import build as redteam

    chapter = cases.SUBMISSIONS[student][0]
    mine = cases.submission(student)
    same = cases.SAME_AS[student]
    theirs = {"nbgrader": nbgrader_course.students(chapter)[same["nbgrader"]],
              "grade": redteam.solved(chapter, support.SOURCE)}  # the red-team's honest student (its build)
    assert same == {"nbgrader": "filled", "grade": "honest"}

    def cells(nb):
        return [(c.cell_type, c.source, nbgrader_meta(c)) for c in nbformat.from_dict(nb).cells]

    for way, nb in theirs.items():
        assert cells(nb) == cells(mine), f"{student} is not the notebook its {way} verdict is read from"


@pytest.mark.slow
@pytest.mark.parametrize("student", list(cases.SUBMISSIONS))
def test_one_verdict_same_points_in_nbgrader(student, nbgrader_course):
    chapter = cases.SUBMISSIONS[student][0]
    _, _, per_cell = nbgrader_course.autograded(chapter).scores(cases.run_by(student, "nbgrader"))
    _check(student, "nbgrader", {registry.exercise_of_grade_id(name): score for name, score in per_cell.items()})


@sandboxed
@pytest.mark.parametrize("student", list(cases.SUBMISSIONS))
def test_one_verdict_same_points_in_grade(student, grading_batch):
    chapter = registry.get(cases.SUBMISSIONS[student][0])
    graded = cases.run_by(student, "grade")
    rows = [r for r in grading_batch.rows(graded) if r["notebook"] == f"{graded}/{chapter.notebook}"]
    _check(student, "grade", {r["exercise"]: float(r["points"]) for r in rows},
           {r["exercise"]: f"{r['status']}: {r['reason']}" for r in rows})


@sandboxed
def test_one_verdict_names_the_rule_that_was_broken(grading_batch):
    def reason(student, exercise):
        return next(f"{r['status']}: {r['reason']}" for r in grading_batch.rows(student) if r["exercise"] == exercise
                    and r["notebook"].endswith(registry.get(cases.SUBMISSIONS[student][0]).notebook))

    assert reason("ov_mixed1", "softmax").startswith("flagged") and "log_softmax" in reason("ov_mixed1", "softmax")
    assert reason("ov_mixed1", "scaled_dot_product_attention").startswith("flagged")
    assert reason("ov_mixed2", "MultiHeadAttention").startswith("flagged")
    assert reason("ov_mixed3", "apply_rope_complex").startswith("flagged")
    for student, exercise in (("ov_mixed1", "attention_scores"), ("ov_mixed3", "apply_rope")):
        assert reason(student, exercise).startswith("failed") and "in place" in reason(student, exercise)
