"""``python -m autograder check NOTEBOOK``: the learner's self-check.

Runs the notebook's code in a fresh kernel (the same runner and the same steps as the
batch grader, without the sandbox: it is the learner's own machine), then the *visible*
checks of every exercise, and prints per exercise ``passed`` or the hint of the first
failing check, and the visible score. Hidden checks are never run here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autograder import limits as caps
from autograder import registry, sandbox, status, submissions, verdict
from autograder.record import printable

MAX_BYTES = caps.SELFCHECK_MAX_BYTES
ISOLATION = "none"  # the learner's own machine: no sandbox, the learner's own user
NOTEBOOK_TIMEOUTS = 6  # the whole self-check may take this many --timeout's (a stalled kernel ends it in time)


def limits(timeout: float) -> sandbox.Limits:
    """The kernel's limits for a self-check with ``--timeout``: time only; memory, processes and output are the
    learner's own machine's business."""
    return sandbox.Limits(cell_seconds=timeout, notebook_seconds=NOTEBOOK_TIMEOUTS * timeout, memory_bytes=2**40,
                          processes=4096, output_bytes=64 * 2**20)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("notebook", type=Path,
                        help="your chapter notebook, e.g. course/01_attention_by_hand/01_attention_by_hand.ipynb")
    parser.add_argument("--timeout", type=float, default=caps.SELFCHECK_CELL_SECONDS,
                        help="seconds for one cell or one check (default %(default)s); the whole check stops after "
                             f"{NOTEBOOK_TIMEOUTS} times this")


def check(notebook: Path, timeout: float = caps.SELFCHECK_CELL_SECONDS) -> tuple[list[dict], float, float]:
    """(rows, visible score, maximum) of ``notebook``; ValueError with a one-line reason if it cannot be checked."""
    path = Path(notebook)
    chapter_id, _, _ = submissions.match_chapter(path.name)
    if chapter_id is None:
        raise ValueError(f"{path.name} is not a chapter notebook; expected one of "
                         f"{', '.join(c.notebook for c in registry.CHAPTERS)}")
    try:
        data, _ = submissions.read(path.resolve().parent, path.name.encode(), MAX_BYTES)
    except submissions.Unreadable as err:
        raise ValueError(f"{path} cannot be read: {err}") from None
    try:
        rows = verdict.grade_notebook(data, registry.get(chapter_id), level="visible", limits=limits(timeout),
                                      isolation=ISOLATION, unprivileged=False)
    except (Exception, RecursionError) as err:  # noqa: BLE001 — the checker's own failure: one line, as in grade
        raise ValueError(f"the self-check failed on this notebook ({type(err).__name__}); "
                         "please report it with the notebook") from None
    return rows, sum(r["points"] for r in rows), sum(r["max_points"] for r in rows)


def run(args: argparse.Namespace) -> int:
    if not Path(args.notebook).is_file():
        print(f"error: NOTEBOOK must be a notebook file; {printable(str(args.notebook))} does not exist", file=sys.stderr)
        return 1
    try:
        rows, score, top = check(args.notebook, args.timeout)
    except ValueError as err:
        print(f"error: {printable(str(err))}", file=sys.stderr)
        return 1
    for row in rows:
        if row["status"] == status.PASSED:
            print(f"✓ {row['exercise']}: passed ({row['points']}/{row['max_points']})")
        else:
            print(f"✗ {row['exercise']}: {row['status']} — {printable(str(row['reason']))}")
    print(f"visible score: {score}/{top} (the hidden tests check more cases when your work is graded)")
    return 0
