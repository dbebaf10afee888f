"""``python -m autograder feedback grades.csv --out feedback/``: one HTML page per student.

The page shows, per notebook and exercise, the points, the status and the reason
(the hint of the first failing check, or why the code was stopped). It is built only
from ``grades.csv``: the hidden tests' source is never read, so it cannot leak. File
names come from :func:`autograder.record.feedback_filename` (collision-free, bounded).
"""

from __future__ import annotations

import argparse
import html
import sys
from pathlib import Path

from autograder import record, status
from autograder.record import printable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("grades", type=Path, help="the grades.csv written by `python -m autograder grade`")
    parser.add_argument("--out", type=Path, default=Path("feedback"), help="folder for the pages (default feedback/)")


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0


def render(student: str, rows: list[dict]) -> str:
    score = sum(_number(r["points"]) for r in rows)
    top = sum(_number(r["max_points"]) for r in rows)
    lines = ["<!doctype html>", "<html><head><meta charset='utf-8'>",
             f"<title>Feedback — {html.escape(student)}</title>",
             "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse;width:100%}"
             "td,th{border:1px solid #ccc;padding:.3em .5em;text-align:left;vertical-align:top}"
             ".good{color:#176f2c}.bad{color:#a4161a}.neutral{color:#555}"
             "</style>", "</head><body>", f"<h1>Feedback for {html.escape(student)}</h1>",
             f"<p>Total: <b>{score:g} / {top:g}</b></p>"]
    for notebook in dict.fromkeys(r["notebook"] for r in rows):
        mine = [r for r in rows if r["notebook"] == notebook]
        lines.append(f"<h2>{html.escape(notebook)}: {sum(_number(r['points']) for r in mine):g} / "
                     f"{sum(_number(r['max_points']) for r in mine):g}</h2>")
        lines.append("<table><tr><th>exercise</th><th>points</th><th>status</th><th>what to look at</th></tr>")
        for r in mine:
            st = r["status"] if r["status"] in status.STATUSES else "error"
            lines.append(f"<tr><td>{html.escape(r['exercise'])}</td>"
                         f"<td>{_number(r['points']):g} / {_number(r['max_points']):g}</td>"
                         f"<td class='{status.TONES[st]} {st}'>{html.escape(status.DESCRIPTIONS[st])}</td>"
                         f"<td>{html.escape(r['reason'])}</td></tr>")
        lines.append("</table>")
    lines.append("</body></html>")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    if not Path(args.grades).is_file():
        print(f"error: grades must be the CSV written by `python -m autograder grade`; "
              f"{printable(str(args.grades))} does not exist", file=sys.stderr)
        return 1
    try:
        rows = record.read_csv(Path(args.grades))
    except (ValueError, UnicodeDecodeError) as err:
        print(f"error: {printable(str(err))}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    students = list(dict.fromkeys(r["student"] for r in rows))
    for student in students:
        record.atomic_write(out / record.feedback_filename(student),
                            render(student, [r for r in rows if r["student"] == student]).encode())
    print(f"wrote feedback for {len(students)} student(s) to {printable(str(out))}/")
    return 0
