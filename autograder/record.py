"""Grader output that cannot be injected: the one CSV writer and reader, safe names, safe terminal text.

* :func:`printable` escapes control characters (C0, C1, DEL) and bidirectional-override
  characters as ``\\xNN`` / ``\\uNNNN``, so no name or message can move the cursor,
  rewrite a line, set the clipboard (OSC 52) or reorder text in a terminal or a CSV.
* :func:`display_name` turns a file name as the file system has it (bytes, maybe not
  UTF-8) into such a string, one-to-one (a backslash is doubled), so two different
  folders never show as the same student.
* The CSV is written with every field quoted and ``\\r\\n`` line ends, and a cell that
  a spreadsheet would read as a formula (starting with ``=``, ``+``, ``-``, ``@``, a tab
  or a carriage return) gets a leading ``'`` — as does one that already starts with
  ``'`` — which :func:`read_csv` removes again, so reading gives back exactly what was
  written. Files are replaced atomically and follow the umask.
* :func:`feedback_filename` is collision-free and length-bounded.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
import tempfile
from pathlib import Path

FIELDS = ("student", "notebook", "exercise", "points", "max_points", "status", "reason")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "'")
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with control and bidi-override characters escaped (safe for a terminal).

    C0 and DEL become ``\\xNN``; C1 controls and bidi overrides become ``\\uNNNN``, so that a
    C1 character never reads like a byte that is not UTF-8 (``display_name`` shows those as ``\\xNN``).
    """
    return _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x80 else f"\\u{ord(m.group()):04x}",
                       text)


def display_name(name: str | bytes) -> str:
    """A file name (bytes, or str with surrogate escapes) as a printable, one-to-one string."""
    raw = name if isinstance(name, bytes) else os.fsencode(name)
    text = raw.decode("utf-8", "backslashreplace") if b"\\" not in raw else (
        raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace"))
    return printable(text)


def _cell(value) -> str:
    text = str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def _uncell(text: str) -> str:
    return text[1:] if text.startswith("'") and text[1:].startswith(FORMULA_START) else text


def csv_bytes(rows: list[dict]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\r\n")
    writer.writerow(FIELDS)
    for r in rows:
        writer.writerow([_cell(r[k]) for k in FIELDS])
    return buf.getvalue().encode("utf-8")


def read_csv(path: Path) -> list[dict]:
    """The rows of a grades.csv written by :func:`write_csv` (also a plain CSV with the same header)."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [k for k in FIELDS if k not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path} is not a grades.csv: it lacks the column(s) {', '.join(missing)}")
        return [{k: _uncell(v or "") for k, v in r.items() if k in FIELDS} for r in reader]


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one step (temp file, fsync, rename), with the umask's permissions."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
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


def write_csv(path: Path, rows: list[dict]) -> None:
    atomic_write(path, csv_bytes(rows))


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}")


def feedback_filename(student: str) -> str:
    """``<student>.html`` when the name is plain and short; otherwise a cleaned prefix, ``~`` and a hash.

    ``~`` never occurs in a plain name, so the two kinds cannot collide, and two different
    names never share a hash-suffixed file.
    """
    if _SAFE_NAME.fullmatch(student) and not student.endswith("."):
        return f"{student}.html"
    prefix = re.sub(r"[^A-Za-z0-9._-]+", "_", student)[:40].strip("._") or "student"
    return f"{prefix}~{hashlib.sha256(student.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}.html"
