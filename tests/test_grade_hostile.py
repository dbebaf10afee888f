"""The batch grader, as root with bubblewrap, on the second red-team batch (tests/redteam/hostile.py).

Graded once, with a CPU-bound process running beside it (a busy machine), and checked
for: exact points and statuses per student, an honest control student with full marks,
host files that keep owner, mode and content, a root-only secret that appears in no
output, no terminal control bytes in any output, a CSV every reader splits the same way,
and feedback for every student. The batch is the session's shared one (tests/batch.py), which also holds
fork bombs beside the honest control. Then the cases that need a run of their own: a kernel that cannot
start, a self-check killed while its notebook stalls.
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import batch as batch_module
import nbformat
import pytest
from redteam import build as redteam
from redteam import hostile

from autograder import record, registry, sandbox

REPO = Path(__file__).resolve().parents[1]
CH1 = redteam.CH1
NB = f"{CH1}.ipynb"

pytestmark = [
    pytest.mark.slow, pytest.mark.sandbox,
    pytest.mark.skipif(sandbox.detect() != "bwrap",
                       reason="bubblewrap (bwrap) is not usable here: the hostile batch needs the sandbox"),
]


def _grade(subs: Path, out: Path, *extra: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "autograder", "grade", str(subs), "--out", str(out / "grades.csv"), "--jobs", "2",
           "--gradebook", "none", "--cell-timeout", "20", "--notebook-timeout", "150", "--chapter", CH1, *extra]
    return subprocess.run(cmd, capture_output=True, cwd=REPO, timeout=timeout)


@pytest.fixture()
def batch(grading_batch):
    """The hostile students of the session's shared batch (tests/batch.py), in the shape these tests read
    (``out``, ``result``: the hostile command's; ``outs`` and ``results``: every command's)."""
    return {"tmp": grading_batch.root, "out": grading_batch.hostile_out, "host": grading_batch.host,
            "before": grading_batch.host_before, "expected": grading_batch.hostile,
            "result": grading_batch.hostile_result, "seconds": grading_batch.hostile_seconds,
            "feedback": grading_batch.hostile_feedback, "rows": grading_batch.rows(),
            "outs": [out for _, out in grading_batch.parts()],
            "feedbacks": [grading_batch.feedback, grading_batch.hostile_feedback],
            "results": [grading_batch.result, grading_batch.hostile_result, grading_batch.short_result]}


def test_hostile_batch_completes(batch):
    for result in batch["results"]:
        assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]


def test_hostile_batch_exact_points_and_statuses(batch):
    rows = batch["rows"]
    wrong = []
    for student, want in batch["expected"].items():
        mine = [r for r in rows if r["student"] == student]
        if not mine:
            wrong.append(f"{student!r}: no rows")
            continue
        got_points = sum(float(r["points"]) for r in mine)
        if got_points != want["points"]:
            wrong.append(f"{student!r}: {got_points} points, expected {want['points']}: "
                         + "; ".join(f"{r['exercise']} {r['status']} {r['reason'][:120]}" for r in mine))
        for exercise, status in want["statuses"].items():
            found = [r for r in mine if r["exercise"] == exercise]
            if len(found) != 1:
                wrong.append(f"{student!r} {exercise}: {len(found)} rows, expected one")
            elif status != "any" and found[0]["status"] != status:
                wrong.append(f"{student!r} {exercise}: {found[0]['status']} ({found[0]['reason'][:160]}), "
                             f"expected {status}")
    assert not wrong, "\n".join(wrong)


def test_hostile_batch_static_pass_on_a_huge_cell_is_quick(batch):
    """A 420 KB cell: the static pass parses each cell once and walks it once (it took 6 s of CPU when every
    exercise parsed every cell again), as the grader reports it for that notebook."""
    reported = _reported(batch["result"].stderr)
    assert reported["huge_cell"]["static"] is not None, reported["huge_cell"]
    assert reported["huge_cell"]["static"] < 4, reported["huge_cell"]
    assert reported["control"]["static"] < 4, reported["control"]


def test_hostile_batch_hidden_student_folder_is_listed_as_skipped(batch):
    stderr = batch["result"].stderr.decode(errors="replace")
    assert "skipped: .hidden: its name starts with '.' (hidden), so it is not graded" in stderr, stderr[-3000:]
    assert not [r for r in record.read_csv(batch["out"] / "grades.csv") if r["student"] == ".hidden"]


def test_hostile_batch_duplicates_are_reported_not_counted_twice(batch):
    rows = [r for r in record.read_csv(batch["out"] / "grades.csv")  # its chapter 1 (the others are missing)
            if r["student"] == "dup" and (r["exercise"] in hostile.CH1_POINTS or r["exercise"] == "-")]
    assert sum(float(r["max_points"]) for r in rows) == hostile.FULL
    duplicate = [r for r in rows if r["status"] == "duplicate"]
    assert len(duplicate) == 1 and duplicate[0]["notebook"].endswith("-Copy1.ipynb")


def test_hostile_batch_host_files_keep_owner_mode_and_content(batch):
    for name, path in batch["host"].items():
        assert batch_module.fingerprint(path) == batch["before"][name], name


def test_hostile_batch_secret_appears_in_no_output(batch):
    blobs = [blob for result in batch["results"] for blob in (result.stdout, result.stderr)]
    blobs += [blob for feedback in batch["feedbacks"] for blob in (feedback.stdout, feedback.stderr)]
    blobs += [p.read_bytes() for out in batch["outs"] for p in out.rglob("*") if p.is_file()]
    assert not any(hostile.SECRET in blob for blob in blobs)
    assert not any(redteam.SENTINEL.encode() in blob for blob in blobs)


def test_hostile_batch_output_has_no_terminal_control_bytes(batch):
    blobs = [blob for result in batch["results"] for blob in (result.stdout, result.stderr)]
    for blob in blobs + [(out / "grades.csv").read_bytes() for out in batch["outs"]]:
        assert b"\x1b" not in blob and b"\x07" not in blob and b"\x9b" not in blob


def test_hostile_batch_csv_splits_the_same_for_every_reader(batch):
    data = (batch["out"] / "grades.csv").read_bytes()
    rows = record.read_csv(batch["out"] / "grades.csv")
    with open(batch["out"] / "grades.csv", newline="") as f:
        plain = list(csv.reader(f))
    assert len(plain) == len(rows) + 1 and all(len(r) == len(record.FIELDS) for r in plain)
    assert data.count(b"\r\n") == len(rows) + 1  # no bare carriage return splits a row for line-based readers
    for row in plain[1:]:
        assert not any(cell.startswith(("=", "+", "-", "@")) for cell in row), row


def test_hostile_batch_feedback_for_every_student(batch):
    assert batch["feedback"].returncode == 0, batch["feedback"].stderr[-2000:]
    rows = record.read_csv(batch["out"] / "grades.csv")
    students = {r["student"] for r in rows}
    pages = {p.name for p in (batch["out"] / "feedback").iterdir()}
    assert {record.feedback_filename(s) for s in students} == pages
    assert record.feedback_filename("a b") != record.feedback_filename("a_b")


def test_fork_bomb_beside_an_honest_student_on_a_busy_machine(grading_batch):
    """Fork bombs at the top of a notebook and inside padding_mask, graded in the shared batch (two jobs, a
    CPU-bound process beside it): the bomb loses padding_mask only (it leaves tiled_attention unanswered, as
    the attacks do), and the honest control keeps full marks."""
    grading_batch.check()
    ch1 = {exercise.name for exercise in registry.get(CH1).exercises}  # every chapter is expected: the rest missing
    honest = [r for r in grading_batch.rows("control") if r["exercise"] in ch1]
    assert [r["status"] for r in honest] == ["passed"] * len(registry.get(CH1).exercises), honest
    bomb_rows = {r["exercise"]: r["status"] for r in grading_batch.rows("fork_bomb_cell") if r["exercise"] in ch1}
    assert bomb_rows["padding_mask"] != "passed"
    others = {e: s for e, s in bomb_rows.items() if e != "padding_mask"}  # what it answers beside the bombs
    assert others == {e: "passed" if e in redteam.BESIDE_ATTACK else "missing" for e in ch1 - {"padding_mask"}}, \
        bomb_rows


def _live_in_namespace(runner: sandbox.Runner) -> list[int]:
    """Processes of the runner's pid namespace that still run, other than its init and the runner."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or sandbox._pid_namespace(int(entry)) != runner._namespace:
            continue
        status = sandbox._proc_status(entry)
        if status.get("State", "Z").startswith(("Z", "X")):
            continue
        if status.get("NSpid", "").split()[-1:] not in (["1"], [str(runner._runner_pid)]):
            found.append(int(entry))
    return found


