"""The session's one grading batch: every submission the grading tests assert on, graded once.

``Batch(root)`` writes ``root/submissions/`` (graded) beside ``root/source/`` (the source notebooks with a
sentinel planted in their hidden tests, given as ``--source``) and ``root/out/``:

* the red-team corpus (``tests/redteam/build.py``; its honest student has every chapter solved);
* the second, hostile batch (``tests/redteam/hostile.py``), with host files outside every sandbox;
* the one-verdict submissions (``tests/one_verdict_cases.py``);
* ``release_untouched``: every chapter's release as learners get it (``tests/test_run_all.py``);
* ``fork_bomb_cell``: fork bombs at the top of the notebook and inside ``padding_mask``;
* a class collected through nbgrader's own exchange (``submitted/<student>/<assignment>/<notebook>``), which
  ``tests/test_shard.py`` also grades in shards from its own copy (``class_root``).

``grade()`` runs ``python -m autograder grade`` once, sandboxed, with two jobs and a CPU-bound process
beside it (a busy machine: the honest students must still get full marks), then ``autograder feedback``. The
cell timeout is the grader's default, 60 s (20 s failed honest checks on a busy 2-core CI machine). Each test
reads its own students' rows.

The students who run into a time limit (``SHORT``: two infinite loops and a kernel that stops reading its
input) are graded at the same time by a second ``grade`` command with short limits (``SHORT_OPTIONS``), from
``root/short/``: in the main batch they waited out 60 s and 300 s. ``rows()`` reads both CSVs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import one_verdict_cases
import support
from redteam import build as redteam
from redteam import hostile

from autograder import record, registry, sandbox

CH1 = redteam.CH1
# Every chapter is expected (--chapter each): a chapter given is graded, and one a student lacks is `missing`;
# the grader grades no chapter it was not given (a notebook of another chapter is set aside, unmatched).
OPTIONS = ("--jobs", "2", "--cell-timeout", "60", "--notebook-timeout", "300",
           *(arg for chapter in registry.CHAPTERS for arg in ("--chapter", chapter.id)))
COURSE_ID = "tdd"
# The students that wait out a limit, and the limits they are graded with: what they test is that the limit
# holds and that the rest of the notebook is graded after it, not its length. Their other cells are cheap
# (build.BESIDE_ATTACK), far inside 15 s on a busy machine.
SHORT = ("infinite_loop", "infinite_loop_cell", "stops_reading")
SHORT_OPTIONS = ("--jobs", "3", "--cell-timeout", "15", "--notebook-timeout", "100", *OPTIONS[6:])


def hashes(folder: Path, students: list[str] | None = None) -> dict[str, str]:
    """sha256 of each regular file under ``folder`` (or under its ``students``' folders only: the hostile ones
    hold a 100 GB sparse file, fifos, links and a 1500-level tree)."""
    tops = [folder / s for s in students] if students is not None else [folder]
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for top in tops for p in sorted(top.rglob("*")) if p.is_file() and not p.is_symlink()}


def fingerprint(path: Path) -> tuple:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, st.st_mode, path.read_bytes()


def class_notebooks() -> dict[tuple[str, str], list[tuple[str, nbformat.NotebookNode]]]:
    """(student, assignment) -> [(file name, notebook)]: a class worth comparing (passed, failed, missing,
    a duplicate, two chapters). Its chapter-1 answers leave tiled_attention out (``redteam.BESIDE_ATTACK``: the
    class is graded four times, in the batch and in shards, and that exercise's checks are half a notebook's time)."""
    first = registry.get(CH1)
    second = registry.CHAPTERS[1]
    wrong = redteam.solved(first.id, support.SOURCE, redteam.BESIDE_ATTACK)
    redteam.set_cell(wrong, "padding_mask_solution", redteam.WRONG_PADDING)

    def solved(ch, only=None):
        return redteam.solved(ch.id, support.SOURCE, only)

    return {
        ("ana", first.id): [(first.notebook, solved(first, redteam.BESIDE_ATTACK)),
                            (f"{first.id}-Copy1.ipynb", solved(first, set()))],
        ("ana", second.id): [(second.notebook, solved(second))],
        ("ben", first.id): [(first.notebook, solved(first, set()))],
        ("ben", second.id): [(second.notebook, solved(second, {second.exercises[0].name}))],
        ("cleo", first.id): [(first.notebook, solved(first, {first.exercises[1].name}))],
        ("dan", first.id): [(first.notebook, wrong)],
        ("dan", second.id): [(second.notebook, solved(second, set()))],
    }


def nbgrader_collect(course: Path, exchange: Path, work: Path, notebooks: dict) -> None:
    """Release, submit (as each student) and collect through nbgrader's own exchange, in this process."""
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.exchange.default import (
        ExchangeCollect,
        ExchangeReleaseAssignment,
        ExchangeSubmit,
    )
    from traitlets.config import Config

    def app(cls, root: Path, assignment: str, student: str | None = None):
        c = Config()
        c.CourseDirectory.root = str(root)
        c.CourseDirectory.course_id = COURSE_ID
        c.CourseDirectory.db_url = f"sqlite:///{course / 'gradebook.db'}"
        c.Exchange.root = str(exchange)
        cd = CourseDirectory(config=c)
        cd.assignment_id = assignment
        if student:
            cd.student_id = student
        return cls(coursedir=cd, authenticator=Authenticator(config=c), config=c)

    exchange.mkdir(parents=True)
    old_cwd, old_path = os.getcwd(), os.environ.get("PATH", "")
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{old_path}"  # nbgrader runs alembic
    try:
        chapters = sorted({chapter for _, chapter in notebooks})
        for chapter in chapters:
            (course / "release" / chapter).mkdir(parents=True)
            shutil.copy(registry.get(chapter).release_path(), course / "release" / chapter)
            os.chdir(course)
            app(ExchangeReleaseAssignment, course, chapter).start()
        for (student, chapter), files in notebooks.items():
            home = work / student
            for name, nb in files:
                path = home / chapter / name
                path.parent.mkdir(parents=True, exist_ok=True)
                nbformat.write(nb, path)
            os.chdir(home)
            app(ExchangeSubmit, home, chapter, student).start()
        os.chdir(course)
        for chapter in chapters:
            app(ExchangeCollect, course, chapter).start()
    finally:
        os.chdir(old_cwd)
        os.environ["PATH"] = old_path


