"""``python -m autograder plan SUBMISSIONS --shards N --out plan.json``: freeze the work list into shards.

Grading past one machine is three commands: ``plan`` (here) freezes which file is graded
for each student and chapter — the same decision as ``grade`` makes, by the same
function (:func:`autograder.engine.work_list`) — with each file's sha256 and its shard;
``grade --plan plan.json --shard i/N`` (:mod:`autograder.shard`) grades one shard
anywhere; ``merge`` (:mod:`autograder.merge`) checks that every shard finished and is the
only writer of the CSV and the gradebook. The engines that run the shards (a Kubernetes
Indexed Job, a Slurm array) are the ones universities already have; see ``deploy/``.

The plan file is JSON:

* ``grader``: the grader's version and a digest of the sources that decide verdicts (every
  module of the ``autograder`` package and of its checks, the chapters' reference modules,
  the released notebooks): a shard or a merge run by another grader refuses the plan in
  one line;
* ``entries``: one per notebook to grade — student, printable path, the path's raw bytes
  in base64 (any name the file system allows survives), chapter, sha256, expected cost and
  shard; shards are balanced by expected cost (longest first onto the least loaded);
* ``fixed``: the rows decided without grading (duplicates, unreadable files, unknown
  names, missing chapters), which ``merge`` writes as they are.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from autograder import engine, limits, record, registry
from autograder.identity import identity
from autograder.record import printable

FORMAT = "autograder-plan/1"


class BadPlan(Exception):
    """A plan that cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class Entry:
    """One notebook of the plan."""

    key: str  # engine.state_key(submission, sha256): names its result everywhere
    student: str
    submission: str  # printable path relative to SUBMISSIONS
    raw: bytes  # the same path as the file system has it
    chapter: str
    sha256: str
    cost: float  # expected grading seconds, for balancing
    shard: int


@dataclass(frozen=True)
class Plan:
    path: Path
    digest: str  # sha256 of the plan file's bytes: shards and merge name the plan by it
    shards: int
    chapters: tuple[str, ...] | None
    max_bytes: int
    entries: tuple[Entry, ...]
    fixed: tuple[dict, ...]

    def of_shard(self, index: int) -> list[Entry]:
        return [e for e in self.entries if e.shard == index]


# --- balance -------------------------------------------------------------------------------


def balance(costs: list[float], shards: int) -> list[int]:
    """The shard of each item: longest expected cost first, onto the least loaded shard (ties: fewest items, lowest index).

    With equal costs this deals the items out in turn, so shard sizes differ by at most one.
    """
    if shards < 1:
        raise ValueError(f"shards must be at least 1; got {shards}")
    load = [(0.0, 0, i) for i in range(shards)]
    assigned = [0] * len(costs)
    for item in sorted(range(len(costs)), key=lambda k: (-costs[k], k)):
        least = min(load)
        assigned[item] = least[2]
        load[least[2]] = (least[0] + costs[item], least[1] + 1, least[2])
    return assigned


# --- write and read ------------------------------------------------------------------------


def build(jobs: list, fixed: list[dict], shards: int, chapters: tuple[str, ...] | None, max_bytes: int,
          costs: dict[str, float]) -> dict:
    """The plan as JSON-ready data, from :func:`autograder.engine.work_list`'s jobs and fixed results."""
    jobs = sorted(jobs, key=lambda j: (j.chapter, j.student, j.raw))  # equal costs: each chapter dealt out evenly
    cost = [costs.get(j.chapter, 1.0) for j in jobs]
    shard_of = balance(cost, shards)
    entries = [{"key": engine.state_key(j.submission, j.sha256), "student": j.student, "submission": j.submission,
                "raw": base64.b64encode(j.raw).decode("ascii"), "chapter": j.chapter, "sha256": j.sha256,
                "cost": c, "shard": s} for j, c, s in zip(jobs, cost, shard_of)]
    return {"format": FORMAT, "grader": identity(), "shards": shards,
            "chapters": list(chapters) if chapters else None, "max_bytes": max_bytes,
            "entries": entries, "fixed": sorted(fixed, key=lambda r: (r["student"], r["submission"]))}


