"""What grading gives, in one schema: rows and results, built and read back only here.

* A **row** is one exercise's outcome: ``{"exercise", "points", "max_points", "status", "reason"}``
  (the columns of ``grades.csv`` after ``student`` and ``notebook``). Only ``passed`` earns points.
* A **result** is one notebook's rows with who and what: ``{"student", "submission", "chapter",
  "sha256", "rows", "retry", "kind"}``. Its ``kind`` says what it stands for:

  - ``graded`` — a notebook that was graded, or could not be read (a submission all the same: it goes to the
    gradebook);
  - ``duplicate`` — another copy of a chapter the student submitted twice (one row, exercise ``-``);
  - ``unmatched`` — a notebook that is no chapter (one row, exercise ``-``);
  - ``missing`` — an expected chapter without a notebook;
  - ``stale`` — a planned notebook that changed after the plan was made (a sharded run).

  ``retry`` marks a result the next run grades again (the grader's own failure, a kernel that could not start).

Results are saved as JSON (a run's state, a finished shard's record) with :func:`dump` and read back with
:func:`load`, which refuses anything else.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from autograder import limits, registry, status
from autograder.record import printable

ROW_FIELDS = ("exercise", "points", "max_points", "status", "reason")
RESULT_FIELDS = ("student", "submission", "chapter", "sha256", "rows", "retry", "kind")
KINDS = ("graded", "duplicate", "unmatched", "missing", "stale")
NO_EXERCISE = "-"  # the exercise of a row that stands for a whole file (duplicate, unmatched)


def row(exercise: registry.Exercise, status_: str, reason: str = "") -> dict:
    """One row for ``exercise``: its points only when passed; the reason printable and cut to length."""
    return {"exercise": exercise.name, "points": exercise.points if status_ == status.PASSED else 0,
            "max_points": exercise.points, "status": status_, "reason": _reason(reason)}


def rows_for_all(chapter: registry.Chapter, status_: str, reason: str) -> list[dict]:
    """The same status and reason for every exercise of ``chapter``."""
    return [row(ex, status_, reason) for ex in chapter.exercises]


def file_rows(status_: str, reason: str) -> list[dict]:
    """The one row of a file that is not graded as a chapter (a duplicate, a notebook of no chapter)."""
    return [{"exercise": NO_EXERCISE, "points": 0, "max_points": 0, "status": status_, "reason": _reason(reason)}]


def _reason(text: str) -> str:
    return printable(str(text))[: limits.REASON_CHARS]


def result(student: str, submission: str, chapter: str | None, rows: list[dict], sha256: str = "",
           retry: bool = False, kind: str = "graded") -> dict:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    return {"student": student, "submission": submission, "chapter": chapter, "sha256": sha256,
            "rows": [{**r, "reason": _reason(r["reason"])} for r in rows], "retry": retry, "kind": kind}


def of_chapter(student: str, submission: str, chapter: str, status_: str, reason: str, sha256: str = "",
               retry: bool = False, kind: str = "graded") -> dict:
    """A result whose every exercise of ``chapter`` has ``status_`` and ``reason``."""
    return result(student, submission, chapter, rows_for_all(registry.get(chapter), status_, reason), sha256,
                  retry=retry, kind=kind)


def stale(student: str, submission: str, chapter: str, why: str) -> dict:
    """A planned notebook that is not graded because its file changed (or went) after the plan was made."""
    return of_chapter(student, submission, chapter, status.STALE,
                      f"{why}; it was not graded: make a new plan to grade the new file", kind="stale")


def grader_failure(student: str, submission: str, chapter: str, sha256: str, err: BaseException | str) -> dict:
    """The grader's own failure on a notebook: error rows, graded again by the next run."""
    what = err if isinstance(err, str) else type(err).__name__
    return of_chapter(student, submission, chapter, status.ERROR,
                      f"the grader failed on this notebook ({what}); it is graded again next run", sha256, retry=True)


# --- JSON --------------------------------------------------------------------------------------------------


def dump(res: dict) -> bytes:
    return json.dumps({k: res[k] for k in RESULT_FIELDS}, indent=1).encode()


def is_result(res: Any) -> bool:
    """Whether ``res`` has what the CSV, the gradebook and the feedback read of a result."""
    return (isinstance(res, dict) and all(isinstance(res.get(k), str) for k in ("student", "submission", "sha256"))
            and (res.get("chapter") is None or res.get("chapter") in registry.ids())
            and res.get("kind", "graded") in KINDS and isinstance(res.get("rows"), list)
            and all(isinstance(r, dict) and set(ROW_FIELDS) <= r.keys() and r["status"] in status.STATUSES
                    for r in res["rows"]))


def load(data: bytes | str | Any) -> dict | None:
    """The result in ``data`` (JSON, or already parsed), or None when it is not one."""
    if isinstance(data, (bytes, str)):
        try:
            data = json.loads(data)
        except (ValueError, RecursionError):
            return None
    if not is_result(data):
        return None
    return {"retry": False, "kind": "graded", **{k: data[k] for k in RESULT_FIELDS if k in data}}


# --- reading results ---------------------------------------------------------------------------------------


def csv_rows(results: list[dict]) -> list[dict]:
    """The rows of ``grades.csv`` (:data:`autograder.record.FIELDS`), by student and notebook."""
    rows = []
    for res in sorted(results, key=lambda r: (r["student"], r["submission"])):
        for r in res["rows"]:
            rows.append({"student": res["student"], "notebook": res["submission"], **{k: r[k] for k in ROW_FIELDS}})
    return rows


def in_gradebook(res: dict) -> bool:
    """Whether a result is a submission the gradebook records (graded, or could not be read)."""
    return bool(res["chapter"]) and res.get("kind", "graded") == "graded"


def summary(results: list[dict], out: Path, file=None) -> None:
    """What a run graded: notebooks, statuses, each student's total (one pass: a class may have 10,000)."""
    file = file or sys.stdout
    counts: dict[str, int] = {}
    totals: dict[str, list] = {}
    for res in results:
        total = totals.setdefault(res["student"], [0, 0])
        for r in res["rows"]:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
            total[0] += r["points"]
            total[1] += r["max_points"]
    notebooks = sum(1 for r in results if r["sha256"])
    print(f"graded {notebooks} notebook(s) of {len(totals)} student(s) -> {out}", file=file)
    print("  " + ", ".join(f"{s}: {n}" for s, n in sorted(counts.items())), file=file)
    for student, (score, top) in sorted(totals.items()):
        print(f"  {printable(student)}: {score:g}/{top:g}", file=file)
