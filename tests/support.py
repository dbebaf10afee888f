"""What many test modules share: the repository's paths, the kernel environment, the sandbox skip rule,
and running a course command. Fixtures (and the session-wide runs every test reads) are in conftest.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import sandbox
from solutions.notebook import QUICK_ENV

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "autograder" / "source"
COURSE = REPO / "course"
VENV = Path(sys.prefix)
STAMP = VENV / ".installed"  # written by `make install`
BARE_PATH = "/usr/local/bin:/usr/bin:/bin"  # a shell as a fresh login gives it: no virtualenv, no course python


def kernel_env(**extra: str) -> dict[str, str]:
    """A notebook kernel as the tests run it: one core (like Binder), short training budgets, figures off screen,
    and this environment's scripts first on PATH (nbgrader runs ``alembic`` by name)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONHASHSEED="0")
    env.update({QUICK_ENV: "1"}, **extra)
    env["PATH"] = str(VENV / "bin") + os.pathsep + env.get("PATH", "")
    return env


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def solution_sources(nb) -> dict[str, str]:
    """grade id -> source of each solution cell (with nbgrader's solution markers, as in the source notebook)."""
    return {nbgrader_meta(c)["grade_id"]: c.source for c in nb.cells if nbgrader_meta(c).get("solution")}


def _bubblewrap_usable() -> bool:
    return sandbox.detect() == "bwrap"


needs_sandbox = pytest.mark.skipif(
    not _bubblewrap_usable(),
    reason="bubblewrap (bwrap) is not usable here (its real probe failed): the grader's sandbox cannot be tested; "
           "install bubblewrap and allow user namespaces (CI installs it as root)")


def sandboxed(test):
    """A test that grades in the real sandbox: skipped without bubblewrap, marked ``sandbox`` and ``slow``."""
    for mark in (needs_sandbox, pytest.mark.sandbox, pytest.mark.slow):
        test = mark(test)
    return test


def autograder(*args, env: dict | None = None, timeout: float = 900, **kw) -> subprocess.CompletedProcess:
    """``python -m autograder ARGS`` in a child process, from the repository (text output)."""
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, env=env, timeout=timeout, **kw)


def cli(capsys, *argv) -> tuple[int, str, str]:
    """``python -m autograder ARGV`` in this process: (exit status, stdout, stderr)."""
    from autograder.__main__ import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# The CPU-bound process of :func:`cpu_burner`. It keeps more processes runnable than there are cores: it spins
# while the others (the runnable count of /proc/loadavg, less itself) leave a core idle or exactly fill the cores,
# and sleeps while they are already more than the cores. Alone with a grading command of two jobs on two cores it
# is the third process, as a plain busy loop was; in `make test`, where the other test worker keeps the machine
# oversubscribed, it does not take a core from it. Where /proc/loadavg cannot be read it always spins. (argv[1], when
# given, is read instead of /proc/loadavg: tests/test_load_keeper.py.)
LOAD_KEEPER = """
import os, sys, time
LOADAVG = sys.argv[1] if len(sys.argv) > 1 else "/proc/loadavg"
cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

def others_running():
    try:
        with open(LOADAVG) as f:
            return int(f.read().split()[3].split("/")[0]) - 1
    except (OSError, ValueError, IndexError):
        return 0

while True:
    if others_running() > cores:
        time.sleep(0.02)
    else:
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            pass
"""


@contextlib.contextmanager
def cpu_burner():
    """A CPU-bound process beside the block, as long as the machine is not already busier: verdicts may not
    depend on an idle machine (:data:`LOAD_KEEPER`)."""
    proc = subprocess.Popen([sys.executable, "-c", LOAD_KEEPER])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


# --- the browser ---------------------------------------------------------------------------------------

CHROMIUM = Path(os.environ.get("TDD_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
FILLED = "filled"  # the lab's work-folder sub-folder holding chapter 1 with the answers (tests/test_browser.py)
SOLUTION_MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)


def fill_solutions(release, source) -> int:
    """Put the source notebook's answers into the release's solution cells; returns how many."""
    answers = {
        cell.metadata["nbgrader"]["grade_id"]: cell.source
        for cell in source.cells
        if cell.metadata.get("nbgrader", {}).get("solution")
    }
    filled = 0
    for cell in release.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            grade_id = meta["grade_id"]
            if grade_id not in answers:
                raise AssertionError(f"solution cell {grade_id!r} of the release is not in the source notebook")
            cell.source = SOLUTION_MARKERS.sub("", answers[grade_id])
            filled += 1
    return filled


def run_coroutine(coroutine):
    """``asyncio.run(coroutine)`` in a thread of its own: a session fixture of the same test worker (Playwright's
    sync API) may hold a running event loop in the main thread, where asyncio.run refuses to start."""
    import asyncio
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