def test_reap_kills_a_fork_bomb_that_a_cell_left_running():
    """A cell starts fork bombs and returns: once its request is answered, none of them may run on
    (one pass of "list, then kill" misses the children born during the pass, and one is enough)."""
    runner = sandbox.Runner(sandbox.Limits(cell_seconds=60))
    runner.start()
    try:
        cell = ("import os\nfor _ in range(8):\n    if os.fork() == 0:\n        while True:\n            try:\n"
                "                os.fork()\n            except OSError:\n                pass\n")
        runner.request({"op": "cell", "source": cell}, 60)
        deadline = time.monotonic() + 30  # killed processes may take a moment to exit on a busy machine
        while _live_in_namespace(runner) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _live_in_namespace(runner) == []
        assert runner.request({"op": "cell", "source": "x = 1"}, 60)["ok"] is True  # the runner lives on
    finally:
        runner.close()


def test_other_chapters_hidden_checks_and_answers_not_yet_due_never_reach_the_reason():
    """A chapter-1 submission that reads chapter 2's checks (hidden cases) and chapter 6's answers and raises
    them as its error message: nothing of them appears in its rows (what its feedback shows)."""
    from autograder import verdict

    later = registry.CHAPTERS[-1]
    files = [registry.CHAPTERS[1].checks_file(), *later.answer_files()]
    nb = redteam.solved(CH1, REPO / "autograder" / "source")
    redteam.set_cell(nb, "padding_mask_solution", "def padding_mask(tokens, pad_id):\n"
                     f"    found = [open(f).read() for f in {files!r}]\n"
                     "    raise ValueError(' | '.join(text[-200:].replace(chr(10), ' ') for text in found))\n")
    rows = verdict.grade_notebook(nbformat.writes(nb).encode(), registry.get(CH1),
                                  limits=sandbox.Limits(cell_seconds=60))
    reasons = " ".join(r["reason"] for r in rows)
    for f in files:
        tail = Path(f).read_text()[-200:].replace("\n", " ").strip()
        assert tail[-40:] not in reasons, f"{f} reached the feedback: {reasons[:300]}"
    assert [r["status"] for r in rows if r["exercise"] == "padding_mask"] == ["error"]