def fork_bomb_notebook() -> nbformat.NotebookNode:
    """Chapter 1 as an attack solves it (``redteam.BESIDE_ATTACK``) with fork bombs after the imports and in
    padding_mask."""
    bomb = redteam.solved(CH1, support.SOURCE, redteam.BESIDE_ATTACK)
    redteam.insert_after_imports(bomb, "import os\nfor _ in range(3):\n    if os.fork() == 0:\n"
                                       "        while True:\n            try:\n                os.fork()\n"
                                       "            except OSError:\n                pass\n")
    redteam.set_cell(bomb, "padding_mask_solution", "def padding_mask(tokens, pad_id):\n    import os\n"
                                                    "    while True:\n        os.fork()\n")
    return bomb


class Batch:
    def __init__(self, root: Path):
        self.root = root
        self.subs, self.source, self.out = root / "submissions", root / "source", root / "out"
        shutil.copytree(support.SOURCE, self.source)
        redteam.plant_sentinel(self.source)
        self.out.mkdir()
        # the red-team corpus: {relpath: {exercise: [points, status]}}
        self.redteam = redteam.build(root, self.source, tuple(registry.ids()))
        # the hostile batch: {display name: {"points": .., "statuses": {..}}}
        self.host = hostile.host_files(root / "host")
        self.host_before = {name: fingerprint(p) for name, p in self.host.items()}
        self.hostile = hostile.build(root, self.source, self.host)
        for student in one_verdict_cases.SUBMISSIONS:
            chapter = registry.get(one_verdict_cases.SUBMISSIONS[student][0])
            self._write(student, chapter.notebook, one_verdict_cases.submission(student))
        for chapter in registry.CHAPTERS:
            self._write("release_untouched", chapter.notebook, nbformat.read(chapter.release_path(), as_version=4))
        self._write("fork_bomb_cell", f"{CH1}.ipynb", fork_bomb_notebook())
        self.short_subs, self.short_out = root / "short" / "submissions", root / "short" / "out"
        self.short_out.mkdir(parents=True)
        for student in SHORT:
            shutil.move(self.subs / student, self.short_subs / student)
        self.class_root = root / "class" / "course" / "submitted"
        nbgrader_collect(root / "class" / "course", root / "class" / "exchange", root / "class" / "home",
                         class_notebooks())
        self.class_students = sorted(p.name for p in self.class_root.iterdir())
        for student in self.class_students:
            shutil.copytree(self.class_root / student, self.subs / student)
        self.plain_students = sorted({path.split("/")[0] for path in self.redteam} | set(one_verdict_cases.SUBMISSIONS)
                                     | {"release_untouched", "fork_bomb_cell", *self.class_students})
        self.before = hashes(self.subs, self.plain_students)
        self.short_before = hashes(self.short_subs)
        self.result: subprocess.CompletedProcess | None = None
        self.short_result: subprocess.CompletedProcess | None = None

    def _write(self, student: str, name: str, nb) -> None:
        path = self.subs / student / name
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)

    def command(self, *extra: str) -> list[str]:
        return [sys.executable, "-m", "autograder", "grade", str(self.subs), "--out", str(self.out / "grades.csv"),
                "--source", str(self.source), "--gradebook", f"sqlite:///{self.out / 'gradebook.db'}", *OPTIONS,
                *extra]

    def short_command(self) -> list[str]:
        return [sys.executable, "-m", "autograder", "grade", str(self.short_subs), "--out",
                str(self.short_out / "grades.csv"), "--source", str(self.source), "--gradebook",
                f"sqlite:///{self.short_out / 'gradebook.db'}", *SHORT_OPTIONS]

    def grade(self) -> None:
        with support.cpu_burner(), tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            started = time.monotonic()
            short = subprocess.Popen(self.short_command(), stdout=out, stderr=err, cwd=support.REPO)
            try:
                self.result = subprocess.run(self.command(), capture_output=True, cwd=support.REPO, timeout=3000)
                self.seconds = time.monotonic() - started
                short.wait(timeout=600)
            finally:
                short.kill()
                short.wait()
            out.seek(0)
            err.seek(0)
            self.short_result = subprocess.CompletedProcess(short.args, short.returncode, out.read(), err.read())
        self.feedback = subprocess.run([sys.executable, "-m", "autograder", "feedback", str(self.out / "grades.csv"),
                                        "--out", str(self.out / "feedback")], capture_output=True, cwd=support.REPO,
                                       timeout=300)

    @property
    def stderr(self) -> str:
        return self.result.stderr.decode(errors="replace")

    def check(self) -> None:
        assert self.result.returncode == 0, self.stderr[-3000:]
        assert self.short_result.returncode == 0, self.short_result.stderr.decode(errors="replace")[-3000:]

    def rows(self, student: str | None = None) -> list[dict]:
        """The rows of both commands (the short one's students are ``SHORT``)."""
        rows = record.read_csv(self.out / "grades.csv") + record.read_csv(self.short_out / "grades.csv")
        return rows if student is None else [r for r in rows if r["student"] == student]

    def cleanup(self) -> None:
        sandbox.remove_tree(self.short_subs)
        sandbox.remove_tree(self.subs)  # its names and depths are hostile to pytest's own cleanup
