"""Fixtures, and the session's shared runs: each expensive thing happens once and every test that needs it
asserts on its result.

* :func:`nbgrader_course` — one nbgrader course directory; a chapter is generated (``generate_assignment``)
  and autograded (``nbgrader autograde``, all of that chapter's students at once) the first time a test asks
  for it, so ``pytest tests/test_notebooks.py -k 04_encoder_decoder`` touches chapter 4 only;
* :func:`learner_runs` — release notebooks run top to bottom as a learner runs them (nbclient), each once;
* :func:`grading_batch` — one sandboxed ``autograder grade`` batch (``tests/batch.py``) holding every
  submission the grading tests assert on, graded beside a CPU-bound process;
* :func:`lab` and :func:`browser` — one JupyterLab started by ``make lab`` and one headless Chromium.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import support
import torch
from support import nbgrader_meta as _meta

from autograder import registry

# --- which test worker runs what (pytest-xdist, --dist loadgroup) ---------------------------------------


def _group(item) -> str | None:
    """The session run a test reads decides its worker: each run then happens on one worker only."""
    names = set(getattr(item, "fixturenames", ()))
    if "grading_batch" in names:
        return "batch"
    if names & {"lab", "browser", "work_folder", "start_here_run"}:
        return "lab"
    if "nbgrader_course" in names:
        params = getattr(getattr(item, "callspec", None), "params", {})
        chapter = params.get("chapter")
        if chapter is None and "student" in params:
            import one_verdict_cases

            chapter = one_verdict_cases.SUBMISSIONS[params["student"]][0]
        chapter = getattr(chapter, "id", chapter) or registry.CHAPTERS[0].id
        return f"course-{chapter}"
    if "learner_runs" in names:
        return "learner"
    if names & {"edition", "default_edition"}:  # tests/editions.py: built once per test process
        return "edition"
    if "torchrun_trainings" in names:
        return "torchrun"
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = _group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            if item.get_closest_marker("timeout") is None:
                # the first test of a group also waits for the group's session run (setup counts)
                item.add_marker(pytest.mark.timeout(2400))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist sends the ids to the controller
def pytest_collection_finish(session):
    """pytest-xdist's loadgroup sends a group's tests to one worker by the ``@group`` suffix it gives their node
    ids, which it writes to ``item._nodeid``; pytest 9.2 keeps the id elsewhere, and the suffix was silently lost
    (every session run then happened once per worker). Where it is missing, it is added here."""
    if not getattr(session.config.option, "loadgroup", False):  # set on xdist's workers only
        return
    for item in session.items:
        groups = sorted({str(mark.args[0]) for mark in item.iter_markers("xdist_group") if mark.args})
        if groups and "@" not in item.nodeid:
            _suffix(item, "_".join(groups))


def _suffix(item, group: str) -> None:
    nodeid = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):  # pytest >= 9.2
        from _pytest.nodes import coerce_node_id

        item._id = coerce_node_id(nodeid)
    else:
        item._nodeid = nodeid
    assert item.nodeid == nodeid


# --- small fixtures --------------------------------------------------------------------------------


@pytest.fixture
def one_thread():
    """Tiny tensors: one thread avoids OpenMP overhead on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


INLINE = "module://matplotlib_inline.backend_inline"  # figures become outputs, as in JupyterLab

# --- one nbgrader course ------------------------------------------------------------------------------