def load(path: Path, *, check_grader: bool = True) -> Plan:
    """The plan at ``path``; :class:`BadPlan` (one line) when it is not a plan or was made by another grader."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise BadPlan(f"--plan {path}: cannot be read ({err.strerror}); make one with "
                      "`python -m autograder plan SUBMISSIONS --shards N --out plan.json`") from None
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        raise BadPlan(f"--plan {path} is not JSON; make one with `python -m autograder plan`") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise BadPlan(f"--plan {path} is not a grading plan of this grader (format {FORMAT} expected)")
    if check_grader:
        mine, theirs = identity(), raw.get("grader") or {}
        if theirs != mine:
            raise BadPlan(f"--plan {path} was made by grader {theirs.get('version')} with sources "
                          f"{str(theirs.get('sources'))[:12]}; this is grader {mine['version']} with sources "
                          f"{mine['sources'][:12]}: make a new plan with this grader")
    try:
        shards = int(raw["shards"])
        entries = tuple(Entry(key=e["key"], student=e["student"], submission=e["submission"],
                              raw=base64.b64decode(e["raw"], validate=True), chapter=registry.get(e["chapter"]).id,
                              sha256=e["sha256"], cost=float(e["cost"]), shard=int(e["shard"]))
                        for e in raw["entries"])
        fixed = tuple(raw["fixed"])
        chapters = tuple(raw["chapters"]) if raw.get("chapters") else None
        max_bytes = int(raw["max_bytes"])
    except (KeyError, TypeError, ValueError) as err:
        raise BadPlan(f"--plan {path} is damaged ({type(err).__name__}: {printable(str(err))[:120]}); "
                      "make a new plan") from None
    if shards < 1 or any(not 0 <= e.shard < shards for e in entries) or len({e.key for e in entries}) != len(entries):
        raise BadPlan(f"--plan {path} is damaged (shard numbers or keys do not add up); make a new plan")
    return Plan(path=path, digest=hashlib.sha256(data).hexdigest(), shards=shards, chapters=chapters,
                max_bytes=max_bytes, entries=entries, fixed=fixed)


# --- the command ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("submissions", type=Path,
                        help="the folder `grade` would take (one sub-folder per student, e.g. nbgrader's submitted/, "
                             "or a flat folder of <student>_<chapter>.ipynb files)")
    parser.add_argument("--shards", type=int, required=True, help="how many shards (Kubernetes completions, "
                                                                   "Slurm array size)")
    parser.add_argument("--out", type=Path, default=Path("plan.json"), help="the plan to write (default plan.json)")
    parser.add_argument("--chapter", action="append", metavar="NN_name", choices=registry.ids(),
                        help="a chapter every student should have submitted (repeatable), as for `grade`")
    parser.add_argument("--max-notebook-mb", type=float, default=limits.MAX_NOTEBOOK_MB,
                        help="larger files are not read, and graded invalid (default %(default)s)")
    parser.add_argument("--cost", action="append", default=[], metavar="NN_name=SECONDS",
                        help="expected grading seconds of one notebook of a chapter, for balancing (repeatable; "
                             "default 1 for every chapter, i.e. balanced by count)")


def _costs(items: list[str]) -> dict[str, float]:
    costs = {}
    for item in items:
        chapter, _, seconds = item.partition("=")
        try:
            value = float(seconds)
        except ValueError:
            value = -1.0
        if chapter not in registry.ids() or not value > 0:
            raise engine.BadInput(f"--cost must be NN_name=SECONDS with a chapter id and seconds > 0; got {item!r} "
                           f"(chapters: {', '.join(registry.ids())})")
        costs[chapter] = value
    return costs


def run(args: argparse.Namespace) -> int:
    try:
        if args.shards < 1:
            raise engine.BadInput(f"--shards must be at least 1; got {args.shards}")
        if args.max_notebook_mb <= 0:
            raise engine.BadInput(f"--max-notebook-mb must be > 0; got {args.max_notebook_mb}")
        costs = _costs(args.cost)
        root = Path(args.submissions).resolve()
        out = Path(args.out).resolve()
        if not root.is_dir():
            raise engine.BadInput(f"SUBMISSIONS must be a folder; {args.submissions} is not one. {engine.LAYOUT_HINT}")
        if root == out.parent or root in out.parents:
            raise engine.BadInput("--out must be outside SUBMISSIONS (the grader never writes into the submissions)")
        chapters = tuple(args.chapter) if args.chapter else None
        max_bytes = int(args.max_notebook_mb * 2**20)
        found, jobs, fixed = engine.work_list(root, chapters, max_bytes, out.parent)
    except engine.BadInput as err:
        print(f"error: {printable(str(err))}", file=sys.stderr)
        return 1
    for line in found.skipped:
        print(f"skipped: {line}", file=sys.stderr)
    data = build(jobs, fixed, args.shards, chapters, max_bytes, costs)
    out.parent.mkdir(parents=True, exist_ok=True)
    record.atomic_write(out, json.dumps(data, indent=1).encode())
    print(f"planned {len(jobs)} notebook(s) of {len(found.students)} student(s) in {args.shards} shard(s) -> "
          f"{printable(str(out))} ({len(fixed)} row(s) decided without grading)")
    for index in range(args.shards):
        mine = [e for e in data["entries"] if e["shard"] == index]
        print(f"  shard {index}/{args.shards}: {len(mine)} notebook(s), expected cost "
              f"{sum(e['cost'] for e in mine):g}")
    return 0
