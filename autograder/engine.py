"""The grading engine: which notebook is graded for whom, and grading a list of them in parallel.

The commands are thin shells over it: ``grade`` (a whole batch, or one shard of a plan), ``plan`` (the work
list frozen into shards) and, through :mod:`autograder.results`, ``merge``. Its steps, in order:

1. :func:`work_list` — discover the submissions (:func:`autograder.submissions.discover`: regular files only,
   no links) and :func:`decide` which file is graded for each student and chapter: duplicates, unreadable
   files, notebooks of no chapter (or of a chapter not graded now) and missing chapters become results right
   away; the rest become :class:`Job` s, each keyed by its path and sha256 (:func:`state_key`);
2. :func:`run_jobs` — grade the jobs in ``jobs`` worker processes, each notebook by :func:`grade_job`
   (read → :func:`autograder.verdict.grade_notebook`); whatever goes wrong with one notebook becomes that
   notebook's rows, never the batch's; a worker that dies is charged only to the notebook that killed it;
3. :class:`Recorder` — keeps the results, saves each one to the run's state as it finishes (so a run killed
   at any point keeps what it graded), rewrites the CSV every few seconds, feeds the gradebook.

What a student owes is the instructor's decision: the expected chapters are the ones given (``--chapter``),
never the ones somebody uploaded.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import multiprocessing
import resource
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from autograder import identity, limits, record, registry, results, sandbox, status, submissions
from autograder.record import printable

CSV_EVERY_SECONDS = 10.0
LAYOUT_HINT = ("expected SUBMISSIONS/<student>/<chapter>.ipynb (any depth below the student's folder, e.g. nbgrader's "
               "submitted/<student>/<chapter>/<chapter>.ipynb), or a flat folder of <student>_<chapter>.ipynb files; "
               "chapters: " + ", ".join(c.notebook for c in registry.CHAPTERS))


class BadInput(Exception):
    """A one-line error for the user; exit status 1."""


@dataclass(frozen=True)
class Settings:
    root: Path  # SUBMISSIONS, resolved
    out: Path  # the CSV
    state: Path  # where each graded notebook's result is saved (<out>.state/)
    jobs: int
    chapters: tuple[str, ...] | None  # the chapters every student owes (--chapter); None: only what they submitted
    gradebook: str | None
    limits: sandbox.Limits
    hide: tuple[str, ...]  # host paths no kernel may see
    max_bytes: int
    regrade: bool
    course_dir: Path  # the release, whose unchanged test cells and demos are not run


@dataclass(frozen=True)
class Job:
    student: str
    submission: str  # printable path relative to SUBMISSIONS
    raw: bytes  # the same path as the file system has it
    chapter: str
    sha256: str
    state_file: str


def state_key(relpath: str, digest: str) -> str:
    """A graded notebook's name in the state, in a plan and in a shard's record: its path and content, and the
    grader that graded it (a grader whose verdicts may differ grades it again)."""
    path = hashlib.sha256(relpath.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"{path}-{digest}-{identity.grader_key()}"


# --- 1. the work list ----------------------------------------------------------------------------------------


def work_list(root: Path, chapters: tuple[str, ...] | None, max_bytes: int,
              state: Path) -> tuple[submissions.Discovery, list[Job], list[dict]]:
    """Discover the submissions under ``root`` and :func:`decide`; BadInput when there is nothing to grade."""
    found = submissions.discover(root)
    if not found.found:
        raise BadInput(f"no notebook found in {root}"
                       + (f" ({len(found.students)} student folder(s), all without notebooks)" if found.students
                          else "") + f". {LAYOUT_HINT}")
    jobs, fixed = decide(found, root, chapters, max_bytes, state)
    if not jobs and not any(r["chapter"] for r in fixed):
        nameless = [f.relpath for f in found.found if f.chapter and not f.student]
        if nameless:
            raise BadInput(f"{', '.join(nameless[:3])} in {root}: a chapter's notebook with no student to grade it "
                           f"for. {LAYOUT_HINT}")
        raise BadInput(f"no notebook in {root} has a chapter's name. {LAYOUT_HINT}")
    return found, jobs, fixed


def decide(found: submissions.Discovery, root: Path, chapters: tuple[str, ...] | None, max_bytes: int,
           state: Path) -> tuple[list[Job], list[dict]]:
    """The notebooks to grade, and the results decided without grading (duplicates, unreadable, missing)."""
    jobs: list[Job] = []
    fixed: list[dict] = []
    by_student: dict[str, dict[str, list[submissions.Found]]] = {}
    for f in found.found:
        if f.chapter is None or not f.student:
            reason = f.problem or (f"unknown notebook name; expected one of "
                                   f"{', '.join(c.notebook for c in registry.CHAPTERS)} (or a renamed copy)")
            fixed.append(results.result(f.student or "?", f.relpath, None, results.file_rows(status.INVALID, reason),
                                        kind="unmatched"))
        elif chapters and f.chapter not in chapters:
            reason = (f"chapter {f.chapter} is not graded in this run (the chapters graded now: "
                      f"{', '.join(chapters)})")
            fixed.append(results.result(f.student, f.relpath, None, results.file_rows(status.INVALID, reason),
                                        kind="unmatched"))
        else:
            by_student.setdefault(f.student, {}).setdefault(f.chapter, []).append(f)
    for student, of_student in by_student.items():
        for chapter_id, files in of_student.items():
            chosen, others, why = _choose(files)
            if chosen is None:  # several renamed copies, none exact: the chapter's points are lost, and said why
                fixed.append(results.of_chapter(student, others[0].relpath, chapter_id, status.INVALID, why))
                others = others[1:]
            for f in others:
                fixed.append(results.result(student, f.relpath, chapter_id, results.file_rows(status.DUPLICATE, why),
                                            kind="duplicate"))
            if chosen is None:
                continue
            if chosen.problem:
                fixed.append(results.of_chapter(student, chosen.relpath, chapter_id, status.INVALID, chosen.problem))
                continue
            try:
                digest = submissions.sha256_of(root, chosen.raw, max_bytes)
            except submissions.Unreadable as err:
                fixed.append(results.of_chapter(student, chosen.relpath, chapter_id, status.INVALID,
                                                f"the file cannot be graded: {err}"))
                continue
            state_file = state / f"{state_key(chosen.relpath, digest)}.json"
            jobs.append(Job(student, chosen.relpath, chosen.raw, chapter_id, digest, str(state_file)))
    for student in sorted(set(found.students) | set(by_student)):
        for chapter_id in sorted(set(chapters or ()) - set(by_student.get(student, {}))):
            fixed.append(results.of_chapter(student, f"{student}/{chapter_id}.ipynb", chapter_id, status.MISSING,
                                            f"no notebook for this chapter was found (expected {chapter_id}.ipynb)",
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


# --- 2. grading ------------------------------------------------------------------------------------------------


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
        return results.of_chapter(job.student, job.submission, job.chapter, status.INVALID,
                                  f"the file cannot be graded: {err}", job.sha256)
    # Imported where a notebook is graded, in the workers (the server they fork from loads it first, ``_pool``):
    # it loads PyTorch, which `plan`, `merge` and the grading command's own process never need.
    from autograder import verdict

    try:
        rows = verdict.grade_notebook(data, chapter, limits=cfg.limits, hide=[Path(p) for p in cfg.hide],
                                      course_dir=cfg.course_dir, timing=timing)
    except (Exception, RecursionError) as err:  # noqa: BLE001 — the grader's own failure: this notebook only
        return results.grader_failure(job.student, job.submission, job.chapter, digest, err)
    retry = any(r["status"] == status.CRASHED and "could not start" in r["reason"] for r in rows)
    if any(sandbox.NO_START_IN_MEMORY in r["reason"] for r in rows):
        timing["no_retry_now"] = True  # it will not start in this run either (a larger --memory-gb may)
    out = results.result(job.student, job.submission, job.chapter, rows, digest, retry=retry)
    if not retry:
        state_file = Path(job.state_file) if digest == job.sha256 else \
            cfg.state / f"{state_key(job.submission, digest)}.json"
        record.atomic_write(state_file, results.dump(out))
    return out


_WORKER_SETTINGS: Settings | None = None


def _init_worker(cfg: Settings) -> None:
    global _WORKER_SETTINGS
    import torch

    # The verdict worker never runs learner code, but it parses the learner's notebook and the outputs: its own
    # memory limit keeps a hostile file from taking the machine's.
    resource.setrlimit(resource.RLIMIT_AS, (limits.VERDICT_MEMORY_BYTES, limits.VERDICT_MEMORY_BYTES))
    torch.set_num_threads(1)  # one core per worker: the judges' threads must not compete with the other jobs
    _WORKER_SETTINGS = cfg


def _worker(job: Job) -> dict:
    return grade_job(job, _WORKER_SETTINGS)


def load_state(job: Job) -> dict | None:
    """The result an earlier run saved for this job (same path, same content, same grader), or None."""
    try:
        data = Path(job.state_file).read_bytes()
    except OSError:
        return None
    return results.load(data)


# Workers start from a fresh server process (never a fork of this one, whose threads and state they would share).
MP_CONTEXT = "forkserver"
_WORKER_SETTINGS_ARG: Settings | None = None


def _pool(workers: int) -> cf.ProcessPoolExecutor:
    context = multiprocessing.get_context(MP_CONTEXT)
    context.set_forkserver_preload(["autograder.verdict"])  # PyTorch loaded once, in the server, not per worker
    return cf.ProcessPoolExecutor(max_workers=workers, mp_context=context,
                                  initializer=_init_worker, initargs=(_WORKER_SETTINGS_ARG,))


def run_jobs(jobs: list[Job], cfg: Settings, on_result) -> None:
    """Grade ``jobs`` with ``cfg.jobs`` workers, calling ``on_result(result)`` as each finishes.

    When a worker process dies (the pool breaks), the notebooks then in flight are graded again, each alone
    in a pool of its own: the one that breaks that pool too is charged (error rows), the others are graded
    as if nothing happened. A broken pool never stops the batch.

    A result marked ``retry`` (a kernel that could not start within its limits, the grader's own failure) is
    not reported at once: its notebook is graded once more, alone, after every other notebook (on a loaded
    machine the start can miss its limit once), and that second result is reported, ``retry`` or not.
    """
    global _WORKER_SETTINGS_ARG
    _WORKER_SETTINGS_ARG = cfg
    queue = list(reversed(jobs))
    suspects: list[Job] = []  # in flight when a pool broke: graded again one at a time
    again: list[Job] = []  # a first result said "retry": graded again, alone, at the end

    def deliver(job: Job, res: dict) -> None:
        if res.get("retry") and not (res.get("timing") or {}).get("no_retry_now") and job not in again:
            again.append(job)
            res.pop("timing", None)
            return
        on_result(res)

    while queue or suspects:
        if suspects:
            job = suspects.pop()
            on_result(_alone(job, cfg))  # already alone: its result stands
            continue
        with _pool(min(cfg.jobs, len(queue))) as pool:
            flight: dict[cf.Future, Job] = {}
            broken = False
            while (queue or flight) and not broken:
                while queue and len(flight) < cfg.jobs and not broken:
                    job = queue.pop()
                    try:
                        flight[pool.submit(_worker, job)] = job
                    except BrokenProcessPool:
                        queue.append(job)
                        broken = True
                if not flight:
                    break
                done, _ = cf.wait(flight, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    job = flight.pop(fut)
                    try:
                        res = fut.result()
                    except BrokenProcessPool:
                        suspects.append(job)
                        broken = True
                    except Exception as err:  # noqa: BLE001 — never lose the batch for one notebook
                        deliver(job, results.grader_failure(job.student, job.submission, job.chapter, job.sha256,
                                                            err))
                    else:
                        deliver(job, res)
            if broken:
                suspects += list(flight.values())  # every notebook in flight at the break, and only those
                pool.shutdown(wait=False, cancel_futures=True)
    for job in again:
        on_result(_alone(job, cfg))


def _alone(job: Job, cfg: Settings) -> dict:
    """Grade one notebook in a pool of its own; a worker that dies now died of this notebook."""
    try:
        with _pool(1) as pool:
            return pool.submit(_worker, job).result()
    except BrokenProcessPool:
        return results.grader_failure(job.student, job.submission, job.chapter, job.sha256,
                                      "the grading worker died on it, alone")
    except Exception as err:  # noqa: BLE001
        return results.grader_failure(job.student, job.submission, job.chapter, job.sha256, err)


# --- 3. recording -------------------------------------------------------------------------------------------


class Recorder:
    """Keeps the results, rewrites the CSV every few seconds and at the end, feeds the gradebook."""

    def __init__(self, cfg: Settings, total: int):
        self.cfg, self.total, self.results, self.graded = cfg, total, [], 0
        self.book = None
        self.gradebook_errors = 0
        self.last_csv = time.monotonic()
        if cfg.gradebook:
            from autograder import gradebook  # nbgrader, loaded only when a gradebook is written

            self.book = gradebook.Recorder(cfg.gradebook)

    def add(self, res: dict, *, announce: bool = True) -> None:
        timing = res.pop("timing", None) or {}
        self.results.append(res)
        if self.book is not None and results.in_gradebook(res):
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
        record.write_csv(self.cfg.out, results.csv_rows(self.results))
        self.last_csv = time.monotonic()


def _timing_text(timing: dict) -> str:
    """`` in 12.3 s (static pass 0.4 s CPU)``: how long the grader took for the notebook."""
    if "seconds" not in timing:
        return ""
    static = timing.get("static_cpu_seconds")
    warned = timing.get("nbformat_warnings")
    return (f" in {timing['seconds']:.1f} s" + (f" (static pass {static:.1f} s CPU)" if static is not None else "")
            + (f" ({warned} nbformat warning(s) while reading it, e.g. duplicate cell ids)" if warned else ""))


def start(cfg: Settings, jobs: list[Job], fixed: list[dict]) -> tuple[Recorder, list[Job]]:
    """A recorder holding ``fixed`` and every job's saved result (unless ``cfg.regrade``), and the jobs left."""
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    cfg.state.mkdir(exist_ok=True)
    recorder = Recorder(cfg, len(jobs))
    for res in fixed:
        recorder.add(res, announce=False)
    todo = []
    for job in jobs:
        earlier = None if cfg.regrade else load_state(job)
        if earlier is not None:
            recorder.add(earlier, announce=False)
        else:
            todo.append(job)
    recorder.total = len(todo)
    return recorder, todo


def finish(cfg: Settings, recorder: Recorder, todo: list[Job], on_result=None) -> None:
    """Grade ``todo`` into ``recorder`` (through ``on_result`` when given), then write the CSV, whatever happens."""
    try:
        run_jobs(todo, cfg, on_result or recorder.add)
    finally:
        recorder.write()
