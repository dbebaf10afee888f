"""``python -m autograder grade SUBMISSIONS --out grades.csv [--jobs N]``: batch grading.

With ``--plan plan.json --shard i/N`` it grades one shard of a frozen plan instead
(:mod:`autograder.shard`; steps 2–3 then come from the plan, and no gradebook is written).

The steps, in order (each a function below):

1. :func:`settings` — check the options;
2. discover (:func:`autograder.submissions.discover`) — regular files only, no links;
3. :func:`plan` — which file is graded for each student and chapter (duplicates,
   unreadable files, unknown names and missing chapters become rows right away),
   and which of them earlier runs already graded (``<out>.state/``, keyed by path and
   sha256);
4. :func:`run_jobs` — grade the rest in ``--jobs`` worker processes, each notebook by
   :func:`grade_job` (read → :func:`autograder.verdict.grade_notebook`); whatever goes
   wrong with one notebook becomes that notebook's rows, never the batch's; each result
   is saved to the state as it finishes, and the CSV is rewritten every few seconds, so
   a batch killed at any point keeps what it graded;
5. record — ``grades.csv`` (:mod:`autograder.record`, the only CSV writer) and the nbgrader
   gradebook (:mod:`autograder.gradebook`, written only by this main process);
6. :func:`summary`.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import hashlib
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from autograder import plan as plan_
from autograder import record, registry, sandbox, shard, status, submissions, verdict
from autograder.record import printable

CSV_EVERY_SECONDS = 10.0
LAYOUT_HINT = ("expected SUBMISSIONS/<student>/<chapter>.ipynb (any depth below the student's folder, e.g. nbgrader's "
               "submitted/<student>/<chapter>/<chapter>.ipynb), or a flat folder of <student>_<chapter>.ipynb files; "
               "chapters: " + ", ".join(c.notebook for c in registry.CHAPTERS))


@dataclass(frozen=True)
class Settings:
    root: Path
    out: Path
    state: Path
    jobs: int
    chapters: tuple[str, ...] | None  # expected chapters (None: those found in the batch)
    gradebook: str | None
    limits: sandbox.Limits
    hide: tuple[str, ...]
    max_bytes: int
    regrade: bool
    course_dir: Path
    plan: plan_.Plan | None = None  # --plan: the frozen work list (a shard run)
    shard: tuple[int, int] | None = None  # --shard: (index, shards)


@dataclass(frozen=True)
class Job:
    student: str
    submission: str  # printable path relative to SUBMISSIONS
    raw: bytes  # the same path as the file system has it
    chapter: str
    sha256: str
    state_file: str


def result(student: str, submission: str, chapter: str | None, rows: list[dict], sha256: str = "",
           retry: bool = False, kind: str = "graded") -> dict:
    """One notebook's (or one missing notebook's) outcome: rows plus who and what.

    ``kind``: graded (or could not be read: a submission all the same, recorded in the gradebook),
    duplicate, unmatched (no chapter's name), missing (no notebook for an expected chapter).
    """
    return {"student": student, "submission": submission, "chapter": chapter, "sha256": sha256, "rows": rows,
            "retry": retry, "kind": kind}


def state_key(relpath: str, digest: str) -> str:
    return hashlib.sha256(relpath.encode("utf-8", "surrogatepass")).hexdigest()[:24] + "-" + digest


# --- 1. settings -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("submissions", type=Path,
                        help="folder with one sub-folder per student (any depth below it, e.g. nbgrader's submitted/), "
                             "or a flat folder of <student>_<chapter>.ipynb files")
    parser.add_argument("--out", type=Path, default=Path("grades.csv"), help="the CSV to write (default grades.csv)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="notebooks graded in parallel (default: the number of cores)")
    parser.add_argument("--chapter", action="append", metavar="NN_name", choices=registry.ids(),
                        help="a chapter every student should have submitted (repeatable); a student without it gets "
                             "0 of its points as 'missing' (default: the chapters found in SUBMISSIONS)")
    parser.add_argument("--source", type=Path, default=registry.SOURCE_DIR,
                        help="your source notebooks (hidden from submissions; default autograder/source)")
    parser.add_argument("--release", type=Path, default=registry.COURSE_DIR,
                        help="the student release, whose unchanged test cells are skipped (default course/)")
    parser.add_argument("--gradebook", default=None,
                        help="nbgrader gradebook URL to record the scores in, e.g. sqlite:///gradebook.db "
                             "(default: ./gradebook.db when it exists; 'none' to skip)")
    parser.add_argument("--cell-timeout", type=float, default=sandbox.Limits.cell_seconds,
                        help="wall seconds for one cell or one check (default %(default)s)")
    parser.add_argument("--notebook-timeout", type=float, default=sandbox.Limits.notebook_seconds,
                        help="wall seconds for one notebook (default %(default)s)")
    parser.add_argument("--memory-gb", type=float, default=sandbox.Limits.memory_bytes / 2**30,
                        help="address-space limit of the student's process in GB (default %(default)s)")
    parser.add_argument("--max-notebook-mb", type=float, default=64.0,
                        help="larger files are not read, and graded invalid (default %(default)s)")
    parser.add_argument("--regrade", action="store_true", help="ignore earlier results and grade everything again")
    parser.add_argument("--plan", type=Path, default=None,
                        help="grade one shard of this plan (made by `python -m autograder plan`); needs --shard. "
                             "The plan fixes the chapters and --max-notebook-mb; no gradebook is written "
                             "(`python -m autograder merge` writes it)")
    parser.add_argument("--shard", default=None, metavar="i/N",
                        help="the shard to grade, 0 <= i < N; auto/N takes i from JOB_COMPLETION_INDEX "
                             "(Kubernetes Indexed Job) or SLURM_ARRAY_TASK_ID (Slurm array). Use one --out "
                             "folder per shard, e.g. results/shard-i/grades.csv")


class BadInput(Exception):
    """A one-line error for the user; exit status 1."""


def settings(args: argparse.Namespace) -> Settings:
    root = Path(args.submissions).resolve()
    if not root.is_dir():
        raise BadInput(f"SUBMISSIONS must be a folder; {args.submissions} is not one. {LAYOUT_HINT}")
    if args.jobs < 1:
        raise BadInput(f"--jobs must be at least 1; got {args.jobs}")
    for name in ("cell_timeout", "notebook_timeout", "memory_gb", "max_notebook_mb"):
        if getattr(args, name) <= 0:
            raise BadInput(f"--{name.replace('_', '-')} must be > 0; got {getattr(args, name)}")
    out = Path(args.out).resolve()
    if root == out.parent or root in out.parents:
        raise BadInput("--out must be outside SUBMISSIONS (the grader never writes into the submissions)")
    gradebook = args.gradebook
    if gradebook is None and Path("gradebook.db").exists():
        gradebook = f"sqlite:///{Path('gradebook.db').resolve()}"
    if gradebook == "none":
        gradebook = None
    state = out.with_name(out.name + ".state")
    hide = [str(Path(args.source).resolve()), str(root), str(state), str(out.parent)]
    if gradebook and gradebook.startswith("sqlite:///"):
        hide.append(str(Path(gradebook.removeprefix("sqlite:///")).resolve().parent))
    limits = sandbox.Limits(cell_seconds=args.cell_timeout, notebook_seconds=args.notebook_timeout,
                            memory_bytes=int(args.memory_gb * 2**30))
    cfg = Settings(root=root, out=out, state=state, jobs=args.jobs, chapters=tuple(args.chapter) if args.chapter else None,
                   gradebook=gradebook, limits=limits, hide=tuple(hide), max_bytes=int(args.max_notebook_mb * 2**20),
                   regrade=args.regrade, course_dir=Path(args.release).resolve())
    return _shard_settings(args, cfg) if args.plan is not None or args.shard is not None else cfg


def _shard_settings(args: argparse.Namespace, cfg: Settings) -> Settings:
    if args.plan is None or args.shard is None:
        raise BadInput("--plan and --shard go together: grade --plan plan.json --shard i/N --out DIR/grades.csv")
    if args.chapter:
        raise BadInput("--chapter is fixed by the plan (python -m autograder plan --chapter ...)")
    if args.gradebook not in (None, "none"):
        raise BadInput("a shard writes no gradebook: give --gradebook to `python -m autograder merge`")
    try:
        index, shards = shard.parse(args.shard)
        frozen = plan_.load(args.plan)
    except (shard.BadShard, plan_.BadPlan) as err:
        raise BadInput(str(err)) from None
    if shards != frozen.shards:
        raise BadInput(f"--plan {args.plan} has {frozen.shards} shard(s); --shard says {shards}")
    return dataclasses.replace(cfg, gradebook=None, chapters=frozen.chapters, max_bytes=frozen.max_bytes,
                               plan=frozen, shard=(index, shards))


# --- 2.-3. discover and plan ---------------------------------------------------------------


def work_list(cfg: Settings) -> tuple[submissions.Discovery, list[Job], list[dict]]:
    """Discover the submissions and :func:`plan` them; BadInput when there is nothing to grade."""
    found = submissions.discover(cfg.root)
    if not found.found:
        raise BadInput(f"no notebook found in {cfg.root}"
                       + (f" ({len(found.students)} student folder(s), all without notebooks)" if found.students
                          else "") + f". {LAYOUT_HINT}")
    jobs, fixed = plan(found, cfg)
    if not jobs and not any(r["chapter"] for r in fixed):
        nameless = [f.relpath for f in found.found if f.chapter and not f.student]
        if nameless:
            raise BadInput(f"{', '.join(nameless[:3])} in {cfg.root}: a chapter's notebook with no student to grade it "
                           f"for. {LAYOUT_HINT}")
        raise BadInput(f"no notebook in {cfg.root} has a chapter's name. {LAYOUT_HINT}")
    return found, jobs, fixed


def _chapter_rows(chapter_id: str, status_: str, reason: str) -> list[dict]:
    return verdict.rows_for_all(registry.get(chapter_id), status_, reason)


def _other_row(status_: str, reason: str) -> list[dict]:
    return [{"exercise": "-", "points": 0, "max_points": 0, "status": status_, "reason": reason}]


def plan(found: submissions.Discovery, cfg: Settings) -> tuple[list[Job], list[dict]]:
    """The notebooks to grade, and the rows decided without grading (duplicates, unreadable, missing)."""
    jobs: list[Job] = []
    fixed: list[dict] = []
    by_student: dict[str, dict[str, list[submissions.Found]]] = {}
    for f in found.found:
        if f.chapter is None or not f.student:
            reason = f.problem or (f"unknown notebook name; expected one of "
                                   f"{', '.join(c.notebook for c in registry.CHAPTERS)} (or a renamed copy)")
            fixed.append(result(f.student or "?", f.relpath, None, _other_row(status.INVALID, reason), kind="unmatched"))
            continue
        by_student.setdefault(f.student, {}).setdefault(f.chapter, []).append(f)
    graded: dict[str, set[str]] = {}
    for student, chapters in by_student.items():
        for chapter_id, files in chapters.items():
            chosen, others, why = _choose(files)
            if chosen is None:  # several renamed copies, none exact: the chapter's points are lost, and said why
                graded.setdefault(student, set()).add(chapter_id)
                fixed.append(result(student, others[0].relpath, chapter_id,
                                    _chapter_rows(chapter_id, status.INVALID, why)))
                others = others[1:]
            for f in others:
                fixed.append(result(student, f.relpath, chapter_id, _other_row(status.DUPLICATE, why), kind="duplicate"))
            if chosen is None:
                continue
            graded.setdefault(student, set()).add(chapter_id)
            if chosen.problem:
                fixed.append(result(student, chosen.relpath, chapter_id,
                                    _chapter_rows(chapter_id, status.INVALID, chosen.problem)))
                continue
            try:
                digest = submissions.sha256_of(cfg.root, chosen.raw, cfg.max_bytes)
            except submissions.Unreadable as err:
                fixed.append(result(student, chosen.relpath, chapter_id,
                                    _chapter_rows(chapter_id, status.INVALID, f"the file cannot be graded: {err}")))
                continue
            state_file = cfg.state / f"{state_key(chosen.relpath, digest)}.json"
            jobs.append(Job(student, chosen.relpath, chosen.raw, chapter_id, digest, str(state_file)))
    expected = set(cfg.chapters) if cfg.chapters else {c for cs in graded.values() for c in cs}
    for student in sorted(set(found.students) | set(by_student)):
        for chapter_id in sorted(expected - graded.get(student, set())):
            fixed.append(result(student, f"{student}/{chapter_id}.ipynb", chapter_id,
                                _chapter_rows(chapter_id, status.MISSING,
                                              f"no notebook for this chapter was found (expected {chapter_id}.ipynb)"),
                                kind="missing"))
    return jobs, fixed


def _choose(files: list[submissions.Found]) -> tuple[submissions.Found | None, list[submissions.Found], str]:
    """(the file to grade, the others, why the others are not graded) for one student and chapter."""
    exact = sorted((f for f in files if f.exact), key=lambda f: (f.depth, f.raw))
    if exact:
        chosen = exact[0]
        return chosen, [f for f in files if f is not chosen], f"another copy of this chapter is graded: {chosen.relpath}"
    if len(files) == 1:
        return files[0], [], ""
    names = ", ".join(f.relpath for f in files)
    return None, files, (f"{len(files)} renamed copies of this chapter ({names}) and none with the exact name: "
                         "keep the one to grade and name it exactly as released")


# --- 4. run ----------------------------------------------------------------------------------


def grade_job(job: Job, cfg: Settings) -> dict:
    """One notebook's result; never raises (a failure of the grader itself is this notebook's rows).

    It carries ``timing`` (the notebook's wall seconds in this worker, and the static pass's CPU
    seconds), which :class:`Recorder` prints and never stores: two gradings of one notebook give
    equal results.
    """
    started = time.monotonic()
    timing: dict = {}
    out = _grade_one(job, cfg, timing)
    out["timing"] = {"seconds": time.monotonic() - started, **timing}
    return out


def _grade_one(job: Job, cfg: Settings, timing: dict) -> dict:
    chapter = registry.get(job.chapter)
    try:
        data, digest = submissions.read(cfg.root, job.raw, cfg.max_bytes)
    except submissions.Unreadable as err:
        return result(job.student, job.submission, job.chapter,
                      verdict.rows_for_all(chapter, status.INVALID, f"the file cannot be graded: {err}"), job.sha256)
    try:
        rows = verdict.grade_notebook(data, chapter, limits=cfg.limits, hide=[Path(p) for p in cfg.hide],
                                      course_dir=cfg.course_dir, timing=timing)
    except (Exception, RecursionError) as err:  # noqa: BLE001 — the grader's own failure: this notebook only
        reason = printable(f"the grader failed on this notebook ({type(err).__name__}); it is graded again next run")
        return result(job.student, job.submission, job.chapter, verdict.rows_for_all(chapter, status.ERROR, reason),
                      digest, retry=True)
    retry = any(r["status"] == status.CRASHED and "could not start" in r["reason"] for r in rows)
    out = result(job.student, job.submission, job.chapter, _printable_rows(rows), digest, retry=retry)
    if not retry:
        state_file = Path(job.state_file) if digest == job.sha256 else \
            cfg.state / f"{state_key(job.submission, digest)}.json"
        record.atomic_write(state_file, json.dumps(out, indent=1).encode())
    return out


def _printable_rows(rows: list[dict]) -> list[dict]:
    return [{**r, "reason": printable(str(r["reason"]))[:600]} for r in rows]


_WORKER_SETTINGS: Settings | None = None


def _init_worker(cfg: Settings) -> None:
    global _WORKER_SETTINGS
    import torch

    torch.set_num_threads(1)  # one core per worker: the judges' threads must not compete with the other jobs
    _WORKER_SETTINGS = cfg


def _worker(job: Job) -> dict:
    return grade_job(job, _WORKER_SETTINGS)


def load_state(job: Job) -> dict | None:
    try:
        data = json.loads(Path(job.state_file).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("rows"), list) else None


def run_jobs(jobs: list[Job], cfg: Settings, on_result) -> None:
    """Grade ``jobs`` with ``cfg.jobs`` workers, calling ``on_result(result)`` as each finishes.

    At most ``cfg.jobs`` notebooks are in flight, so when a worker process dies (the pool
    breaks) the notebooks then in flight are known: they are retried once in a new pool,
    and a notebook in flight at two breaks gets an error row.
    """
    queue = list(reversed(jobs))
    breaks: dict[Job, int] = {}
    while queue:
        ctx = multiprocessing.get_context("forkserver")
        with cf.ProcessPoolExecutor(max_workers=min(cfg.jobs, len(queue)), mp_context=ctx,
                                    initializer=_init_worker, initargs=(cfg,)) as pool:
            flight: dict[cf.Future, Job] = {}
            lost: list[Job] = []  # in flight when the pool broke
            while (queue or flight) and not lost:
                while queue and len(flight) < cfg.jobs:
                    job = queue.pop()
                    flight[pool.submit(_worker, job)] = job
                done, _ = cf.wait(flight, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    job = flight.pop(fut)
                    try:
                        on_result(fut.result())
                    except BrokenProcessPool:
                        lost.append(job)
                    except Exception as err:  # noqa: BLE001 — never lose the batch for one notebook
                        on_result(_internal_error(job, err))
            for job in lost + list(flight.values()):  # every notebook in flight at the break, and only those
                breaks[job] = breaks.get(job, 0) + 1
                if breaks[job] >= 2:
                    on_result(_internal_error(job, RuntimeError("the grading worker died twice on it")))
                else:
                    queue.append(job)  # retried next, in a new pool


def _internal_error(job: Job, err: BaseException) -> dict:
    reason = printable(f"the grader failed on this notebook ({type(err).__name__}: {str(err)[:200]}); "
                       "it is graded again next run")
    return result(job.student, job.submission, job.chapter,
                  verdict.rows_for_all(registry.get(job.chapter), status.ERROR, reason), job.sha256, retry=True)


# --- 5. record, 6. summary -----------------------------------------------------------------


def csv_rows(results: list[dict]) -> list[dict]:
    rows = []
    for res in sorted(results, key=lambda r: (r["student"], r["submission"])):
        for r in res["rows"]:
            rows.append({"student": res["student"], "notebook": res["submission"], **{
                k: r[k] for k in ("exercise", "points", "max_points", "status", "reason")}})
    return rows


class Recorder:
    """Keeps the results, rewrites the CSV every few seconds and at the end, feeds the gradebook."""

    def __init__(self, cfg: Settings, total: int):
        self.cfg, self.total, self.results, self.graded = cfg, total, [], 0
        self.book = None
        self.gradebook_errors = 0
        self.last_csv = time.monotonic()
        if cfg.gradebook:
            from autograder import gradebook

            self.book = gradebook.Recorder(cfg.gradebook)

    def add(self, res: dict, *, announce: bool = True) -> None:
        timing = res.pop("timing", None) or {}
        self.results.append(res)
        if self.book is not None and in_gradebook(res):
            try:
                self.book.record(res)
            except Exception as err:  # noqa: BLE001 — the CSV stays right; say so once per failure
                self.gradebook_errors += 1
                print(f"error: the gradebook could not record {printable(res['student'])}: {type(err).__name__}",
                      file=sys.stderr)
        if announce:
            self.graded += 1
            score = sum(r["points"] for r in res["rows"])
            top = sum(r["max_points"] for r in res["rows"])
            print(f"[{self.graded}/{self.total}] {printable(res['student'])}: {res['submission']}: {score:g}/{top:g}"
                  + _timing_text(timing), file=sys.stderr)
        if time.monotonic() - self.last_csv > CSV_EVERY_SECONDS:
            self.write()

    def write(self) -> None:
        record.write_csv(self.cfg.out, csv_rows(self.results))
        self.last_csv = time.monotonic()


def _timing_text(timing: dict) -> str:
    """`` in 12.3 s (static pass 0.4 s CPU)``: how long the grader took for the notebook."""
    if "seconds" not in timing:
        return ""
    static = timing.get("static_cpu_seconds")
    return f" in {timing['seconds']:.1f} s" + (f" (static pass {static:.1f} s CPU)" if static is not None else "")


def in_gradebook(res: dict) -> bool:
    """Whether a result is a submission the gradebook records (graded, or could not be read)."""
    return bool(res["chapter"]) and res.get("kind", "graded") == "graded"


def summary(results: list[dict], out: Path) -> None:
    counts: dict[str, int] = {}
    totals: dict[str, list] = {}  # student -> [score, top], in one pass (a class may have 10,000 students)
    for res in results:
        total = totals.setdefault(res["student"], [0, 0])
        for r in res["rows"]:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
            total[0] += r["points"]
            total[1] += r["max_points"]
    notebooks = sum(1 for r in results if r["sha256"])
    print(f"graded {notebooks} notebook(s) of {len(totals)} student(s) -> {out}")
    print("  " + ", ".join(f"{s}: {n}" for s, n in sorted(counts.items())))
    for student, (score, top) in sorted(totals.items()):
        print(f"  {printable(student)}: {score:g}/{top:g}")


def run(args: argparse.Namespace) -> int:
    try:
        cfg = settings(args)
        if cfg.plan is None:
            found, jobs, fixed = work_list(cfg)
        else:
            found = None
            jobs, fixed = shard.work(cfg)  # this shard's entries; a file changed since the plan: stale rows
    except BadInput as err:
        print(f"error: {printable(str(err))}", file=sys.stderr)
        return 1
    for line in found.skipped if found else ():
        print(f"skipped: {line}", file=sys.stderr)
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    cfg.state.mkdir(exist_ok=True)
    level = sandbox.detect()
    if sandbox.warning(level):
        print(sandbox.warning(level), file=sys.stderr)
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")  # nbgrader's alembic
    todo = []
    recorder = Recorder(cfg, len(jobs))
    for res in fixed:
        recorder.add(res, announce=False)
    for job in jobs:
        earlier = None if cfg.regrade else load_state(job)
        if earlier is not None:
            recorder.add(earlier, announce=False)
        else:
            todo.append(job)
    recorder.total = len(todo)
    print(f"grading {len(todo)} notebook(s) with {cfg.jobs} job(s), sandbox: {level}"
          + (f" ({len(jobs) - len(todo)} already graded)" if len(jobs) > len(todo) else "")
          + (f"; shard {cfg.shard[0]}/{cfg.shard[1]} of {cfg.plan.path}, {len(fixed)} stale" if cfg.plan else ""),
          file=sys.stderr)
    on_result = recorder.add
    if cfg.plan is not None:
        planned = {job.submission: job.sha256 for job in jobs}
        on_result = lambda res: recorder.add(shard.restale(res, planned))  # noqa: E731
    try:
        run_jobs(todo, cfg, on_result)
    finally:
        recorder.write()
    if cfg.plan is not None:
        print(f"shard finished -> {shard.finish(cfg, recorder.results)}", file=sys.stderr)
    summary(recorder.results, cfg.out)
    return 1 if recorder.gradebook_errors else 0

