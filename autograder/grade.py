"""``python -m autograder grade SUBMISSIONS --out grades.csv [--jobs N]``: batch grading.

Every ``*.ipynb`` under ``SUBMISSIONS/<student>/`` (also nbgrader's
``submitted/<student>/<assignment>/`` layout) is graded by :mod:`autograder.verdict`
in one of ``--jobs`` worker processes. Durability: submissions are only read; each
result is written atomically (temp file, fsync, rename) into ``<out>.state/`` keyed by
the submission's path and sha256, so a rerun skips what is done and a grader killed
at any point loses nothing; ``grades.csv`` is rebuilt from that state atomically; the
gradebook is written only by this (main) process, one transaction per submission,
as an upsert.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import hashlib
import io
import json
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path

from autograder import sandbox, verdict

FIELDS = ("student", "notebook", "exercise", "points", "max_points", "status", "reason")


def discover(root: Path) -> list[tuple[str, Path]]:
    """(student, notebook path) for every notebook under ``root/<student>/``, sorted."""
    found = []
    for student_dir in sorted(p for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith(".")):
        for nb in sorted(student_dir.rglob("*.ipynb")):
            if ".ipynb_checkpoints" in nb.parts or not nb.is_file():
                continue
            found.append((student_dir.name, nb))
    return found


def atomic_write(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def state_key(relpath: str, digest: str) -> str:
    return hashlib.sha256(relpath.encode()).hexdigest()[:24] + "-" + digest


# Worker side ----------------------------------------------------------------------

_CHAPTERS = None


def _init_worker(source: str, release: str) -> None:
    global _CHAPTERS
    import torch

    torch.set_num_threads(1)  # one core per worker: the judges' threads must not compete with the other jobs
    _CHAPTERS = verdict.load_chapters(Path(source), Path(release))


def _grade_one(job: dict) -> dict:
    limits = sandbox.Limits(**job["limits"])
    rows = verdict.grade_notebook(Path(job["path"]), _CHAPTERS, limits=limits,
                                  hide=[Path(p) for p in job["hide"]])
    result = {"student": job["student"], "submission": job["relpath"], "sha256": job["sha256"],
              "notebook": Path(job["path"]).name, "rows": rows}
    atomic_write(Path(job["state_file"]), json.dumps(result, indent=1).encode())
    return result


# Main process ---------------------------------------------------------------------


def write_csv(out: Path, results: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    for res in sorted(results, key=lambda r: (r["student"], r["submission"])):
        for row in res["rows"]:
            writer.writerow({"student": res["student"], "notebook": res["submission"], **{
                k: row[k] for k in ("exercise", "points", "max_points", "status", "reason")}})
    atomic_write(out, buf.getvalue().encode("utf-8"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("submissions", type=Path, help="folder with one sub-folder per student")
    parser.add_argument("--out", type=Path, default=Path("grades.csv"), help="the CSV to write (default grades.csv)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="notebooks graded in parallel (default: the number of cores)")
    parser.add_argument("--source", type=Path, default=verdict.SOURCE_DIR,
                        help="source chapters NN_name/NN_name.ipynb (default autograder/source)")
    parser.add_argument("--release", type=Path, default=verdict.RELEASE_DIR,
                        help="the student release (default course/)")
    parser.add_argument("--gradebook", default=None,
                        help="nbgrader gradebook URL to record the scores in, e.g. sqlite:///gradebook.db "
                             "(default: ./gradebook.db when it exists; 'none' to skip)")
    parser.add_argument("--cell-timeout", type=float, default=sandbox.Limits.cell_seconds,
                        help="wall seconds for one cell or one check (default %(default)s)")
    parser.add_argument("--notebook-timeout", type=float, default=sandbox.Limits.notebook_seconds,
                        help="wall seconds for one notebook (default %(default)s)")
    parser.add_argument("--memory-gb", type=float, default=sandbox.Limits.memory_bytes / 2**30,
                        help="address-space limit of the student's process in GB (default %(default)s)")
    parser.add_argument("--regrade", action="store_true", help="ignore earlier results and grade everything again")


def run(args: argparse.Namespace) -> int:
    root = Path(args.submissions).resolve()
    if not root.is_dir():
        print(f"error: SUBMISSIONS must be a folder of student folders; {root} is not a folder", file=sys.stderr)
        return 1
    if args.jobs < 1:
        print(f"error: --jobs must be at least 1; got {args.jobs}", file=sys.stderr)
        return 1
    out = Path(args.out).resolve()
    # nbgrader's Gradebook runs the `alembic` command: make this environment's scripts findable.
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    if root == out.parent or root in out.parents:
        print("error: --out must be outside SUBMISSIONS (the grader never writes into the submissions)",
              file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    state = out.with_name(out.name + ".state")
    state.mkdir(exist_ok=True)
    level = sandbox.detect()
    message = sandbox.warning(level)
    if message:
        print(message, file=sys.stderr)
    chapters = verdict.load_chapters(args.source, args.release)
    if not chapters:
        print(f"error: no chapter found in {args.source} with a release in {args.release}", file=sys.stderr)
        return 1

    gradebook_url = args.gradebook
    if gradebook_url is None and Path("gradebook.db").exists():
        gradebook_url = f"sqlite:///{Path('gradebook.db').resolve()}"
    if gradebook_url == "none":
        gradebook_url = None
    hide = [str(Path(args.source).resolve()), str(root), str(state), str(out.parent)]
    if gradebook_url and gradebook_url.startswith("sqlite:///"):
        hide.append(str(Path(gradebook_url.removeprefix("sqlite:///")).resolve().parent))
    limits = {"cell_seconds": args.cell_timeout, "notebook_seconds": args.notebook_timeout,
              "memory_bytes": int(args.memory_gb * 2**30)}

    results, jobs = [], []
    for student, path in discover(root):
        relpath = str(path.relative_to(root))
        digest = verdict.sha256(path)
        state_file = state / f"{state_key(relpath, digest)}.json"
        if state_file.exists() and not args.regrade:
            try:
                results.append(json.loads(state_file.read_text()))
                continue
            except ValueError:
                pass  # cannot happen with atomic writes; grade again
        jobs.append({"student": student, "path": str(path), "relpath": relpath, "sha256": digest,
                     "state_file": str(state_file), "limits": limits, "hide": hide})

    book = None
    if gradebook_url:
        from autograder import gradebook as gb_module

        book = gb_module.Recorder(gradebook_url, args.source, chapters)
        for res in results:
            book.record(res)
    done = len(results)
    total = done + len(jobs)
    print(f"grading {len(jobs)} notebook(s) with {args.jobs} job(s), sandbox: {level}"
          + (f" ({done} already graded)" if done else ""), file=sys.stderr)
    if jobs:
        ctx = multiprocessing.get_context("forkserver")
        with cf.ProcessPoolExecutor(max_workers=min(args.jobs, len(jobs)), mp_context=ctx,
                                    initializer=_init_worker,
                                    initargs=(str(args.source), str(args.release))) as pool:
            futures = [pool.submit(_grade_one, job) for job in jobs]
            for fut in cf.as_completed(futures):
                res = fut.result()
                results.append(res)
                if book is not None:
                    book.record(res)
                done += 1
                score = sum(r["points"] for r in res["rows"])
                top = sum(r["max_points"] for r in res["rows"])
                print(f"[{done}/{total}] {res['student']}/{res['submission']}: {score}/{top}", file=sys.stderr)
    write_csv(out, results)
    _summary(results, out)
    return 0


def _summary(results: list[dict], out: Path) -> None:
    counts: dict[str, int] = {}
    for res in results:
        for row in res["rows"]:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
    students = sorted({r["student"] for r in results})
    print(f"graded {len(results)} notebook(s) of {len(students)} student(s) -> {out}")
    print("  " + ", ".join(f"{s}: {n}" for s, n in sorted(counts.items())))
    for student in students:
        mine = [r for r in results if r["student"] == student]
        score = sum(row["points"] for r in mine for row in r["rows"])
        top = sum(row["max_points"] for r in mine for row in r["rows"])
        print(f"  {student}: {score}/{top}")
