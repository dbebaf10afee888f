"""Per-notebook cost of a shard run, per chapter, and the shard count it implies for a deadline.

    .venv/bin/python scripts/bench_shards.py [--per-chapter 6] [--jobs 1] [--learners 10000] [--deadline-hours 1]

For every chapter of the registry (all of them: chapters differ in cost, so the shard count must
come from the mean over every chapter a class submits), --per-chapter submissions (solved, untouched and half-solved in
turn, from tests/redteam/build.py) are planned as one shard and graded by
``grade --plan --shard 0/1 --jobs J`` in a subprocess, exactly as a Kubernetes pod or a Slurm task
runs it. Printed per chapter: wall seconds per notebook, CPU core-seconds per notebook (user + sys
of the whole process tree: grader, workers, sandboxed kernels), both less the cost of starting a
shard (measured on an empty shard, and paid once per shard), and the peak memory of the tree (sum
of RSS, sampled every 0.2 s). Then the time ``merge`` takes per result to record the nbgrader
gradebook, and the shards of --cores-per-shard cores needed to grade
--learners x chapters notebooks within --deadline-hours, using half the deadline (the other half
is the margin for pods or tasks that start late, notebooks that run into their time limits and a
shard that is retried).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from redteam import build as redteam  # noqa: E402

from autograder import registry  # noqa: E402

SOURCE = REPO / "autograder" / "source"
USE_OF_DEADLINE = 0.5


def make_submissions(root: Path, chapter: registry.Chapter, n: int) -> None:
    kinds = [None, set(), {chapter.exercises[0].name}]
    for i in range(n):
        path = root / f"student{i:03d}" / chapter.id / chapter.notebook
        path.parent.mkdir(parents=True)
        nbformat.write(redteam.solved(chapter.id, SOURCE, kinds[i % len(kinds)]), path)


TICK = os.sysconf("SC_CLK_TCK")


def _stats() -> dict[int, tuple[int, int, float]]:
    """pid -> (parent pid, start time, CPU seconds used so far) of every process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(entry.name)] = (int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / TICK)
    return out


def _tree(pid: int, stats: dict) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, (parent, _, _) in stats.items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def run_shard(cmd: list[str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of the process tree, peak RSS of the tree in bytes) of one command.

    The tree is sampled every 0.2 s: its CPU time is the last reading of each process (a process that
    lives less than that is missed), and its memory the largest sum of RSS seen.
    """
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak, cpu = 0, {}

    def sample() -> None:
        nonlocal peak
        while proc.poll() is None:
            stats = _stats()
            pids = _tree(proc.pid, stats)
            for pid in pids:
                cpu[(pid, stats[pid][1])] = stats[pid][2]
            peak = max(peak, _rss(pids))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - started
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err.decode()[-2000:]}")
    return wall, sum(cpu.values()), peak


def gradebook_seconds(tmp: Path, chapter: registry.Chapter, n: int) -> float:
    """Seconds per result of recording n new submissions in a fresh gradebook, as merge does."""
    from autograder import gradebook, verdict

    book = gradebook.Recorder(f"sqlite:///{tmp / 'gradebook.db'}")
    rows = verdict.rows_for_all(chapter, "passed", "")
    book.record({"student": "warm-up", "submission": "-", "chapter": chapter.id, "sha256": "-", "rows": rows})
    started = time.perf_counter()
    with book.session():
        for i in range(n):
            book.record({"student": f"s{i:06d}", "submission": "-", "chapter": chapter.id, "sha256": "-", "rows": rows})
    return (time.perf_counter() - started) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-chapter", type=int, default=6, help="submissions per chapter (default 6)")
    parser.add_argument("--jobs", type=int, default=1, help="--jobs of the shard (default 1)")
    parser.add_argument("--learners", type=int, default=10_000)
    parser.add_argument("--chapters", type=int, default=len(registry.CHAPTERS),
                        help=f"chapters each learner submits (default: all {len(registry.CHAPTERS)} of the registry)")
    parser.add_argument("--deadline-hours", type=float, default=1.0)
    parser.add_argument("--cores-per-shard", type=int, default=2)
    parser.add_argument("--gradebook-results", type=int, default=200, help="results recorded to time the gradebook")
    args = parser.parse_args()
    per_nb_cpu, per_nb_wall = [], []
    py = [sys.executable, "-m", "autograder"]
    with tempfile.TemporaryDirectory(prefix="tdd-shards-") as tmp:
        empty = Path(tmp) / "empty"
        make_submissions(empty / "submitted", registry.CHAPTERS[0], 1)
        subprocess.run(py + ["plan", str(empty / "submitted"), "--shards", "2", "--out", str(empty / "plan.json")],
                       check=True, cwd=REPO, capture_output=True)
        start_wall, start_cpu, _ = run_shard(py + ["grade", str(empty / "submitted"), "--plan", str(empty / "plan.json"),
                                                   "--shard", "1/2", "--out", str(empty / "shard-1" / "grades.csv")])
        print(f"starting a shard (an empty one): wall {start_wall:.1f} s, CPU {start_cpu:.1f} core-s", flush=True)
        for chapter in registry.CHAPTERS:
            root = Path(tmp) / chapter.id
            make_submissions(root / "submitted", chapter, args.per_chapter)
            subprocess.run(py + ["plan", str(root / "submitted"), "--shards", "1", "--out", str(root / "plan.json")],
                           check=True, cwd=REPO, capture_output=True)
            wall, cpu, peak = run_shard(py + ["grade", str(root / "submitted"), "--plan", str(root / "plan.json"),
                                              "--shard", "0/1", "--out", str(root / "shard-0" / "grades.csv"),
                                              "--jobs", str(args.jobs)])
            n = args.per_chapter
            per_nb_wall.append((wall - start_wall) / n)
            per_nb_cpu.append((cpu - start_cpu) / n)
            print(f"{chapter.id}: {n} notebooks, --jobs {args.jobs}: wall {wall:6.1f} s, per notebook after the start "
                  f"{per_nb_wall[-1] * args.jobs:.2f} core-s of wall time and {per_nb_cpu[-1]:.2f} core-s of CPU; "
                  f"peak memory of the shard {peak / 2**30:.2f} GB", flush=True)
        book = gradebook_seconds(Path(tmp), registry.CHAPTERS[0], args.gradebook_results)
    cost = statistics.mean(per_nb_cpu)
    notebooks = args.learners * args.chapters
    core_hours = notebooks * cost / 3600
    shards = math.ceil(notebooks * cost / (args.cores_per_shard * args.deadline_hours * 3600 * USE_OF_DEADLINE))
    print(f"mean cost over the {len(per_nb_cpu)} chapters {registry.CHAPTERS[0].id} … {registry.CHAPTERS[-1].id}: "
          f"{cost:.2f} CPU core-s per notebook (wall with --jobs {args.jobs}: "
          f"{statistics.mean(per_nb_wall) * args.jobs:.2f} core-s); {args.learners} learners x {args.chapters} "
          f"chapters = {notebooks} notebooks = {core_hours:.1f} core-hours")
    print(f"shards of {args.cores_per_shard} cores (--jobs {args.cores_per_shard}) to finish in "
          f"{args.deadline_hours:g} h using {USE_OF_DEADLINE:.0%} of it: {shards}")
    print(f"merge: the gradebook takes {book * 1000:.0f} ms per result ({notebooks * book / 60:.0f} min for {notebooks}; "
          "the CSV is written before it)")


if __name__ == "__main__":
    main()