class NbgraderCourse:
    """One nbgrader course directory for the session. ``autograded(chapter)`` generates the chapter and grades
    its students with ``nbgrader autograde`` (once), then reads the results:

    * ``filled`` — the release with every solution cell taken from the source (without nbgrader's solution
      markers, as a learner's answers): the source notebook run top to bottom (autograde puts the hidden tests
      back); the same notebook as the one-verdict ``ov_honest`` of chapter 1, which reads its verdict;
    * ``untouched`` — the release as learners get it;
    * ``one`` — the release with only the first exercise solved;
    * the one-verdict students of the chapter (``tests/one_verdict_cases.py``).
    """

    def __init__(self, root: Path):
        self.root = root
        (root / "nbgrader_config.py").write_text(support.REPO.joinpath("autograder", "nbgrader_config.py").read_text())
        self._generated: set[str] = set()
        self._graded: dict[str, "Autograded"] = {}

    def release(self, chapter: str) -> Path:
        """The chapter's folder as nbgrader generated it (stamped as ``autograder release`` writes course/)."""
        if chapter not in self._generated:
            from autograder import release

            release.generate_in_course(self.root, support.SOURCE, [chapter])
            self._generated.add(chapter)
        return self.root / "release" / chapter

    def students(self, chapter: str) -> dict[str, nbformat.NotebookNode]:
        import one_verdict_cases
        from redteam import build as redteam

        ch = registry.get(chapter)
        released = nbformat.read(self.release(chapter) / ch.notebook, as_version=4)
        # the answers as a learner would have typed them: no solution markers (as the red-team's notebooks)
        answers = redteam.solutions_of(chapter, support.SOURCE)
        first = f"{ch.exercises[0].name}_solution"
        out = {}
        for student in ("filled", "untouched", "one"):
            nb = nbformat.from_dict(released)
            for cell in nb.cells:
                gid = _meta(cell).get("grade_id")
                if gid in answers and (student == "filled" or (student == "one" and gid == first)):
                    cell.source = answers[gid]
            out[student] = nb
        for student in one_verdict_cases.of_chapter(chapter):
            if one_verdict_cases.run_by(student, "nbgrader") == student:
                out[student] = one_verdict_cases.submission(student)
        return out

    def autograded(self, chapter: str) -> "Autograded":
        if chapter not in self._graded:
            notebook = registry.get(chapter).notebook
            students = self.students(chapter)
            for student, nb in students.items():
                target = self.root / "submitted" / student / chapter / notebook
                target.parent.mkdir(parents=True, exist_ok=True)
                nbformat.write(nb, target)
            done = subprocess.run([sys.executable, "-m", "nbgrader", "autograde", chapter, "--force"], cwd=self.root,
                                  env=support.kernel_env(MPLBACKEND=INLINE), capture_output=True, text=True, timeout=1500)
            self._graded[chapter] = Autograded(self.root, chapter, list(students), done)
        return self._graded[chapter]


class Autograded:
    """One chapter's ``nbgrader autograde`` run: the autograded notebooks and the gradebook's scores."""

    def __init__(self, root: Path, chapter: str, students: list[str], done: subprocess.CompletedProcess):
        self.root, self.chapter, self.students, self.done = root, chapter, students, done

    def check(self) -> None:
        assert self.done.returncode == 0, (f"nbgrader autograde {self.chapter} failed:\n{self.done.stdout[-3000:]}\n"
                                           f"{self.done.stderr[-3000:]}")

    def notebook(self, student: str) -> nbformat.NotebookNode:
        self.check()
        ch = registry.get(self.chapter)
        return nbformat.read(self.root / "autograded" / student / self.chapter / ch.notebook, as_version=4)

    def scores(self, student: str) -> tuple[float, float, dict[str, float]]:
        """(score, max score, {grade id: score}) from the gradebook."""
        from nbgrader.api import Gradebook

        self.check()
        with Gradebook(f"sqlite:///{self.root / 'gradebook.db'}") as gb:
            submission = gb.find_submission(self.chapter, student)
            per_cell = {g.name: float(g.score) for g in submission.notebooks[0].grades}
            return float(submission.score), float(submission.max_score), per_cell


@pytest.fixture(scope="session")
def nbgrader_course(tmp_path_factory) -> NbgraderCourse:
    return NbgraderCourse(tmp_path_factory.mktemp("nbgrader-course"))


# --- learners' runs -------------------------------------------------------------------------------------


