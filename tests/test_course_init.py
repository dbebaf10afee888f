"""`python -m autograder course init|collect|feedback`: an nbgrader course directory made from the registry.

One course directory (chapter 1 only, to keep nbgrader's generate_assignment to one notebook) is
made once for the module; the tests then read it, add submissions and grades, and run init again.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder import course, registry
from autograder.__main__ import main

FIRST = registry.CHAPTERS[0]
ID = "tdd-2031-spring"  # any id: the instructor's choice

pytestmark = pytest.mark.slow  # nbgrader generate_assignment and release_assignment, in this process


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["course", *argv])
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("course")
    students = base / "students.csv"
    students.write_text("id,first_name,last_name,email\nalice,Alice,Liddell,alice@example.org\nbob,,,\n")
    root, exchange = base / "course", base / "exchange"
    status, out, err = _main("init", str(root), "--course-id", ID, "--exchange", str(exchange),
                             "--students", str(students), "--chapter", FIRST.id)
    assert status == 0, err
    return {"root": root, "exchange": exchange, "students": students, "out": out}


def _points(root: Path) -> dict[str, float]:
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        return {c.name: c.max_score for c in gb.find_notebook(FIRST.id, FIRST.id).grade_cells}


def test_course_init_fresh_directory_has_config_sources_release_exchange_and_gradebook(made):
    root, exchange = made["root"], made["exchange"]
    config = (root / "nbgrader_config.py").read_text()
    assert f"c.CourseDirectory.course_id = {ID!r}" in config
    assert f"c.Exchange.root = {str(exchange.resolve())!r}" in config
    assert "transformer-deep-dive" not in config  # the id is the instructor's, not a constant
    assert (root / "source" / FIRST.id / FIRST.notebook).is_file()
    released = nbformat.read(root / "release" / FIRST.id / FIRST.notebook, as_version=4)
    text = "\n".join(c.source for c in released.cells)
    assert "### BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text
    assert registry.notebook_problems(FIRST, released) == []
    outbound = exchange / ID / "outbound" / FIRST.id / FIRST.notebook
    assert outbound.read_bytes() == (root / "release" / FIRST.id / FIRST.notebook).read_bytes()
    # the exchange: writable by all but sticky (no learner can replace the course's folder); inbound set-gid, unlistable
    assert stat.S_IMODE(exchange.stat().st_mode) == 0o1777
    assert stat.S_IMODE((exchange / ID / "inbound").stat().st_mode) == 0o2733
    assert _points(root) == {ex.tests_id: float(ex.points) for ex in FIRST.exercises}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        assert sorted(s.id for s in gb.students) == ["alice", "bob"]
        alice = gb.find_student("alice")
        assert (alice.first_name, alice.last_name, alice.email) == ("Alice", "Liddell", "alice@example.org")
    assert f"{FIRST.id}: released into" in made["out"]


def test_course_init_rerun_keeps_submissions_and_grades(made):
    from autograder.gradebook import Recorder

    root, exchange = made["root"], made["exchange"]
    submitted = root / "submitted" / "alice" / FIRST.id
    submitted.mkdir(parents=True)
    (submitted / FIRST.notebook).write_text('{"cells": [], "note": "alice\'s answers"}')
    (submitted / "timestamp.txt").write_text("2031-03-01 10:00:00.000000 UTC")
    inbound = exchange / ID / "inbound" / f"alice+{FIRST.id}+2031-03-01 10:00:00.000000 UTC+abc"
    inbound.mkdir()
    (inbound / FIRST.notebook).write_text("{}")
    rows = [{"exercise": ex.name, "points": ex.points if i == 0 else 0, "max_points": ex.points, "status": "passed",
             "reason": ""} for i, ex in enumerate(FIRST.exercises)]
    Recorder(f"sqlite:///{root / 'gradebook.db'}").record({"student": "alice", "chapter": FIRST.id, "rows": rows})
    before = {p: p.read_bytes() for p in [*submitted.iterdir(), *inbound.iterdir()]}

    status, out, err = _main("init", str(root), "--course-id", ID, "--exchange", str(exchange),
                             "--students", str(made["students"]), "--chapter", FIRST.id)

    assert status == 0, err
    assert {p: p.read_bytes() for p in [*submitted.iterdir(), *inbound.iterdir()]} == before
    assert "kept as they were: submitted, gradebook.db" in out
    assert f"{FIRST.id}: already released, unchanged" in out
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        first = FIRST.exercises[0]
        assert gb.find_grade(first.tests_id, FIRST.id, FIRST.id, "alice").auto_score == first.points
        assert gb.find_submission(FIRST.id, "alice").score == first.points
        assert gb.find_student("alice").email == "alice@example.org"
    assert _points(root) == {ex.tests_id: float(ex.points) for ex in FIRST.exercises}


@pytest.mark.parametrize("text, row, says", [
    ("id,first_name\nalice,Alice\nbob smith,Bob\n", 3, "is not a login name"),
    ("id,first_name\nalice,Alice\ncarol,C\nalice,Again\n", 4, "is already on row 2"),
    ("first_name,last_name\nAlice,Liddell\n", 1, "no 'id' column"),
    ("id,first_name,nickname\nalice,Alice,Al\n", 1, "unknown column(s) nickname"),
    ("id,first_name\nalice,Alice,extra\n", 2, "has 3 fields, the header 2"),
    ("id,email\nbob+admin,b@example.org\n", 2, "is not a login name"),
])
def test_course_init_bad_students_csv_is_one_line_naming_the_row_and_writes_nothing(tmp_path, text, row, says):
    students = tmp_path / "students.csv"
    students.write_text(text)
    status, out, err = _main("init", str(tmp_path / "course"), "--course-id", ID,
                             "--exchange", str(tmp_path / "exchange"), "--students", str(students))
    assert status == 1
    assert err.count("\n") == 1 and f"row {row}" in err and says in err, err
    assert not (tmp_path / "course").exists() and not (tmp_path / "exchange").exists()


def test_course_init_refuses_another_course_id_for_an_existing_course(made):
    status, _, err = _main("init", str(made["root"]), "--course-id", "another", "--exchange", str(made["exchange"]),
                           "--chapter", FIRST.id)
    assert status == 1 and err.count("\n") == 1 and f"is the course {ID!r}" in err


def test_course_init_refuses_a_course_id_that_is_not_a_folder_name(tmp_path):
    status, _, err = _main("init", str(tmp_path / "c"), "--course-id", "../x", "--exchange", str(tmp_path / "e"))
    assert status == 1 and "--course-id '../x'" in err and not (tmp_path / "e").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the entries other owners")
def test_forged_submissions_are_those_whose_owner_is_not_the_student_named(tmp_path):
    inbound = tmp_path / "inbound"
    inbound.mkdir()
    honest = inbound / f"nobody+{FIRST.id}+2031-03-01 10:00:00.000000 UTC+x1"
    forged = inbound / f"root+{FIRST.id}+2031-03-02 10:00:00.000000 UTC+x2"  # claims root, owned by nobody
    other = inbound / f"nobody+{registry.CHAPTERS[1].id}+2031-03-02 10:00:00.000000 UTC+x3"
    for entry in (honest, forged, other):
        entry.mkdir()
        os.chown(entry, 65534, -1)
    link = inbound / f"nobody+{FIRST.id}+2031-03-03 10:00:00.000000 UTC+x4"
    link.symlink_to(honest)
    found = dict(course.forged_submissions(inbound, FIRST.id))
    assert set(found) == {forged, link}
    assert found[forged].startswith("claims root but is owned by nobody")
    assert found[link].startswith("not a folder")


def test_private_submit_leaves_the_submission_to_its_owner_and_the_group(made, tmp_path, monkeypatch):
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    work = tmp_path / "home"
    (work / FIRST.id).mkdir(parents=True)
    (work / FIRST.id / FIRST.notebook).write_bytes((made["root"] / "release" / FIRST.id / FIRST.notebook).read_bytes())
    config = Config()
    config.CourseDirectory.course_id = ID
    config.Exchange.root = str(made["exchange"])
    config.Exchange.cache = str(tmp_path / "cache")
    config.Exchange.assignment_dir = str(work)
    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id = FIRST.id
    monkeypatch.chdir(work)
    before = set((made["exchange"] / ID / "inbound").iterdir())
    course.PrivateSubmit(coursedir=coursedir, authenticator=Authenticator(config=config), config=config).start()
    (entry,) = set((made["exchange"] / ID / "inbound").iterdir()) - before
    assert stat.S_IMODE(entry.stat().st_mode) == 0o770
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in entry.iterdir()}
    assert modes == {FIRST.notebook: 0o640, "timestamp.txt": 0o640, "submission_secret.txt": 0o640}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the submissions' owners are system users")
def test_course_collect_sets_aside_a_submission_under_another_name_and_collects_the_rest(made):
    root, inbound = made["root"], made["exchange"] / ID / "inbound"
    stamp = "2031-03-05 10:00:00.000000 UTC"
    notebook = (root / "release" / FIRST.id / FIRST.notebook).read_bytes()
    for claimed in ("root", "nobody"):  # both made by root: the second claims a student it is not
        entry = inbound / f"{claimed}+{FIRST.id}+{stamp}+r{claimed}"
        entry.mkdir()
        (entry / FIRST.notebook).write_bytes(notebook)
        (entry / "timestamp.txt").write_text(stamp)
    status, out, err = _main("collect", str(root), FIRST.id)
    assert status == 0, err
    assert f"set aside nobody+{FIRST.id}+{stamp}+rnobody: claims nobody but is owned by root" in out
    assert (root / "quarantine" / f"nobody+{FIRST.id}+{stamp}+rnobody").is_dir()
    assert (root / "submitted" / "root" / FIRST.id / FIRST.notebook).read_bytes() == notebook
    assert not (root / "submitted" / "nobody").exists()


def test_course_feedback_writes_nbgraders_layout_and_releases_it_under_the_submissions_key(made, tmp_path):
    from nbgrader.utils import notebook_hash

    from autograder import record

    root = made["root"]
    submitted = root / "submitted" / "bob" / FIRST.id
    submitted.mkdir(parents=True)
    (submitted / FIRST.notebook).write_text("{}")
    (submitted / "timestamp.txt").write_text("2031-03-06 10:00:00.000000 UTC")
    (submitted / "submission_secret.txt").write_text("s3cret" * 20)
    rows = [{"student": "bob", "notebook": f"bob/{FIRST.id}/{FIRST.notebook}", "exercise": ex.name,
             "points": ex.points if ex.name == "softmax" else 0, "max_points": ex.points,
             "status": "passed" if ex.name == "softmax" else "failed", "reason": "" if ex.name == "softmax" else "x"}
            for ex in FIRST.exercises]
    rows.append({"student": "bob", "notebook": "bob/02_multi_head_attention.ipynb", "exercise": "split_heads",
                 "points": 0, "max_points": 1, "status": "missing", "reason": "another chapter"})
    grades = tmp_path / "grades.csv"
    record.write_csv(grades, rows)
    status, out, err = _main("feedback", str(root), FIRST.id, "--grades", str(grades))
    assert status == 0, err
    page = (root / "feedback" / "bob" / FIRST.id / f"{FIRST.id}.html").read_text()
    assert f"Total: <b>2 / {FIRST.points}</b>" in page and "another chapter" not in page
    released = made["exchange"] / ID / "feedback" / f"{notebook_hash(secret='s3cret' * 20, notebook_id=FIRST.id)}.html"
    assert released.read_text() == page
