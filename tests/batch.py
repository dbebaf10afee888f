"""The session's one grading batch: every submission the grading tests assert on, graded once.

``Batch(root)`` writes ``root/submissions/`` (graded) beside ``root/source/`` (the source notebooks with a
sentinel planted in their hidden tests, given as ``--source``) and ``root/out/``:

* the red-team corpus (``tests/redteam/build.py``; its honest student has every chapter solved);
* the one-verdict submissions (``tests/one_verdict_cases.py``);
* ``release_untouched``: every chapter's release as learners get it (``tests/test_run_all.py``);
* a class collected through nbgrader's own exchange (``submitted/<student>/<assignment>/<notebook>``), which
  ``tests/test_shard.py`` also grades in shards from its own copy (``class_root``).

and ``root/hostile/{submissions,source,out}``:

* the second, hostile batch (``tests/redteam/hostile.py``), with host files outside every sandbox and its
  honest ``control`` student;
* ``fork_bomb_cell``: fork bombs at the top of the notebook and inside ``padding_mask``.

``grade()`` runs ``python -m autograder grade`` on each, sandboxed, with two jobs: the main corpus first (the
machine busy with it and with the short-limit command below), then the hostile one beside a CPU-bound process
(``support.cpu_burner``: more processes runnable than cores, whichever tests run beside it; the honest control
must still get full marks), then ``autograder
feedback`` on both. The cell timeout is the grader's default, 60 s (20 s failed honest checks on a busy 2-core
CI machine). Each test reads its own students' rows.

The students who run into a time limit (``SHORT``: two infinite loops and a kernel that stops reading its
input) are graded by a third ``grade`` command with short limits (``SHORT_OPTIONS``), from ``root/short/``,
beside the main one: in the main batch they waited out 60 s and 300 s. ``rows()`` reads the three CSVs.
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

from autograder import environment, record, registry, sandbox

CH1 = redteam.CH1
# Every chapter is expected (--chapter each): a chapter given is graded, and one a student lacks is `missing`;
# the grader grades no chapter it was not given (a notebook of another chapter is set aside, unmatched).
OPTIONS = ("--jobs", "2", "--cell-timeout", "60", "--notebook-timeout", "300",
           *(arg for chapter in registry.CHAPTERS for arg in ("--chapter", chapter.id)))
COURSE_ID = "tdd"
# The students that wait out a limit, and the limits they are graded with: what they test is that the limit
# holds and that the rest of the notebook is graded after it, not its length. Their other cells are cheap
# (build.BESIDE_ATTACK), but chapter 1's import cell loads PyTorch: 15 s was too short for it on a machine
# loaded seven deep (the cell timed out, was skipped after the restart, and every exercise then failed).
SHORT = ("infinite_loop", "infinite_loop_cell", "stops_reading")
SHORT_OPTIONS = ("--jobs", "3", "--cell-timeout", "40", "--notebook-timeout", "150", *OPTIONS[6:])


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
    environment.stamp_gradebooks_in_process()  # the exchange's apps make gradebooks
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
        # The hostile corpus is graded by its own command, beside a CPU-bound process (``grade``), in a root of its
        # own whose source/ is a copy of the planted one: its links to the source expect ROOT/source.
        self.hostile_root = root / "hostile"
        self.hostile_subs, self.hostile_out = self.hostile_root / "submissions", self.hostile_root / "out"
        shutil.copytree(self.source, self.hostile_root / "source")
        self.hostile_out.mkdir(parents=True)
        self.hostile = hostile.build(self.hostile_root, self.hostile_root / "source", self.host)
        for student in one_verdict_cases.SUBMISSIONS:
            if one_verdict_cases.run_by(student, "grade") != student:
                continue  # graded as the notebook it is identical to (one_verdict_cases.SAME_AS)
            chapter = registry.get(one_verdict_cases.SUBMISSIONS[student][0])
            self._write(student, chapter.notebook, one_verdict_cases.submission(student))
        for chapter in registry.CHAPTERS:
            self._write("release_untouched", chapter.notebook, nbformat.read(chapter.release_path(), as_version=4))
        self._write("fork_bomb_cell", f"{CH1}.ipynb", fork_bomb_notebook(), self.hostile_subs)  # beside the control
        self.short_subs, self.short_out = root / "short" / "submissions", root / "short" / "out"
        self.short_out.mkdir(parents=True)
        for student in SHORT:
            shutil.move(self.subs / student if (self.subs / student).exists() else self.hostile_subs / student,
                        self.short_subs / student)
        self.class_root = root / "class" / "course" / "submitted"
        nbgrader_collect(root / "class" / "course", root / "class" / "exchange", root / "class" / "home",
                         class_notebooks())
        self.class_students = sorted(p.name for p in self.class_root.iterdir())
        for student in self.class_students:
            shutil.copytree(self.class_root / student, self.subs / student)
        graded_ov = {one_verdict_cases.run_by(s, "grade") for s in one_verdict_cases.SUBMISSIONS}
        self.plain_students = sorted({path.split("/")[0] for path in self.redteam} | graded_ov
                                     | {"release_untouched", *self.class_students})
        self.before = hashes(self.subs, self.plain_students)
        self.hostile_plain = ["control", "fork_bomb_cell"]  # the hostile students with plain files only
        self.hostile_before = hashes(self.hostile_subs, self.hostile_plain)
        self.short_before = hashes(self.short_subs)
        self.result: subprocess.CompletedProcess | None = None
        self.hostile_result: subprocess.CompletedProcess | None = None
        self.short_result: subprocess.CompletedProcess | None = None

    def _write(self, student: str, name: str, nb, subs: Path | None = None) -> None:
        path = (subs or self.subs) / student / name
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)

    def command(self, *extra: str) -> list[str]:
        return self._command(self.subs, self.out, self.source, OPTIONS, *extra)

    def hostile_command(self) -> list[str]:
        return self._command(self.hostile_subs, self.hostile_out, self.hostile_root / "source", OPTIONS)

    def short_command(self) -> list[str]:
        return self._command(self.short_subs, self.short_out, self.source, SHORT_OPTIONS)

    @staticmethod
    def _command(subs: Path, out: Path, source: Path, options: tuple[str, ...], *extra: str) -> list[str]:
        return [sys.executable, "-m", "autograder", "grade", str(subs), "--out", str(out / "grades.csv"),
                "--source", str(source), "--gradebook", f"sqlite:///{out / 'gradebook.db'}", *options, *extra]

    def parts(self) -> list[tuple[Path, Path]]:
        """(submissions, out) of each command: the main one, the hostile one, the short-limit one."""
        return [(self.subs, self.out), (self.hostile_subs, self.hostile_out), (self.short_subs, self.short_out)]

    def grade(self) -> None:
        """The main and the short-limit commands side by side, then the hostile corpus beside a CPU-bound process
        (while the main command ran, the machine was busy with it: the burner is for the hostile corpus, which
        holds the honest control, whichever tests run)."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            started = time.monotonic()
            short = subprocess.Popen(self.short_command(), stdout=out, stderr=err, cwd=support.REPO)
            try:
                self.result = subprocess.run(self.command(), capture_output=True, cwd=support.REPO, timeout=3000)
                self.seconds = time.monotonic() - started
                with support.cpu_burner():
                    started = time.monotonic()
                    self.hostile_result = subprocess.run(self.hostile_command(), capture_output=True,
                                                         cwd=support.REPO, timeout=3000)
                    self.hostile_seconds = time.monotonic() - started
                short.wait(timeout=600)
            finally:
                short.kill()
                short.wait()
            out.seek(0)
            err.seek(0)
            self.short_result = subprocess.CompletedProcess(short.args, short.returncode, out.read(), err.read())
        self.feedback, self.hostile_feedback = (
            subprocess.run([sys.executable, "-m", "autograder", "feedback", str(folder / "grades.csv"), "--out",
                            str(folder / "feedback")], capture_output=True, cwd=support.REPO, timeout=300)
            for folder in (self.out, self.hostile_out))

    @property
    def stderr(self) -> str:
        return self.result.stderr.decode(errors="replace")

    def check(self) -> None:
        for result in (self.result, self.hostile_result, self.short_result):
            assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]

    def rows(self, student: str | None = None) -> list[dict]:
        """The rows of the three commands (the short one's students are ``SHORT``)."""
        rows = [row for _, out in self.parts() for row in record.read_csv(out / "grades.csv")]
        return rows if student is None else [r for r in rows if r["student"] == student]

    def cleanup(self) -> None:
        for subs, _ in self.parts():
            sandbox.remove_tree(subs)  # the hostile names and depths are hostile to pytest's own cleanup
