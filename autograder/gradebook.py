"""Record batch-grading results in the nbgrader gradebook (so `nbgrader export` and formgrader show them).

Only the grader's main process (or ``merge``, in a sharded run) writes here, one transaction
per submission. Writes are upserts: the assignment (= chapter), its notebook and grade cells
(``<exercise>_tests``, max score = the exercise's points in :mod:`autograder.registry`) are
created when missing, and a grade cell's max score follows the registry when the points
changed; the student and the submission are created when missing; each grade's
``auto_score`` is set. Recording the same result twice leaves the gradebook as it was.
"""

from __future__ import annotations

import contextlib

from nbgrader.api import Gradebook, MissingEntry

from autograder import environment, registry


class Recorder:
    def __init__(self, url: str):
        self.url = url
        self._ready: set[str] = set()
        self._open: Gradebook | None = None
        environment.for_nbgrader()  # a new gradebook is stamped with its schema revision

    def _ensure_assignment(self, gb: Gradebook, chapter: registry.Chapter) -> None:
        if chapter.id in self._ready:
            return
        gb.update_or_create_assignment(chapter.id)
        gb.update_or_create_notebook(chapter.id, chapter.id)
        for ex in chapter.exercises:
            try:
                cell = gb.find_grade_cell(ex.tests_id, chapter.id, chapter.id)
            except MissingEntry:
                gb.update_or_create_grade_cell(ex.tests_id, chapter.id, chapter.id,
                                               max_score=float(ex.points), cell_type="code")
                continue
            if cell.max_score != float(ex.points):  # the registry's points changed since the cell was made
                cell.max_score = float(ex.points)
        gb.db.commit()
        self._ready.add(chapter.id)

    @contextlib.contextmanager
    def session(self):
        """One connection for many :meth:`record` calls (``merge``): each query is then compiled once."""
        with Gradebook(self.url) as gb:
            self._open = gb
            try:
                yield self
            finally:
                self._open = None

    def record(self, result: dict) -> None:
        """Set the scores of one graded notebook (a result of ``autograder grade`` with a chapter)."""
        if self._open is None:
            with Gradebook(self.url) as gb:
                self._record(gb, result)
            return
        try:
            self._record(self._open, result)
        except Exception:
            self._open.db.rollback()  # this submission only; the session goes on with the next
            raise

    def _record(self, gb: Gradebook, result: dict) -> None:
        chapter = registry.get(result["chapter"])
        self._ensure_assignment(gb, chapter)
        try:
            gb.find_student(result["student"])
        except MissingEntry:
            gb.update_or_create_student(result["student"])
        try:
            gb.find_submission(chapter.id, result["student"])
        except MissingEntry:
            # nbgrader builds the submission before adding it to the session; an autoflush while it walks the
            # assignment's notebooks would warn (SAWarning: "... not in session ...") for each new submission.
            with gb.db.no_autoflush:
                gb.add_submission(chapter.id, result["student"])
        for row in result["rows"]:
            try:
                grade = gb.find_grade(row["exercise"] + registry.TESTS_SUFFIX, chapter.id, chapter.id, result["student"])
            except MissingEntry:
                continue
            grade.auto_score = float(row["points"])
        gb.db.commit()
