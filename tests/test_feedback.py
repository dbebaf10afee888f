"""`python -m autograder feedback`: per-student HTML with scores, statuses and hints, never hidden tests."""

from __future__ import annotations

import pytest

import csv
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = [
    {"student": "ada", "notebook": "01_attention_by_hand.ipynb", "exercise": "softmax", "points": 2, "max_points": 2,
     "status": "passed", "reason": ""},
    {"student": "ada", "notebook": "01_attention_by_hand.ipynb", "exercise": "padding_mask", "points": 0,
     "max_points": 1, "status": "failed", "reason": "wrong polarity: True must mean <real token>"},
    {"student": "bob", "notebook": "01_attention_by_hand.ipynb", "exercise": "softmax", "points": 0, "max_points": 2,
     "status": "timeout", "reason": "took longer than 60 s"},
]


def _feedback(tmp_path: Path) -> Path:
    grades = tmp_path / "grades.csv"
    with open(grades, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(ROWS[0]))
        writer.writeheader()
        writer.writerows(ROWS)
    out = tmp_path / "feedback"
    done = subprocess.run([sys.executable, "-m", "autograder", "feedback", str(grades), "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.subprocess
def test_feedback_one_page_per_student_with_scores_and_hints(tmp_path):
    out = _feedback(tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["ada.html", "bob.html"]
    ada = (out / "ada.html").read_text()
    assert "Total: <b>2 / 3</b>" in ada
    assert "wrong polarity: True must mean &lt;real token&gt;" in ada  # escaped
    assert "bob" not in ada
    assert "stopped: took too long" in (out / "bob.html").read_text()


@pytest.mark.subprocess
def test_feedback_never_contains_hidden_tests(tmp_path):
    out = _feedback(tmp_path)
    for page in out.iterdir():
        text = page.read_text()
        assert "BEGIN HIDDEN TESTS" not in text and 'level=\\"hidden\\"' not in text and 'level="hidden"' not in text
