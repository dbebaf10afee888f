"""Record batch-grading results in the nbgrader gradebook (so `nbgrader export` and formgrader show them).

Only the grader's main process writes here, one transaction per submission. Writes are
upserts: the assignment (= chapter), its notebook and grade cells (``<exercise>_tests``,
max score = the exercise's points) are created from the source notebook when missing;
the student and the submission are created when missing; each grade's ``auto_score`` is set.
Recording the same result twice leaves the gradebook as it was.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbgrader.api import Gradebook, MissingEntry

from autograder import verdict


class Recorder:
    def __init__(self, url: str, source_dir: Path, chapters: dict[str, verdict.Chapter]):
        self.url = url
        self.source_dir = Path(source_dir)
        self.chapters = chapters
        self._ready: set[str] = set()

    def _ensure_assignment(self, gb: Gradebook, chapter: verdict.Chapter) -> None:
        if chapter.name in self._ready:
            return
        gb.update_or_create_assignment(chapter.name)
        gb.update_or_create_notebook(chapter.name, chapter.name)
        nb = nbformat.read(self.source_dir / chapter.name / f"{chapter.name}.ipynb", as_version=4)
        points = {ex.name: ex.points for ex in chapter.exercises}
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            grade_id = meta.get("grade_id", "")
            if meta.get("grade") and grade_id.removesuffix("_tests") in points:
                try:
                    gb.find_grade_cell(grade_id, chapter.name, chapter.name)
                except MissingEntry:
                    gb.update_or_create_grade_cell(grade_id, chapter.name, chapter.name,
                                                   max_score=float(points[grade_id.removesuffix("_tests")]),
                                                   cell_type="code")
        self._ready.add(chapter.name)

    def record(self, result: dict) -> None:
        chapter = verdict.chapter_of(Path(result["notebook"]), self.chapters)
        if chapter is None:
            return  # not a notebook of the course: nothing nbgrader can hold
        with Gradebook(self.url) as gb:
            self._ensure_assignment(gb, chapter)
            try:
                gb.find_student(result["student"])
            except MissingEntry:
                gb.update_or_create_student(result["student"])
            try:
                gb.find_submission(chapter.name, result["student"])
            except MissingEntry:
                gb.add_submission(chapter.name, result["student"])
            for row in result["rows"]:
                grade_id = f"{row['exercise']}_tests"
                try:
                    grade = gb.find_grade(grade_id, chapter.name, chapter.name, result["student"])
                except MissingEntry:
                    continue
                grade.auto_score = float(row["points"])
            gb.db.commit()