PROGRESS = re.compile(r"^\[\d+/\d+\] (?P<student>.+?): .*: [\d.]+/[\d.]+ in (?P<seconds>[\d.]+) s"
                      r"(?: \(static pass (?P<static>[\d.]+) s CPU\))?(?: \(\d+ nbformat warning\(s\) [^)]*\))?$")


def _reported(stderr: bytes) -> dict[str, dict[str, float]]:
    """Student -> the seconds the grader reports on its progress line for that student's notebook."""
    found = {}
    for line in stderr.decode(errors="replace").splitlines():
        m = PROGRESS.match(line)
        if m:
            found[m["student"]] = {"seconds": float(m["seconds"]),
                                   "static": float(m["static"]) if m["static"] else None}
    return found


def test_kernel_that_cannot_start_gives_every_exercise_one_status_at_once(tmp_path):
    """Issue 8: "a runner that cannot start (e.g. --memory-gb 1) gives every exercise a clear status in
    under 10 s" — per notebook, as the grader itself reports it (not the command's own start-up)."""
    for student in ("alice", "bob"):
        (tmp_path / "submissions" / student).mkdir(parents=True)
        nbformat.write(redteam.solved(CH1, REPO / "autograder" / "source"), tmp_path / "submissions" / student / NB)
    (tmp_path / "out").mkdir()
    result = _grade(tmp_path / "submissions", tmp_path / "out", "--memory-gb", "1", "--jobs", "1")
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    rows = record.read_csv(tmp_path / "out" / "grades.csv")
    assert {r["status"] for r in rows} == {"crashed"}
    assert all("could not start" in r["reason"] and "memory limit of 1 GB" in r["reason"] for r in rows), rows
    assert len(rows) == 2 * len(registry.get(CH1).exercises)
    reported = _reported(result.stderr)
    assert set(reported) == {"alice", "bob"}, result.stderr.decode(errors="replace")[-2000:]
    for student, timing in reported.items():
        assert timing["seconds"] < 10, f"{student}: {timing['seconds']} s"
    # Not cached as graded: a rerun grades both again (here with the same limit: it fails again at once).
    state = tmp_path / "out" / "grades.csv.state"
    assert not (state.is_dir() and any(state.iterdir()))
    again = _grade(tmp_path / "submissions", tmp_path / "out", "--memory-gb", "1", "--jobs", "1")
    assert b"grading 2 notebook(s)" in again.stderr and b"already graded" not in again.stderr


def _runner_pids() -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"autograder.runner" in cmd:
                pids.add(int(entry))
    return pids


def test_selfcheck_killed_while_its_notebook_stalls_leaves_no_runner(tmp_path):
    nb = redteam.solved(CH1, REPO / "autograder" / "source")
    redteam.insert_after_imports(nb, "import time\ntime.sleep(3600)\n")
    path = tmp_path / NB
    nbformat.write(nb, path)
    before = _runner_pids()
    proc = subprocess.Popen([sys.executable, "-m", "autograder", "check", str(path)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (_runner_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    mine = _runner_pids() - before
    assert mine, "the self-check never started its kernel"
    time.sleep(2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while (_runner_pids() & mine) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not (_runner_pids() & mine), "the kernel outlived the killed self-check"


def test_hostile_batch_nbformat_warnings_are_counted_on_the_notebooks_line(batch):
    """dup_ids has two cells with one id: nbformat warns while reading it; the grader says so once, on that
    notebook's progress line, and prints none of nbformat's own warnings."""
    lines = batch["result"].stderr.decode(errors="replace").splitlines()
    (dup,) = [line for line in lines if PROGRESS.match(line) and PROGRESS.match(line)["student"] == "dup_ids"]
    assert "(1 nbformat warning(s) while reading it" in dup, dup
    assert [line for line in lines if "nbformat" in line.lower() and not PROGRESS.match(line)] == []
