"""``python -m autograder merge DIR... --plan plan.json --out grades.csv [--gradebook URL]``: one grade from the shards.

The steps, in order (each a function below):

1. the plan (:func:`autograder.plan.load`: refused when made by another grader);
2. :func:`collect` — every ``shard-i-of-N.json`` a shard wrote into its ``DIR`` when it
   finished (:mod:`autograder.shard`); one of another plan is refused;
3. :func:`problems` — every shard is there, every notebook of the plan has a result, and no
   notebook has two different results (a shard graded twice into two folders); otherwise
   the list is printed, nothing is written and the exit status is 1;
4. record — the plan's fixed rows and the shards' results into the CSV (atomically, by
   :mod:`autograder.record`), then into the nbgrader gradebook: ``merge`` is its only writer
   in a sharded run, as many shards writing one SQLite file from many nodes would corrupt it;
5. the summary, as ``grade`` prints it.

Merging again gives the same CSV and leaves the gradebook as it was (its writes are upserts).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from autograder import record, results, shard
from autograder import plan as plans
from autograder.record import printable

SHOWN = 20  # problems listed before "... and N more"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", type=Path, nargs="+", metavar="DIR",
                        help="the shards' folders (each the folder of a shard's --out DIR/grades.csv; "
                             "DIR/grades.csv itself is taken as DIR)")
    parser.add_argument("--plan", type=Path, required=True, help="the plan the shards graded")
    parser.add_argument("--out", type=Path, default=Path("grades.csv"), help="the CSV to write (default grades.csv)")
    parser.add_argument("--gradebook", default=None,
                        help="nbgrader gradebook URL to record the scores in, e.g. sqlite:///gradebook.db "
                             "(default: ./gradebook.db when it exists; 'none' to skip)")


@dataclass
class Collected:
    records: dict[int, list[tuple[Path, dict]]] = field(default_factory=dict)  # shard -> (file, its results)
    errors: list[str] = field(default_factory=list)


def collect(dirs: list[Path], plan: plans.Plan) -> Collected:
    """The finished shards' results found in ``dirs``, by shard index."""
    out = Collected()
    for folder in dirs:
        folder = Path(folder).parent if Path(folder).is_file() else Path(folder)  # DIR/grades.csv names DIR too
        files = sorted(folder.glob("shard-*-of-*.json")) if folder.is_dir() else []
        if not files:
            out.errors.append(f"{folder}: no finished shard in it (still running, killed, or not a shard's folder)")
        for path in files:
            try:
                data = json.loads(path.read_bytes())
                index, shards, graded = int(data["shard"]), int(data["shards"]), data["results"]
                if data.get("format") != shard.FORMAT or not isinstance(graded, dict) or not all(
                        results.is_result(r) for r in graded.values()):
                    raise ValueError("not a shard record")
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
                out.errors.append(f"{path}: not a finished shard's record ({type(err).__name__}); rerun that shard")
                continue
            if data.get("plan") != plan.digest or shards != plan.shards:
                out.errors.append(f"{path}: graded from another plan than {plan.path} (its shard {index}/{shards}); "
                                  "give the plan those shards were graded from, or rerun them with this one")
                continue
            out.records.setdefault(index, []).append((path, {k: results.load(r) for k, r in graded.items()}))
    return out


def problems(plan: plans.Plan, found: Collected) -> tuple[list[str], dict[str, dict]]:
    """(what is wrong, the one result of each entry's key)."""
    lines = list(found.errors)
    missing = [i for i in range(plan.shards) if i not in found.records]
    if missing:
        lines.append(f"missing shard(s) {', '.join(f'{i}/{plan.shards}' for i in missing)}: run each with "
                     f"`python -m autograder grade SUBMISSIONS --plan {plan.path} --shard i/{plan.shards} "
                     "--out DIR/grades.csv` and give its DIR")
    by_key: dict[str, dict] = {}
    for index, records in sorted(found.records.items()):
        entries = {e.key: e for e in plan.of_shard(index)}
        lacking, extra, conflicts = [], [], []
        for path, got in records:
            extra += [key for key in got if key not in entries]
            for key, entry in entries.items():
                if key not in got:
                    lacking.append(entry.submission)
                elif key in by_key and by_key[key] != got[key]:
                    conflicts.append(f"{entry.submission} ({path})")
                else:
                    by_key.setdefault(key, got[key])
        if lacking:
            lines.append(f"shard {index}/{plan.shards} lacks {len(lacking)} result(s): {_some(sorted(set(lacking)))}; "
                         "rerun that shard")
        if extra:
            lines.append(f"shard {index}/{plan.shards} has {len(extra)} result(s) of notebooks not in its part of the "
                         f"plan: {_some(sorted(set(extra)))}")
        if conflicts:
            lines.append(f"two different results for {len(conflicts)} notebook(s) of shard {index}/{plan.shards}: "
                         f"{_some(conflicts)}; keep one folder per shard")
    return lines, by_key


def _some(items: list[str]) -> str:
    shown = ", ".join(printable(s) for s in items[:SHOWN])
    return shown + (f" ... and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def run(args: argparse.Namespace) -> int:
    try:
        plan = plans.load(args.plan)
    except plans.BadPlan as err:
        print(f"error: {printable(str(err))}", file=sys.stderr)
        return 1
    wrong, by_key = problems(plan, collect(args.dirs, plan))
    if wrong:
        print(f"error: cannot merge: the shards of {printable(str(plan.path))} are not complete and consistent; "
              "nothing was written", file=sys.stderr)
        for line in wrong:
            print(f"  {printable(line)}", file=sys.stderr)
        return 1
    merged = list(plan.fixed) + [by_key[e.key] for e in plan.entries]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record.write_csv(out, results.csv_rows(merged))
    failed = _gradebook(args.gradebook, merged)
    retry = sorted({e.shard for e in plan.entries if by_key[e.key].get("retry")})
    if retry:
        print(f"warning: some notebooks got a grader error (status 'error', see their reason); rerun shard(s) "
              f"{', '.join(f'{i}/{plan.shards}' for i in retry)} and merge again to grade them", file=sys.stderr)
    results.summary(merged, out)
    return 1 if failed else 0


def _gradebook(url: str | None, merged: list[dict]) -> int:
    """Record the results in the gradebook; the number that failed (each said on stderr)."""
    if url is None and Path("gradebook.db").exists():
        url = f"sqlite:///{Path('gradebook.db').resolve()}"
    todo = [res for res in merged if results.in_gradebook(res)]
    if url in (None, "none") or not todo:
        return 0
    from autograder import gradebook  # nbgrader, loaded only when a gradebook is written

    book, failed = gradebook.Recorder(url), 0
    with book.session():
        for res in todo:
            try:
                book.record(res)
            except Exception as err:  # noqa: BLE001 — the CSV is written; say which submission it lacks
                failed += 1
                print(f"error: the gradebook could not record {printable(res['student'])}: {type(err).__name__}",
                      file=sys.stderr)
    return failed
