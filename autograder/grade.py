"""``python -m autograder grade SUBMISSIONS --out grades.csv [--jobs N] [--chapter NN_name ...]``: batch grading.

A command over :mod:`autograder.engine`: check the options, build the work list (or, with
``--plan plan.json --shard i/N``, take one shard of a frozen plan: :mod:`autograder.shard`), grade, record
(``grades.csv`` and the nbgrader gradebook; a shard writes no gradebook), print the summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from autograder import engine, environment, limits, registry, results, sandbox, shard
from autograder import plan as plans
from autograder.record import printable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("submissions", type=Path,
                        help="folder with one sub-folder per student (any depth below it, e.g. nbgrader's submitted/), "
                             "or a flat folder of <student>_<chapter>.ipynb files")
    parser.add_argument("--out", type=Path, default=Path("grades.csv"), help="the CSV to write (default grades.csv)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="notebooks graded in parallel (default: the number of cores)")
    parser.add_argument("--chapter", action="append", metavar="NN_name", choices=registry.ids(),
                        help="a chapter every student owes (repeatable): a student without it gets 0 of its points as "
                             "'missing', and notebooks of other chapters are not graded. Without --chapter each student "
                             "is graded on the chapters they submitted, and nobody is charged a missing one")
    parser.add_argument("--source", type=Path, default=registry.SOURCE_DIR,
                        help="your source notebooks (hidden from submissions; default autograder/source)")
    parser.add_argument("--release", type=Path, default=registry.COURSE_DIR,
                        help="the student release, whose unchanged test cells are skipped (default course/)")
    parser.add_argument("--gradebook", default=None,
                        help="nbgrader gradebook URL to record the scores in, e.g. sqlite:///gradebook.db "
                             "(default: ./gradebook.db when it exists; 'none' to skip)")
    parser.add_argument("--cell-timeout", type=float, default=limits.CELL_SECONDS,
                        help="wall seconds for one cell or one check (default %(default)s)")
    parser.add_argument("--notebook-timeout", type=float, default=limits.NOTEBOOK_SECONDS,
                        help="wall seconds for one notebook (default %(default)s)")
    parser.add_argument("--memory-gb", type=float, default=limits.MEMORY_BYTES / 2**30,
                        help="address-space limit of the student's process in GB (default %(default)s)")
    parser.add_argument("--max-notebook-mb", type=float, default=limits.MAX_NOTEBOOK_MB,
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


def settings(args: argparse.Namespace) -> engine.Settings:
    root = Path(args.submissions).resolve()
    if not root.is_dir():
        raise engine.BadInput(f"SUBMISSIONS must be a folder; {args.submissions} is not one. {engine.LAYOUT_HINT}")
    if args.jobs < 1:
        raise engine.BadInput(f"--jobs must be at least 1; got {args.jobs}")
    for name in ("cell_timeout", "notebook_timeout", "memory_gb", "max_notebook_mb"):
        if getattr(args, name) <= 0:
            raise engine.BadInput(f"--{name.replace('_', '-')} must be > 0; got {getattr(args, name)}")
    out = Path(args.out).resolve()
    if root == out.parent or root in out.parents:
        raise engine.BadInput("--out must be outside SUBMISSIONS (the grader never writes into the submissions)")
    gradebook = args.gradebook
    if gradebook is None and Path("gradebook.db").exists():
        gradebook = f"sqlite:///{Path('gradebook.db').resolve()}"
    if gradebook == "none":
        gradebook = None
    state = out.with_name(out.name + ".state")
    hide = [str(Path(args.source).resolve()), str(root), str(state), str(out.parent)]
    if gradebook and gradebook.startswith("sqlite:///"):
        hide.append(str(Path(gradebook.removeprefix("sqlite:///")).resolve().parent))
    kernel_limits = sandbox.Limits(cell_seconds=args.cell_timeout, notebook_seconds=args.notebook_timeout,
                                   memory_bytes=int(args.memory_gb * 2**30))
    return engine.Settings(root=root, out=out, state=state, jobs=args.jobs,
                           chapters=tuple(args.chapter) if args.chapter else None, gradebook=gradebook,
                           limits=kernel_limits, hide=tuple(hide), max_bytes=int(args.max_notebook_mb * 2**20),
                           regrade=args.regrade, course_dir=Path(args.release).resolve())


def shard_of(args: argparse.Namespace) -> tuple[plans.Plan, int] | None:
    """The plan and shard index of ``--plan``/``--shard`` (None without them); BadInput when they do not fit."""
    if args.plan is None and args.shard is None:
        return None
    if args.plan is None or args.shard is None:
        raise engine.BadInput("--plan and --shard go together: grade --plan plan.json --shard i/N --out DIR/grades.csv")
    if args.chapter:
        raise engine.BadInput("--chapter is fixed by the plan (python -m autograder plan --chapter ...)")
    if args.gradebook not in (None, "none"):
        raise engine.BadInput("a shard writes no gradebook: give --gradebook to `python -m autograder merge`")
    try:
        index, shards = shard.parse(args.shard)
        frozen = plans.load(args.plan)
    except (shard.BadShard, plans.BadPlan) as err:
        raise engine.BadInput(str(err)) from None
    if shards != frozen.shards:
        raise engine.BadInput(f"--plan {args.plan} has {frozen.shards} shard(s); --shard says {shards}")
    return frozen, index


def run(args: argparse.Namespace) -> int:
    try:
        cfg = settings(args)
        sharded = shard_of(args)
        if sharded is None:
            found, jobs, fixed = engine.work_list(cfg.root, cfg.chapters, cfg.max_bytes, cfg.state)
        else:
            frozen, index = sharded
            cfg = dataclasses.replace(cfg, gradebook=None, chapters=frozen.chapters, max_bytes=frozen.max_bytes)
            found = None
            jobs, fixed = shard.work(cfg, frozen, index)  # a file changed since the plan: stale rows
    except engine.BadInput as err:
        print(f"error: {printable(str(err))}", file=sys.stderr)
        return 1
    for line in found.skipped if found else ():
        print(f"skipped: {line}", file=sys.stderr)
    if sharded is None and not cfg.chapters:
        print("note: no --chapter given: each student is graded on the chapters they submitted, and nobody is "
              "charged a missing chapter (give --chapter for each chapter everyone owes)", file=sys.stderr)
    level = sandbox.detect()
    if sandbox.warning(level):
        print(sandbox.warning(level), file=sys.stderr)
    environment.put_scripts_on_path()  # nbgrader's gradebook runs alembic by name
    recorder, todo = engine.start(cfg, jobs, fixed)
    print(f"grading {len(todo)} notebook(s) with {cfg.jobs} job(s), sandbox: {level}"
          + (f" ({len(jobs) - len(todo)} already graded)" if len(jobs) > len(todo) else "")
          + (f"; shard {sharded[1]}/{sharded[0].shards} of {sharded[0].path}, {len(fixed)} stale" if sharded else ""),
          file=sys.stderr)
    on_result = None
    if sharded is not None:
        planned = {job.submission: job.sha256 for job in jobs}
        on_result = lambda res: recorder.add(shard.restale(res, planned))  # noqa: E731
    engine.finish(cfg, recorder, todo, on_result)
    if sharded is not None:
        print(f"shard finished -> {shard.finish(cfg.out, sharded[0], sharded[1], recorder.results)}", file=sys.stderr)
    results.summary(recorder.results, cfg.out)
    return 1 if recorder.gradebook_errors else 0
