"""Find and read submissions: regular files only, never through a link, any file name Linux allows.

Layouts read as they are (no copying):

* ``SUBMISSIONS/<student>/**/<chapter>.ipynb`` — one folder per student, notebooks at any
  depth (up to :data:`MAX_DEPTH`), which includes nbgrader's collect layout
  ``submitted/<student>/<assignment>/<chapter>.ipynb``;
* ``SUBMISSIONS/<name>.ipynb`` — a flat folder (an LMS download) whose file names carry
  the student and the chapter, e.g. ``alice_01_attention_by_hand.ipynb``.

A notebook's chapter comes from its file name: the exact ``NN_name.ipynb``, or a renamed
copy of it (``NN_name-Copy1.ipynb`` from JupyterLab's Duplicate, ``NN_name (1).ipynb``
from a browser download, ``NN_name_v2.ipynb``...). Inside an nbgrader assignment folder
(``<student>/<chapter id>/...``) the folder decides: a notebook named after another chapter is
that student's chapter of the folder, ``invalid``, and never counts as the other chapter. Per student and chapter one file is
graded — the exact name at the shallowest depth, else the only renamed copy — and the
others are reported as duplicates. Names starting with ``.`` are not read: inside a
student's folder silently (``.ipynb_checkpoints``, Jupyter's autosaved copies; ``.git``),
at the top listed as skipped with the reason. Discovery walks folders iteratively without following
links; reading opens each path component with ``O_NOFOLLOW`` and accepts only a regular
file of bounded size, hashed while it is read.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from autograder import registry
from autograder.record import display_name

MAX_DEPTH = 8  # folder levels below SUBMISSIONS that are searched
MAX_ENTRIES = 1_000_000  # directory entries looked at, in all
COPY_SUFFIX = re.compile(r"(?:[\s_.-]*(?:copy\s*\d*|kopie\s*\d*|\(\d+\)|\d+|v\d+|final|checkpoint|submission))*[\s_.-]*",
                         re.IGNORECASE)


class Unreadable(Exception):
    """The file cannot be graded; the message says why without quoting its content."""


@dataclass(frozen=True)
class Found:
    """One ``*.ipynb`` entry under SUBMISSIONS."""

    student: str  # printable, one-to-one (see record.display_name)
    relpath: str  # printable path relative to SUBMISSIONS
    raw: bytes  # the path relative to SUBMISSIONS, as the file system has it
    chapter: str | None  # the chapter its name matches, if any
    exact: bool  # the name is exactly NN_name.ipynb
    depth: int
    problem: str | None = None  # why it cannot be graded (a link, a FIFO...), if it cannot
    folder: str | None = None  # the chapter of the nbgrader assignment folder it is in (<student>/<chapter>/...)


@dataclass
class Discovery:
    found: list[Found] = field(default_factory=list)
    students: list[str] = field(default_factory=list)  # every student folder or flat-file student
    skipped: list[str] = field(default_factory=list)  # what discovery did not look into, and why


def match_chapter(filename: str) -> tuple[str | None, bool, str]:
    """(chapter id, exact name?, the rest of the stem around the chapter id) for a ``*.ipynb`` file name."""
    stem = filename[: -len(".ipynb")] if filename.lower().endswith(".ipynb") else filename
    for chapter in registry.CHAPTERS:
        if stem == chapter.id:
            return chapter.id, True, ""
        at = stem.find(chapter.id)
        if at >= 0:
            before, after = stem[:at], stem[at + len(chapter.id):]
            if COPY_SUFFIX.fullmatch(after):
                return chapter.id, False, before.strip(" _-.")
    return None, False, stem


def discover(root: Path) -> Discovery:
    """Every ``*.ipynb`` under ``root`` (see the module docstring), walked without recursion or links."""
    result = Discovery()
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        pending: list[tuple[bytes, int, str | None]] = [(b"", 0, None)]  # (relative path, depth, student)
        seen = 0
        while pending:
            rel, depth, student = pending.pop()
            try:
                fd = os.open(rel or b".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root_fd) if rel else \
                    os.dup(root_fd)
            except OSError as err:
                result.skipped.append(f"{display_name(rel)}: cannot be opened ({err.strerror})")
                continue
            try:
                with os.scandir(fd) as it:
                    entries = []
                    for entry in it:
                        seen += 1
                        if seen > MAX_ENTRIES:
                            result.skipped.append(f"stopped after {MAX_ENTRIES} entries")
                            break
                        entries.append((os.fsencode(entry.name), entry.is_dir(follow_symlinks=False),
                                        entry.is_symlink()))
            finally:
                os.close(fd)
            for name, is_dir, is_link in sorted(entries):
                path = rel + b"/" + name if rel else name
                if name.startswith(b"."):
                    if depth == 0:  # a student's folder (or a flat notebook) must never vanish unsaid
                        result.skipped.append(f"{display_name(name)}: its name starts with '.' (hidden), so it is "
                                              "not graded; rename it to grade it")
                    continue  # inside a student's folder: .ipynb_checkpoints (Jupyter's autosaves), .git
                if depth == 0 and (is_dir or is_link) and not name.lower().endswith(b".ipynb"):
                    result.students.append(display_name(name))
                    if is_link:
                        result.skipped.append(f"{display_name(name)}: a link, not a folder (not followed)")
                        continue
                    pending.append((path, 1, display_name(name)))
                elif is_dir:
                    if depth + 1 > MAX_DEPTH:
                        result.skipped.append(f"{display_name(path)}: deeper than {MAX_DEPTH} levels")
                    else:
                        pending.append((path, depth + 1, student))
                elif name.lower().endswith(b".ipynb"):
                    result.found.append(_found(path, name, depth, student, is_link))
    finally:
        os.close(root_fd)
    flat = sorted({f.student for f in result.found if f.depth == 0 and f.student})
    result.students = sorted(set(result.students) | set(flat))
    result.found.sort(key=lambda f: (f.student, f.raw))
    return result


def assignment_folder(path: bytes) -> str | None:
    """The chapter whose id names the first folder below the student's (nbgrader's
    ``submitted/<student>/<assignment>/...``), or None."""
    parts = path.split(b"/")
    if len(parts) < 3:
        return None
    name = os.fsdecode(parts[1])
    return name if name in registry.ids() else None


def _found(path: bytes, name: bytes, depth: int, student: str | None, is_link: bool) -> Found:
    filename = os.fsdecode(name)
    chapter, exact, rest = match_chapter(filename)
    folder = assignment_folder(path) if student is not None else None
    problem = "a link, not a regular file (links are never followed)" if is_link else None
    if folder is not None and chapter is not None and chapter != folder:
        problem = problem or (f"its name says chapter {chapter} but it is in the assignment folder {folder}: a "
                              f"notebook is graded as the assignment it was submitted to; submit {folder}.ipynb there")
        chapter, exact = folder, False
    if student is None:  # flat layout: the student is the rest of the file name
        student = display_name(os.fsencode(rest)) if chapter and rest else ""
        # <student>_<chapter>.ipynb is the exact flat name; a copy suffix after the chapter is not
        exact = bool(chapter) and filename[: -len(".ipynb")].endswith(chapter)
        if not student:
            problem = problem or ("the file name must carry the student and the chapter, e.g. "
                                  "alice_01_attention_by_hand.ipynb, or put each student's notebooks "
                                  "in a folder of their own")
    return Found(student, display_name(path), path, chapter, exact, depth, problem, folder)


def read(root: Path, raw: bytes, max_bytes: int, *, keep: bool = True) -> tuple[bytes, str]:
    """(content, sha256) of the regular file at ``raw`` under ``root``; Unreadable otherwise.

    Each path component is opened without following links; the file must be a regular
    file of at most ``max_bytes``; it is read (and hashed) in chunks.
    """
    parts = [p for p in raw.split(b"/") if p]
    if not parts or any(p in (b".", b"..") for p in parts):
        raise Unreadable("not a path inside the submissions folder")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as err:
                raise Unreadable(f"a folder on its path cannot be opened ({err.strerror})") from None
            os.close(fd)
            fd = nxt
        try:
            file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=fd)
        except OSError as err:
            if err.errno in (getattr(os, "ELOOP", 40),) or "symbolic link" in (err.strerror or "").lower():
                raise Unreadable("a link, not a regular file (links are never followed)") from None
            raise Unreadable(f"cannot be opened ({err.strerror})") from None
    finally:
        os.close(fd)
    try:
        st = os.fstat(file_fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                    or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file")
            raise Unreadable(f"{kind}, not a regular file")
        if st.st_size > max_bytes:
            raise Unreadable(f"{st.st_size} bytes, larger than the {max_bytes}-byte limit for a notebook")
        digest, chunks, total = hashlib.sha256(), [], 0
        while True:
            chunk = os.read(file_fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:
                raise Unreadable(f"larger than the {max_bytes}-byte limit for a notebook")
            digest.update(chunk)
            if keep:
                chunks.append(chunk)
        return b"".join(chunks), digest.hexdigest()
    finally:
        os.close(file_fd)


def sha256_of(root: Path, raw: bytes, max_bytes: int) -> str:
    """The sha256 of the file (read as :func:`read` does); Unreadable otherwise."""
    return read(root, raw, max_bytes, keep=False)[1]
