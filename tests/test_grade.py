"""The batch grader against the red-team corpus (tests/redteam/build.py): exact scores and statuses.

The corpus is graded once, in the session's shared batch (``grading_batch``, tests/batch.py); the SIGKILL
test grades a few of its notebooks again in a folder of its own and compares with that batch.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import batch as batch_module
import pytest
import support
from support import sandboxed

from autograder import record, registry


@sandboxed
def test_grade_redteam_exact_scores(grading_batch):
    grading_batch.check()
    rows = grading_batch.rows()
    got = {}
    for row in rows:
        got.setdefault(row["notebook"], {})[row["exercise"]] = [float(row["points"]), row["status"]]
    wrong = []
    for sub, expected in grading_batch.redteam.items():
        for ex, (points, status) in expected.items():
            actual = got.get(sub, {}).get(ex)
            if actual != [float(points), status]:
                reason = next((r["reason"] for r in rows if r["notebook"] == sub and r["exercise"] == ex), "")
                wrong.append(f"{sub} {ex}: expected {points} {status}, got {actual} ({reason[:200]})")
    assert not wrong, "\n".join(wrong)
    students = {sub.split("/")[0] for sub in grading_batch.redteam}
    theirs = {notebook for notebook in got if notebook.split("/")[0] in students}
    # The batch owes every chapter (--chapter for each), so a student who submitted only chapter 1 also has a
    # "missing" row for each chapter they did not submit, named <student>/<chapter>.ipynb, and nothing else.
    chapter_of = {ex.name: ch for ch in registry.ids() for ex in registry.get(ch).exercises}
    submitted = {(row["notebook"].split("/")[0], chapter_of[row["exercise"]]) for row in rows
                 if row["notebook"] in grading_batch.redteam and row["exercise"] in chapter_of}
    unsubmitted = theirs - set(grading_batch.redteam)
    for notebook in unsubmitted:
        student, name = notebook.split("/", 1)
        chapter = name.removesuffix(".ipynb")
        assert chapter in registry.ids() and (student, chapter) not in submitted, notebook
        assert {r["status"] for r in rows if r["notebook"] == notebook} == {"missing"}, notebook
    assert theirs - unsubmitted == set(grading_batch.redteam)  # every red-team notebook has rows


@sandboxed
def test_grade_reports_a_syntax_error_as_such_with_its_line(grading_batch):
    rows = grading_batch.rows("syntax_error")
    reason = next(r["reason"] for r in rows if r["exercise"] == "padding_mask")
    assert "syntax error (line 2" in reason and "not done" not in reason, reason


@sandboxed
def test_grade_leaves_submissions_byte_identical(grading_batch):
    grading_batch.check()
    assert batch_module.hashes(grading_batch.subs, grading_batch.plain_students) == grading_batch.before
    assert batch_module.hashes(grading_batch.hostile_subs, grading_batch.hostile_plain) == grading_batch.hostile_before
    assert batch_module.hashes(grading_batch.short_subs) == grading_batch.short_before


CHAPTER_OF = {exercise.name: chapter.id for chapter in registry.CHAPTERS for exercise in chapter.exercises}


def _reached(subs: Path, notebook: str) -> bool:
    """Whether the grader reads ``subs/notebook``: a regular file reached through no link (link_folder's notebook
    is reached through its folder, a link: the grader never follows it, and reports the chapter missing)."""
    path = subs
    for part in Path(notebook).parts:
        path = path / part
        if path.is_symlink():
            return False
    return path.is_file()


@sandboxed
def test_grade_gradebook_matches_csv_and_nbgrader_export(grading_batch):
    # each command writes its own gradebook: (main, hostile, short-limit) submissions compared
    counted = [_gradebook_matches_csv_and_export(subs, out) for subs, out in grading_batch.parts()]
    assert counted[0] >= 20 and counted[1] >= 20 and counted[2] == len(batch_module.SHORT), counted


def _gradebook_matches_csv_and_export(subs, out) -> int:
    from nbgrader.api import Gradebook

    rows = record.read_csv(out / "grades.csv")
    totals: dict[tuple[str, str], float] = {}
    for row in rows:
        if row["exercise"] != "-" and row["status"] not in ("invalid", "duplicate") and _reached(subs, row["notebook"]):
            chapter = CHAPTER_OF[row["exercise"]]  # not the file's name: a renamed copy ("… (1).ipynb") is graded
            totals[(row["student"], chapter)] = totals.get((row["student"], chapter), 0.0) + float(row["points"])
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        for (student, chapter), score in totals.items():
            sub = gb.find_submission(chapter, student)
            assert sub.score == pytest.approx(score), (student, chapter)
        assert {s.id for s in gb.students} <= {r["student"] for r in rows}
    export = out / "export.csv"
    config = out / "nbgrader_config.py"
    config.write_text(f"c.CourseDirectory.db_url = 'sqlite:///{out / 'gradebook.db'}'\n"
                      f"c.CsvExportPlugin.to = '{export}'\n")
    done = subprocess.run([sys.executable, "-m", "nbgrader", "export"], cwd=out, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(export, newline="") as f:
        exported = {(r["student_id"], r["assignment"]): float(r["score"]) for r in csv.DictReader(f)}
    for key, score in totals.items():
        assert exported[key] == pytest.approx(score), key
    return len(totals)


@sandboxed
def test_grade_rerun_is_idempotent(grading_batch):
    csv_before = (grading_batch.out / "grades.csv").read_bytes()
    again = subprocess.run(grading_batch.command(), capture_output=True, text=True, cwd=support.REPO, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (grading_batch.out / "grades.csv").read_bytes() == csv_before
    assert "grading 0 notebook(s)" in again.stderr and "already graded" in again.stderr


# The students the SIGKILL test grades again: all of them chapter 1 only, some passing, some not.
KILLED_CLASS = ("one_solved", "untouched", "wrong", "syntax_error")


@sandboxed
def test_grade_killed_with_sigkill_and_rerun_gives_the_rows_of_the_batch(grading_batch, tmp_path):
    """Killed once at a known point (its first notebook graded and saved, the others not), then run again:
    the rerun grades only the rest, and the CSV has exactly the rows the shared batch gave these notebooks."""
    subs, out = tmp_path / "submissions", tmp_path / "out"
    for student in KILLED_CLASS:
        shutil.copytree(grading_batch.subs / student, subs / student)
    cmd = [sys.executable, "-m", "autograder", "grade", str(subs), "--out", str(out / "grades.csv"), "--jobs", "1",
           "--source", str(grading_batch.source), "--gradebook", f"sqlite:///{out / 'gradebook.db'}",
           *batch_module.OPTIONS[2:]]
    state = out / "grades.csv.state"
    proc = subprocess.Popen(cmd, cwd=support.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 600

    def whole() -> list[Path]:  # results saved whole (a temp file being written is not one: record.atomic_write)
        return sorted(state.glob("*.json")) if state.is_dir() else []

    while time.monotonic() < deadline and proc.poll() is None and not whole():
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    saved = whole()
    assert 1 <= len(saved) < len(KILLED_CLASS), f"killed after {len(saved)} notebook(s) were saved"
    final = subprocess.run(cmd, capture_output=True, text=True, cwd=support.REPO, timeout=900)
    assert final.returncode == 0, final.stderr[-2000:]
    assert f"({len(saved)} already graded)" in final.stderr
    mine = record.read_csv(out / "grades.csv")
    theirs = [r for r in grading_batch.rows() if r["student"] in KILLED_CLASS]
    assert _six(mine) == _six(theirs)
    # the same reasons too, but where a check failed (its hint may name a case drawn from fresh seeds)
    assert [r for r in mine if r["status"] != "failed"] == [r for r in theirs if r["status"] != "failed"]


def _six(rows: list[dict]) -> list[tuple]:
    return sorted((r["student"], r["notebook"], r["exercise"], r["points"], r["max_points"], r["status"]) for r in rows)
