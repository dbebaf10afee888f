"""The batch grader against the red-team corpus (tests/redteam/build.py): exact scores and statuses."""

from __future__ import annotations

import csv
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder import record, registry, sandbox
from redteam import build as redteam

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = registry.ids()

needs_sandbox = pytest.mark.skipif(
    sandbox.detect() != "bwrap",
    reason="bubblewrap (bwrap) is not usable here (real probe failed): network/file-system isolation cannot be "
           "tested; install bubblewrap and allow user namespaces (CI installs it as root)")


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _grade(tmp: Path, source: Path, jobs: int = 2, extra: list[str] = (), **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "autograder", "grade", str(tmp / "submissions"), "--out", str(tmp / "out" / "grades.csv"),
           "--jobs", str(jobs), "--source", str(source), "--gradebook", f"sqlite:///{tmp / 'out' / 'gradebook.db'}",
           "--cell-timeout", "20", "--notebook-timeout", "300", "--chapter", redteam.CH1, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, **kw)


def _rows(path: Path) -> list[dict]:
    return record.read_csv(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("redteam")
    source = tmp / "source"
    shutil.copytree(REPO / "autograder" / "source", source)
    redteam.plant_sentinel(source)
    manifest = redteam.build(tmp, source, tuple(CHAPTERS))
    (tmp / "out").mkdir()
    before = _hashes(tmp / "submissions")
    started = time.monotonic()
    burner = subprocess.Popen([sys.executable, "-c", "while True:\n    pass"])  # a busy machine
    try:
        result = _grade(tmp, source)
    finally:
        burner.kill()
        burner.wait()
    return {"tmp": tmp, "source": source, "manifest": manifest, "before": before, "result": result,
            "seconds": time.monotonic() - started}


@needs_sandbox
@pytest.mark.sandbox
@pytest.mark.slow
def test_grade_redteam_exact_scores(corpus):
    result = corpus["result"]
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _rows(corpus["tmp"] / "out" / "grades.csv")
    got = {}
    for row in rows:
        got.setdefault(row["notebook"], {})[row["exercise"]] = [float(row["points"]), row["status"]]
    wrong = []
    for sub, expected in corpus["manifest"].items():
        for ex, (points, status) in expected.items():
            actual = got.get(sub, {}).get(ex)
            if actual != [float(points), status]:
                reason = next((r["reason"] for r in rows if r["notebook"] == sub and r["exercise"] == ex), "")
                wrong.append(f"{sub} {ex}: expected {points} {status}, got {actual} ({reason[:200]})")
    assert not wrong, "\n".join(wrong)
    assert set(got) == set(corpus["manifest"])


@needs_sandbox
@pytest.mark.sandbox
@pytest.mark.slow
def test_grade_reports_a_syntax_error_as_such_with_its_line(corpus):
    rows = _rows(corpus["tmp"] / "out" / "grades.csv")
    reason = next(r["reason"] for r in rows if r["notebook"].startswith("syntax_error/") and r["exercise"] == "padding_mask")
    assert "syntax error (line 2" in reason and "not done" not in reason, reason


@needs_sandbox
@pytest.mark.sandbox
@pytest.mark.slow
def test_grade_leaves_submissions_byte_identical(corpus):
    assert corpus["result"].returncode == 0
    assert _hashes(corpus["tmp"] / "submissions") == corpus["before"]


@needs_sandbox
@pytest.mark.sandbox
@pytest.mark.slow
def test_grade_gradebook_matches_csv_and_nbgrader_export(corpus):
    tmp = corpus["tmp"]
    from nbgrader.api import Gradebook

    rows = _rows(tmp / "out" / "grades.csv")
    totals: dict[tuple[str, str], float] = {}
    for row in rows:
        if row["exercise"] != "-" and row["status"] != "invalid" and (tmp / "submissions" / row["notebook"]).is_file():
            chapter = Path(row["notebook"]).stem
            totals[(row["student"], chapter)] = totals.get((row["student"], chapter), 0.0) + float(row["points"])
    with Gradebook(f"sqlite:///{tmp / 'out' / 'gradebook.db'}") as gb:
        for (student, chapter), score in totals.items():
            sub = gb.find_submission(chapter, student)
            assert sub.score == pytest.approx(score), (student, chapter)
        assert {s.id for s in gb.students} <= {r["student"] for r in rows}
    export = tmp / "out" / "export.csv"
    config = tmp / "out" / "nbgrader_config.py"
    config.write_text(f"c.CourseDirectory.db_url = 'sqlite:///{tmp / 'out' / 'gradebook.db'}'\n"
                      f"c.CsvExportPlugin.to = '{export}'\n")
    done = subprocess.run([sys.executable, "-m", "nbgrader", "export"], cwd=tmp / "out", capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(export, newline="") as f:
        exported = {(r["student_id"], r["assignment"]): float(r["score"]) for r in csv.DictReader(f)}
    for key, score in totals.items():
        assert exported[key] == pytest.approx(score)


@needs_sandbox
@pytest.mark.sandbox
@pytest.mark.slow
def test_grade_rerun_is_idempotent(corpus):
    tmp = corpus["tmp"]
    csv_before = (tmp / "out" / "grades.csv").read_bytes()
    db_rows = _rows(tmp / "out" / "grades.csv")
    again = _grade(tmp, corpus["source"])
    assert again.returncode == 0, again.stderr[-2000:]
    assert (tmp / "out" / "grades.csv").read_bytes() == csv_before
    assert "already graded" in again.stderr
    assert len(db_rows) == len(_rows(tmp / "out" / "grades.csv"))


@needs_sandbox
@pytest.mark.sandbox
@pytest.mark.slow
def test_grade_survives_sigkill_at_random_points(tmp_path):
    source = REPO / "autograder" / "source"
    subs = tmp_path / "submissions"
    for student, only in (("a", None), ("b", {"softmax"}), ("c", set()), ("d", {"causal_mask", "padding_mask"})):
        path = subs / student / f"{redteam.CH1}.ipynb"
        path.parent.mkdir(parents=True)
        import nbformat
        nbformat.write(redteam.solved(redteam.CH1, source, only), path)
    (tmp_path / "out").mkdir()
    reference = tmp_path / "reference"
    (reference / "out").mkdir(parents=True)
    shutil.copytree(subs, reference / "submissions")
    assert _grade(reference, source).returncode == 0
    rng = random.Random(0)
    for _ in range(3):
        cmd = [sys.executable, "-m", "autograder", "grade", str(subs), "--out", str(tmp_path / "out" / "grades.csv"),
               "--jobs", "2", "--source", str(source), "--gradebook", f"sqlite:///{tmp_path / 'out' / 'gradebook.db'}"]
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        time.sleep(rng.uniform(2, 12))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    final = _grade(tmp_path, source)
    assert final.returncode == 0, final.stderr[-2000:]
    assert (tmp_path / "out" / "grades.csv").read_bytes() == (reference / "out" / "grades.csv").read_bytes()
