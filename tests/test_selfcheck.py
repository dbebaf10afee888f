"""`python -m autograder check NOTEBOOK`: visible checks in a fresh kernel, per-exercise verdicts and score."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from redteam import build as redteam

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "autograder" / "source"


def _check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", "check", str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


TOTAL = sum(redteam.CH1_POINTS.values())  # chapter 1's points, from the registry


@pytest.mark.slow
@pytest.mark.parametrize("only, expected", [(None, f"{TOTAL}/{TOTAL}"), (set(), f"0/{TOTAL}"),
                                            ({"softmax", "padding_mask"}, f"3/{TOTAL}")])
def test_selfcheck_visible_score(tmp_path, only, expected):
    path = tmp_path / f"{redteam.CH1}.ipynb"
    nbformat.write(redteam.solved(redteam.CH1, SOURCE, only), path)
    done = _check(path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"visible score: {expected}" in done.stdout
    lines = [line for line in done.stdout.splitlines() if line.startswith(("✓", "✗"))]
    assert len(lines) == len(redteam.CH1_POINTS)


@pytest.mark.slow
def test_selfcheck_prints_the_hint_of_a_wrong_answer(tmp_path):
    nb = redteam.solved(redteam.CH1, SOURCE)
    redteam.set_cell(nb, "padding_mask_solution", redteam.WRONG_PADDING)
    path = tmp_path / f"{redteam.CH1}.ipynb"
    nbformat.write(nb, path)
    done = _check(path)
    line = next(line for line in done.stdout.splitlines() if "padding_mask" in line)
    assert line.startswith("✗ padding_mask: failed") and "polarity" in line
    assert f"visible score: {TOTAL - 1}/{TOTAL}" in done.stdout


@pytest.mark.slow
def test_selfcheck_reports_a_syntax_error_with_its_cell_and_line(tmp_path):
    """A syntax error is an `error` that names the cell and the line, not "not done" or "not defined";
    the grader gives the same verdict (both go through verdict.grade_notebook)."""
    nb = redteam.solved(redteam.CH1, SOURCE)
    redteam.set_cell(nb, "attention_scores_solution",
                     "def attention_scores(q, k):\n    return (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5\n")
    path = tmp_path / f"{redteam.CH1}.ipynb"
    nbformat.write(nb, path)
    done = _check(path)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if "attention_scores" in line)
    assert re.fullmatch(r"✗ attention_scores: error — cell \d+ has a syntax error \(line 2: .*\), so attention_scores "
                        r"was never defined", line), line
    assert "not done" not in line
    # the exercises that do not call attention_scores are graded as usual; the one that calls it names it
    verdicts = {line[2:].split(":")[0]: line for line in done.stdout.splitlines() if line.startswith(("✓", "✗"))}
    assert "NameError: name 'attention_scores' is not defined" in verdicts.pop("scaled_dot_product_attention")
    verdicts.pop("attention_scores")
    assert all(line.startswith("✓") for line in verdicts.values()), verdicts
    lost = redteam.CH1_POINTS["attention_scores"] + redteam.CH1_POINTS["scaled_dot_product_attention"]
    assert f"visible score: {TOTAL - lost}/{TOTAL}" in done.stdout


def test_selfcheck_a_failure_of_the_checker_itself_is_one_line(tmp_path, monkeypatch, capsys):
    """A notebook that breaks the checker (as a grader crash would) gives one error line and exit 1, never a
    traceback."""
    import argparse

    from autograder import selfcheck

    def broken(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded \x1b[2J")

    monkeypatch.setattr(selfcheck.verdict, "grade_notebook", broken)
    path = tmp_path / f"{redteam.CH1}.ipynb"
    nbformat.write(redteam.release(redteam.CH1), path)
    assert selfcheck.run(argparse.Namespace(notebook=path, timeout=10.0)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the self-check failed on this notebook (RecursionError)")
    assert "\x1b" not in err
