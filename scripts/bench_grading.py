"""Benchmark the batch grader: 40 submissions with --jobs 1 and with every core, and the sandbox's
per-notebook overhead against a plain `nbgrader autograde` of the same notebooks.

    .venv/bin/python scripts/bench_grading.py [--n 40] [--plain 4]

The submissions are chapter-1 notebooks from tests/redteam/build.py: honest, untouched and
half-solved ones in turn (no hostile ones, so that time limits do not dominate).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder import environment

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from redteam import build as redteam  # noqa: E402

SOURCE = REPO / "autograder" / "source"


def make_submissions(root: Path, n: int) -> None:
    kinds = [None, set(), {"softmax", "causal_mask"}]
    for i in range(n):
        path = root / f"student{i:03d}" / f"{redteam.CH1}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(redteam.solved(redteam.CH1, SOURCE, kinds[i % len(kinds)]), path)


def grade(subs: Path, out: Path, jobs: int, sandbox: str | None = None) -> float:
    env = {**os.environ, **({"AUTOGRADER_SANDBOX": sandbox} if sandbox else {})}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autograder", "grade", str(subs), "--out", str(out), "--jobs", str(jobs),
                    "--gradebook", "none"], check=True, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def plain_nbgrader(tmp: Path, n: int) -> float:
    """Seconds per notebook of `nbgrader autograde` (no sandbox) on n of the same notebooks."""
    course = tmp / "nbgrader_course"
    shutil.copytree(SOURCE / redteam.CH1, course / "source" / redteam.CH1)
    shutil.copy(REPO / "autograder" / "nbgrader_config.py", course / "nbgrader_config.py")
    env = dict(os.environ)
    environment.put_scripts_on_path(env)  # nbgrader runs alembic by name
    nbg = [sys.executable, "-m", "nbgrader"]
    subprocess.run(nbg + ["generate_assignment", redteam.CH1, "--create", "--force"], cwd=course, check=True, env=env,
                   capture_output=True)
    for i in range(n):
        path = course / "submitted" / f"student{i:03d}" / redteam.CH1 / f"{redteam.CH1}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(redteam.solved(redteam.CH1, SOURCE, [None, set(), {"softmax", "causal_mask"}][i % 3]), path)
    started = time.perf_counter()
    subprocess.run(nbg + ["autograde", redteam.CH1, "--force"], cwd=course, check=True, env=env, capture_output=True)
    return (time.perf_counter() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="submissions in the batch (default 40)")
    parser.add_argument("--plain", type=int, default=6, help="notebooks for the nbgrader autograde comparison")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="tdd-bench-") as tmp:
        tmp = Path(tmp)
        make_submissions(tmp / "subs", args.n)
        one = grade(tmp / "subs", tmp / "one" / "grades.csv", 1)
        print(f"{args.n} submissions, --jobs 1:      {one:7.1f} s  ({one / args.n:.2f} s per notebook)")
        allc = grade(tmp / "subs", tmp / "all" / "grades.csv", cores)
        print(f"{args.n} submissions, --jobs {cores} (all): {allc:7.1f} s  ({allc / args.n:.2f} s per notebook)")
        print(f"speed-up with {cores} cores: {one / allc:.2f}x (target >= 1.8x on 2 cores)")
        same = (tmp / "one" / "grades.csv").read_text() == (tmp / "all" / "grades.csv").read_text()
        print(f"same grades.csv with 1 and {cores} jobs: {same}")
        bare = grade(tmp / "subs", tmp / "bare" / "grades.csv", 1, sandbox="none") / args.n
        per = one / args.n
        print(f"same grader without the sandbox (rlimits only), --jobs 1: {bare:.2f} s per notebook -> "
              f"sandbox overhead {per - bare:+.2f} s per notebook")
        plain = plain_nbgrader(tmp, args.plain)
        print(f"plain `nbgrader autograde` (no sandbox, one at a time): {plain:.2f} s per notebook")
        print(f"sandboxed grader, --jobs 1: {per:.2f} s per notebook -> {per - plain:+.2f} s per notebook vs nbgrader "
              "(nbgrader executes the whole notebook, demos included; the grader skips unchanged demos)")


if __name__ == "__main__":
    main()
