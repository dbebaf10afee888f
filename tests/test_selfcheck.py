"""`python -m autograder check NOTEBOOK`: visible checks in a fresh kernel, per-exercise verdicts and score."""

from __future__ import annotations

import re

import nbformat
import pytest
from redteam import build as redteam
from support import SOURCE, autograder, cli

TOTAL = sum(redteam.CH1_POINTS.values())  # chapter 1's points, from the registry


@pytest.mark.slow
@pytest.mark.parametrize("only, expected", [(None, f"{TOTAL}/{TOTAL}"), (set(), f"0/{TOTAL}"),
                                            ({"softmax", "padding_mask"}, f"3/{TOTAL}")])
def test_selfcheck_visible_score(tmp_path, capsys, only, expected):
    """In this process (``main([...])``); the command itself is run by the smoke test below."""
    path = tmp_path / f"{redteam.CH1}.ipynb"
    nbformat.write(redteam.solved(redteam.CH1, SOURCE, only), path)
    code, out, err = cli(capsys, "check", path)
    assert code == 0, err[-2000:]
    assert f"visible score: {expected}" in out
    lines = [line for line in out.splitlines() if line.startswith(("✓", "✗"))]
    assert len(lines) == len(redteam.CH1_POINTS)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """``python -m autograder check`` once, on a notebook with a syntax error (attention_scores) and a wrong
    answer (padding_mask); the rest is solved."""
    nb = redteam.solved(redteam.CH1, SOURCE)
    redteam.set_cell(nb, "attention_scores_solution",
                     "def attention_scores(q, k):\n    return (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5\n")
    redteam.set_cell(nb, "padding_mask_solution", redteam.WRONG_PADDING)
    path = tmp_path_factory.mktemp("selfcheck") / f"{redteam.CH1}.ipynb"
    nbformat.write(nb, path)
    done = autograder("check", path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    verdicts = {line[2:].split(":")[0]: line for line in done.stdout.splitlines() if line.startswith(("✓", "✗"))}
    return done, verdicts


@pytest.mark.slow
@pytest.mark.subprocess
def test_selfcheck_prints_the_hint_of_a_wrong_answer(smoke):
    done, verdicts = smoke
    line = verdicts["padding_mask"]
    assert line.startswith("✗ padding_mask: failed") and "polarity" in line
    lost = sum(redteam.CH1_POINTS[e] for e in ("attention_scores", "scaled_dot_product_attention", "padding_mask"))
    assert f"visible score: {TOTAL - lost}/{TOTAL}" in done.stdout


@pytest.mark.slow
@pytest.mark.subprocess
def test_selfcheck_reports_a_syntax_error_with_its_cell_and_line(smoke):
    """A syntax error is an `error` that names the cell and the line, not "not done" or "not defined";
    the grader gives the same verdict (both go through verdict.grade_notebook)."""
    done, verdicts = smoke
    line = verdicts["attention_scores"]
    assert re.fullmatch(r"✗ attention_scores: error — cell \d+ has a syntax error \(line 2: .*\), so attention_scores "
                        r"was never defined", line), line
    assert "not done" not in line
    # the exercises that do not call attention_scores are graded as usual; the one that calls it names it
    assert "NameError: name 'attention_scores' is not defined" in verdicts["scaled_dot_product_attention"]
    others = {k: v for k, v in verdicts.items() if k not in ("attention_scores", "scaled_dot_product_attention",
                                                             "padding_mask")}
    assert others and all(line.startswith("✓") for line in others.values()), others


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


@pytest.mark.slow
def test_selfcheck_keeps_its_timeout_on_a_kernel_that_stops_reading_its_input(tmp_path, capsys):
    """A notebook that points the kernel's stdin at an empty pipe, then has a large cell: `check --timeout 5`
    gives up on it within its own limits (6 × the timeout for the whole check), it does not hang."""
    import time

    nb = redteam.solved(redteam.CH1, SOURCE)
    redteam.insert_after_imports(nb, "import os\n_keep = os.dup(0)\n_r, _w = os.pipe()\nos.dup2(_r, 0)\n")
    redteam.set_cell(nb, "padding_mask_solution", "# " + "x" * 300_000 + "\ndef padding_mask(tokens, pad_id):\n"
                     "    return (tokens != pad_id)[:, None, None, :]\n")
    path = tmp_path / f"{redteam.CH1}.ipynb"
    nbformat.write(nb, path)
    started = time.monotonic()
    code, out, err = cli(capsys, "check", path, "--timeout", "5")
    took = time.monotonic() - started
    assert took < 6 * 5 + 120, f"check took {took:.0f} s with --timeout 5"  # 120 s: kernels starting on a busy machine
    assert "visible score:" in out or "timeout" in (out + err).lower() or "took longer" in (out + err), out + err
    assert "visible score: 13/13" not in out
