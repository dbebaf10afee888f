"""``python -m autograder feedback grades.csv --out feedback/``: one HTML page per student.

The page shows, per notebook and exercise, the points, the status and the reason
(the hint of the first failing check, or why the code was stopped). It is built only
from ``grades.csv``: the hidden tests' source is never read, so it cannot leak.
"""

from __future__ import annotations

import argparse
import csv
import html
import sys
from pathlib import Path

from autograder.grade import atomic_write

STATUS_TEXT = {
    "passed": "passed", "failed": "a check failed", "error": "your code raised an error",
    "timeout": "stopped: took too long", "memory": "stopped: used too much memory", "crashed": "the kernel died",
    "missing": "not done", "invalid": "the notebook could not be read", "flagged": "not accepted: delegated",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("grades", type=Path, help="the grades.csv written by `python -m autograder grade`")
    parser.add_argument("--out", type=Path, default=Path("feedback"), help="folder for <student>.html (default feedback/)")


def render(student: str, rows: list[dict]) -> str:
    score = sum(float(r["points"]) for r in rows)
    top = sum(float(r["max_points"]) for r in rows)
    lines = ["<!doctype html>", "<html><head><meta charset='utf-8'>",
             f"<title>Feedback — {html.escape(student)}</title>",
             "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse;width:100%}"
             "td,th{border:1px solid #ccc;padding:.3em .5em;text-align:left;vertical-align:top}"
             ".passed{color:#176f2c}.failed,.error,.timeout,.memory,.crashed,.invalid,.flagged{color:#a4161a}</style>",
             "</head><body>", f"<h1>Feedback for {html.escape(student)}</h1>",
             f"<p>Total: <b>{score:g} / {top:g}</b></p>"]
    for notebook in dict.fromkeys(r["notebook"] for r in rows):
        mine = [r for r in rows if r["notebook"] == notebook]
        lines.append(f"<h2>{html.escape(notebook)}: {sum(float(r['points']) for r in mine):g} / "
                     f"{sum(float(r['max_points']) for r in mine):g}</h2>")
        lines.append("<table><tr><th>exercise</th><th>points</th><th>status</th><th>what to look at</th></tr>")
        for r in mine:
            status = r["status"]
            lines.append(f"<tr><td>{html.escape(r['exercise'])}</td><td>{float(r['points']):g} / {float(r['max_points']):g}</td>"
                         f"<td class='{html.escape(status)}'>{html.escape(STATUS_TEXT.get(status, status))}</td>"
                         f"<td>{html.escape(r['reason'])}</td></tr>")
        lines.append("</table>")
    lines.append("</body></html>")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if not Path(args.grades).is_file():
        print(f"error: grades must be the CSV written by `python -m autograder grade`; {args.grades} does not exist",
              file=sys.stderr)
        return 1
    with open(args.grades, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    students = list(dict.fromkeys(r["student"] for r in rows))
    for student in students:
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in student)
        atomic_write(out / f"{safe}.html", render(student, [r for r in rows if r["student"] == student]).encode())
    print(f"wrote feedback for {len(students)} student(s) to {out}/")
    return 0
