"""``grade SUBMISSIONS --plan plan.json --shard i/N --out DIR/grades.csv``: grade one shard of a plan.

A shard run is the ordinary ``grade`` with its work list taken from the plan
(:mod:`autograder.plan`) instead of from discovery; the grading itself is the same
``run_jobs``/``grade_job`` path, with ``--jobs`` workers inside the shard. What is
particular to a shard lives here:

* :func:`parse` — ``--shard i/N``, or ``auto/N`` with the index from the engine's
  environment: ``JOB_COMPLETION_INDEX`` (Kubernetes Indexed Job) or
  ``SLURM_ARRAY_TASK_ID`` (Slurm array, submitted as ``--array=0-(N-1)``);
* :func:`work` — the shard's entries; each file is hashed again, and one that changed
  (or is gone) since the plan was made becomes ``stale`` rows (:func:`autograder.results.stale`)
  instead of being graded;
* :func:`finish` — when every entry has a result, ``DIR/shard-i-of-N.json`` records them
  with the plan's digest: the file ``merge`` reads. A shard killed before that leaves no
  such file (its state under ``DIR/grades.csv.state/`` lets a rerun skip what it graded).

A shard writes no gradebook: ``merge`` is its only writer.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from autograder import engine, record, results, submissions
from autograder import plan as plans

FORMAT = "autograder-shard/1"
INDEX_VARIABLES = ("JOB_COMPLETION_INDEX", "SLURM_ARRAY_TASK_ID")
_SHARD = re.compile(r"(?P<index>\d+|auto)/(?P<shards>\d+)")


class BadShard(ValueError):
    """A ``--shard`` value or index variable that cannot be used; the message is one line."""


def parse(text: str, environ: dict | None = None) -> tuple[int, int]:
    """(index, shards) from ``i/N`` or ``auto/N``; :class:`BadShard` otherwise."""
    environ = os.environ if environ is None else environ
    m = _SHARD.fullmatch(text.strip())
    if not m or int(m["shards"]) < 1:
        raise BadShard(f"--shard must be i/N (0 <= i < N) or auto/N; got {text!r}")
    shards = int(m["shards"])
    if m["index"] != "auto":
        index, source = int(m["index"]), "--shard"
    else:
        given = {name: environ[name] for name in INDEX_VARIABLES if environ.get(name, "").strip()}
        if not given:
            raise BadShard(f"--shard auto/{shards} takes the index from {' or '.join(INDEX_VARIABLES)} "
                           "(Kubernetes Indexed Job, Slurm array); neither is set")
        values = {v.strip() for v in given.values()}
        if len(values) > 1:
            raise BadShard("the shard index is ambiguous: " + ", ".join(f"{k}={v!r}" for k, v in given.items()))
        value = values.pop()
        source = next(iter(given))
        if not value.isdigit():
            raise BadShard(f"{source}={value!r} is not a shard index (a whole number from 0 to {shards - 1})")
        index = int(value)
    if not 0 <= index < shards:
        raise BadShard(f"the shard index from {source} is {index}; with {shards} shards it must be 0 to {shards - 1} "
                       "(a Slurm array is submitted as --array=0-(N-1))")
    return index, shards


def record_path(out: Path, index: int, shards: int) -> Path:
    """Where a shard's finished results are: beside its ``--out``."""
    return Path(out).parent / f"shard-{index}-of-{shards}.json"


def work(cfg: engine.Settings, plan: plans.Plan, index: int) -> tuple[list[engine.Job], list[dict]]:
    """The shard's jobs (files unchanged since the plan) and its stale results; forgets an earlier finished record."""
    record_path(cfg.out, index, plan.shards).unlink(missing_ok=True)
    entries = plan.of_shard(index)
    jobs, stale, gone = [], [], 0
    for entry in entries:
        try:
            digest = submissions.sha256_of(cfg.root, entry.raw, plan.max_bytes)
        except submissions.Unreadable as err:
            gone += 1
            stale.append(results.stale(entry.student, entry.submission, entry.chapter,
                                       f"the file cannot be read since the plan was made ({err})"))
            continue
        if digest != entry.sha256:
            stale.append(results.stale(entry.student, entry.submission, entry.chapter,
                                       f"the file changed after the plan was made (planned sha256 {entry.sha256[:12]}, "
                                       f"now {digest[:12]})"))
            continue
        jobs.append(engine.Job(entry.student, entry.submission, entry.raw, entry.chapter, entry.sha256,
                               str(cfg.state / f"{entry.key}.json")))
    if entries and gone == len(entries):
        raise engine.BadInput(f"none of the {len(entries)} notebook(s) of shard {index}/{plan.shards} can be read "
                              f"under {cfg.root}: is SUBMISSIONS the folder the plan was made from (the same layout, "
                              f"mounted anywhere)? e.g. {entries[0].submission}")
    return jobs, stale


def restale(res: dict, planned: dict[str, str]) -> dict:
    """A result graded from bytes other than the planned ones (changed while the shard ran) becomes stale rows."""
    want = planned.get(res["submission"])
    if want is None or not res["sha256"] or res["sha256"] == want:
        return res
    return results.stale(res["student"], res["submission"], res["chapter"],
                         f"the file changed after the plan was made (planned sha256 {want[:12]}, graded "
                         f"{res['sha256'][:12]})")


def finish(out: Path, plan: plans.Plan, index: int, graded: list[dict]) -> Path:
    """Write ``DIR/shard-i-of-N.json``: every entry's result, under the plan's digest (atomic)."""
    by_submission = {r["submission"]: r for r in graded}
    data = {"format": FORMAT, "plan": plan.digest, "shard": index, "shards": plan.shards,
            "results": {e.key: {k: by_submission[e.submission][k] for k in results.RESULT_FIELDS}
                        for e in plan.of_shard(index) if e.submission in by_submission}}
    path = record_path(out, index, plan.shards)
    record.atomic_write(path, json.dumps(data, indent=1).encode())
    return path
