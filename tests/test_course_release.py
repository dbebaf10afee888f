"""course/ is exactly what nbgrader generates from autograder/source/: tests/test_notebooks.py compares each
chapter with the session's own generation (test_course_release_matches_source); here, what needs no nbgrader."""

from __future__ import annotations

import pytest

from autograder.release import COURSE_DIR, chapters


def test_course_release_keeps_start_here_notebook():
    """The hand-written course/00_start_here.ipynb is not a chapter: release never touches it."""
    assert "00_start_here" not in chapters()


@pytest.mark.skipif(not chapters(), reason="no chapter in autograder/source")
def test_course_release_has_no_hidden_tests_or_solutions():
    for name in chapters():
        text = (COURSE_DIR / name / f"{name}.ipynb").read_text()
        assert "BEGIN HIDDEN TESTS" not in text, f"{name}: hidden tests leaked into the release"
        assert "BEGIN SOLUTION" not in text, f"{name}: a solution region leaked into the release"
