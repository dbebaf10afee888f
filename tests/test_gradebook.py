"""The instructor's output is clean: the gradebook writer warns about nothing, and nbgrader's own commands
work as the README prints them (`.venv/bin/nbgrader` without an activated venv, `nbgrader export`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from autograder import registry
from autograder.gradebook import Recorder

ROOT = Path(__file__).resolve().parent.parent
BARE_PATH = "/usr/local/bin:/usr/bin:/bin"  # a fresh shell's: no virtual environment on it
# A Python warning as the warnings module prints it ("…/api.py:2229: SAWarning: Object of type …"), or a log
# line at WARNING level (nbgrader: "[ExportApp | WARNING] …").
WARNING_LINE = re.compile(r"\b[A-Z]\w*Warning: |\| WARNING\]")


def python_warnings(stderr: str) -> list[str]:
    """The lines of a command's stderr that are Python warnings or WARNING log lines (a grading run's, for
    instance, should have none). The grader's own one-line notices, such as its fallback without bubblewrap,
    are not Python warnings and are not counted."""
    return [line for line in stderr.splitlines() if WARNING_LINE.search(line)]


def assert_grading_stderr_has_no_warning(stderr: str) -> None:
    """For the shared `autograder grade` batch: its stderr holds no Python warning (SQLAlchemy's SAWarning from
    nbgrader's gradebook, a DeprecationWarning, ...)."""
    found = python_warnings(stderr)
    assert not found, "warnings in the grading run's stderr:\n" + "\n".join(found[:10])


def test_python_warnings_finds_what_a_grading_run_printed():
    stderr = ("/x/nbgrader/api.py:2229: SAWarning: Object of type <SubmittedAssignment> not in session, add operation\n"
              "  for notebook in submission.assignment.notebooks:\n"
              "[ExportApp | WARNING] No nbgrader_config.py file found\n"
              "warning: bubblewrap 0.6.1 is older than 0.8: the sandbox falls back to rlimits only\n"
              "[3/40] alice: alice/01_attention_by_hand.ipynb: 13/13 in 31.2 s\n")
    assert len(python_warnings(stderr)) == 2
    with pytest.raises(AssertionError, match="SAWarning"):
        assert_grading_stderr_has_no_warning(stderr)
    assert_grading_stderr_has_no_warning(stderr.split("\n", 3)[3])


def _result(chapter: registry.Chapter, student: str, points: dict[str, int]) -> dict:
    return {"chapter": chapter.id, "student": student,
            "rows": [{"exercise": ex.name, "points": points.get(ex.name, 0)} for ex in chapter.exercises]}


def test_gradebook_recorder_writes_every_score_without_a_warning(tmp_path):
    """New students, new submissions and a second recording of the same results, with and without one session:
    the scores are the results', and not one warning is raised (they are errors here)."""
    first, second = registry.CHAPTERS[:2]
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    recorder = Recorder(url)
    full = {ex.name: ex.points for ex in first.exercises}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recorder.record(_result(first, "alice", full))
        recorder.record(_result(first, "bob", {first.exercises[0].name: 1}))
        with recorder.session():
            recorder.record(_result(second, "alice", {second.exercises[1].name: second.exercises[1].points}))
            recorder.record(_result(first, "carol", {}))
            recorder.record(_result(first, "alice", full))  # again: nothing changes
    with Gradebook(url) as gb:
        assert gb.find_submission(first.id, "alice").score == first.points
        assert gb.find_submission(first.id, "bob").score == 1
        assert gb.find_submission(first.id, "carol").score == 0
        assert gb.find_submission(second.id, "alice").score == second.exercises[1].points
        assert sorted(s.id for s in gb.students) == ["alice", "bob", "carol"]


def test_nbgrader_config_puts_this_pythons_scripts_on_path(monkeypatch):
    """nbgrader runs `alembic` from PATH to make a gradebook: loading the course's config puts the scripts of the
    Python that runs nbgrader first, so `.venv/bin/nbgrader ...` works without activating the venv."""
    monkeypatch.setenv("PATH", BARE_PATH)
    namespace = {"get_config": lambda: type("Config", (), {"__getattr__": lambda self, name: self})()}
    exec(compile((ROOT / "autograder" / "nbgrader_config.py").read_text(), "nbgrader_config.py", "exec"), namespace)
    assert os.environ["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)


@pytest.mark.subprocess
def test_nbgrader_export_runs_clean_where_the_readme_says(tmp_path):
    """In a course directory with the course's nbgrader_config.py, `.venv/bin/nbgrader` run from a shell without
    the venv makes a gradebook (alembic) and `nbgrader export --to …` writes its CSV there, with no warning and no
    second grades.csv."""
    nbgrader = Path(sys.executable).parent / "nbgrader"
    course = tmp_path / "course"
    course.mkdir()
    shutil.copyfile(ROOT / "autograder" / "nbgrader_config.py", course / "nbgrader_config.py")
    env = {"HOME": str(tmp_path), "PATH": BARE_PATH, "LANG": "C.UTF-8"}
    made = subprocess.run([str(nbgrader), "db", "upgrade"], cwd=course, env=env, capture_output=True, text=True,
                          timeout=300)
    assert made.returncode == 0 and (course / "gradebook.db").is_file(), made.stderr[-2000:]
    first = registry.CHAPTERS[0]
    Recorder(f"sqlite:///{course / 'gradebook.db'}").record(_result(first, "alice", {first.exercises[0].name: 2}))
    command = re.search(r"^(nbgrader export [^#\n]*?)\s*#", (ROOT / "README.md").read_text(), re.MULTILINE).group(1)
    written = course / command.split("--to ")[1].split()[0]
    assert written != course / "grades.csv"
    written.parent.mkdir(exist_ok=True)  # where `autograder grade --out grades/grades.csv` wrote its CSV
    out = subprocess.run([str(nbgrader), *command.split()[1:]], cwd=course, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not python_warnings(out.stderr), out.stderr
    assert f"{first.id},,,alice," in written.read_text().replace('"', ""), written.read_text()
    assert not (course / "grades.csv").exists()


@pytest.mark.subprocess
def test_a_new_gradebook_is_stamped_with_the_revision_alembic_heads_gives_without_running_it(tmp_path, monkeypatch):
    """The schema revision a new gradebook gets, read in this process (environment.gradebook_revision), is the one
    nbgrader's own lookup reads by running `alembic heads`; after environment.for_nbgrader() a gradebook is made
    with no alembic on PATH and no process started, and is stamped with it."""
    import subprocess as sp

    import nbgrader.api
    from nbgrader.dbutil import _temp_alembic_ini
    from sqlalchemy import create_engine, text

    from autograder import environment

    alembic = Path(sys.executable).parent / "alembic"
    with _temp_alembic_ini(f"sqlite:///{tmp_path / 'probe.db'}") as ini:
        heads = sp.run([str(alembic), "-c", ini, "heads"], capture_output=True, text=True, timeout=300, check=True)
    assert environment.gradebook_revision() == heads.stdout.split("\n")[0].split(" ")[0]

    monkeypatch.setattr(nbgrader.api, "get_alembic_version", nbgrader.api.get_alembic_version)  # undone after
    environment.for_nbgrader()
    monkeypatch.setenv("PATH", "/nonexistent")  # nbgrader's own lookup would fail: alembic is not found
    monkeypatch.setattr(sp, "Popen", None)  # and nothing is started
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with nbgrader.api.Gradebook(url):
        pass
    with create_engine(url).connect() as db:
        assert db.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [
            environment.gradebook_revision()]