class LearnerRuns:
    """Notebooks run top to bottom in a kernel as a learner runs them (errors do not stop the run), each once."""

    def __init__(self, root: Path):
        self.root = root
        self._runs: dict[str, nbformat.NotebookNode] = {}

    def run(self, name: str, nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
        if name not in self._runs:
            from nbclient import NotebookClient

            from autograder.kernel_client import SlicedKernelManager

            cwd = self.root / name
            cwd.mkdir(parents=True)
            nb = nbformat.from_dict(nb)
            client = NotebookClient(nb, kernel_manager_class=SlicedKernelManager, timeout=600, kernel_name="python3",
                                    allow_errors=True, resources={"metadata": {"path": str(cwd)}})
            with client.setup_kernel(env=support.kernel_env()):
                for index, cell in enumerate(nb.cells):
                    client.execute_cell(cell, index)
            self._runs[name] = nb
        return self._runs[name]


@pytest.fixture(scope="session")
def learner_runs(tmp_path_factory) -> LearnerRuns:
    return LearnerRuns(tmp_path_factory.mktemp("learner-runs"))


# --- the grading batch ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def grading_batch(tmp_path_factory):
    """Every submission the grading tests assert on, graded once by ``autograder grade`` in the sandbox."""
    if not support._bubblewrap_usable():
        pytest.skip(support.needs_sandbox.kwargs["reason"])
    import batch

    graded = batch.Batch(tmp_path_factory.mktemp("batch"))
    graded.grade()
    yield graded
    graded.cleanup()


# --- the learner's side: a work folder, start-here, JupyterLab, a browser ----------------------------------

FILLED = support.FILLED


@pytest.fixture(scope="session")
def work_folder(tmp_path_factory) -> Path:
    """A learner's work folder, as ``make lab`` fills it (``autograder workspace``)."""
    work = tmp_path_factory.mktemp("lab") / "work"
    done = subprocess.run([sys.executable, "-m", "autograder", "workspace", "--into", str(work)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return work


@pytest.fixture(scope="session")
def start_here_run(work_folder) -> nbformat.NotebookNode:
    """course/00_start_here.ipynb run top to bottom in the work folder, as a learner first runs it."""
    from nbclient import NotebookClient

    from autograder.kernel_client import SlicedKernelManager

    nb = nbformat.read(work_folder / "00_start_here.ipynb", as_version=4)
    NotebookClient(nb, kernel_manager_class=SlicedKernelManager, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(work_folder)}}).execute(env=support.kernel_env(MPLBACKEND=INLINE))
    return nb


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_lab_settings(settings_dir: Path) -> None:
    """Lab settings for a reproducible run: every cell in the DOM, no news or update checks."""
    import json

    settings = {
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
            "fetchNews": "false", "checkForUpdates": False},
    }
    for name, value in settings.items():
        path = settings_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


@pytest.fixture(scope="session")
def lab(work_folder):
    """`make lab` as a learner starts it, on the session's work folder (plus chapter 1 with its answers in
    work/filled/), on a free port; with a bare PATH, as a fresh login shell has it."""
    import os
    import secrets
    import shutil
    import time
    import urllib.request

    if not support.STAMP.exists():
        pytest.skip(f"`make lab` needs the environment made by `make install` ({support.STAMP} is missing)")
    first = registry.CHAPTERS[0]
    filled = nbformat.read(first.release_path(), as_version=4)
    assert support.fill_solutions(filled, nbformat.read(first.source_path(), as_version=4)) > 0
    (work_folder / FILLED).mkdir()
    nbformat.write(filled, work_folder / FILLED / first.notebook)
    tmp = work_folder.parent
    _write_lab_settings(tmp / "settings")
    port, token = _free_port(), secrets.token_hex(16)
    lab_args = (f"--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token} "
                f"--LabApp.user_settings_dir={tmp / 'settings'} --LabApp.workspaces_dir={tmp / 'workspaces'}")
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": support.BARE_PATH, "LANG": "C.UTF-8",
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "MPLBACKEND": INLINE, "OMP_NUM_THREADS": "1",
           "TDD_QUICK": "1", "SHELL": shutil.which("bash") or "/bin/sh"}
    log = tmp / "jupyter.log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(["make", "--no-print-directory", "-C", str(support.REPO), "-o", str(support.STAMP),
                                 "lab", f"VENV={support.VENV}", f"WORK={work_folder}", f"LAB_ARGS={lab_args}"],
                                env=env, stdout=log_file, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"make lab exited with status {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"JupyterLab did not answer within 120 s:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield {"base": base, "token": token, "work": work_folder, "log": log, "port": port, "env": env}
    finally:
        proc.terminate()  # make execs jupyter lab: this is the server
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium (Debian's, or $TDD_CHROMIUM) driven by Playwright."""
    from support import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.is_file():
        pytest.skip(f"Chromium not found at {CHROMIUM}: install it (Debian/Ubuntu: `sudo apt-get install chromium`) "
                    "or set TDD_CHROMIUM=/path/to/chromium to run the browser test; CI installs it in .ci/run")
    pytest.importorskip("playwright.sync_api", reason="the browser test needs `pip install -e '.[test]'` (playwright)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()
