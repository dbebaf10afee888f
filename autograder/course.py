"""``python -m autograder course {init,collect,feedback}``: the course as an nbgrader course directory on a hub.

* ``init DIR --course-id ID [--students CSV] [--exchange PATH]`` makes (or updates) the nbgrader
  course directory ``DIR``: ``nbgrader_config.py`` (the course's settings, its id, the exchange),
  ``source/NN_name/`` from ``autograder/source/``, every chapter generated into ``release/`` and
  released into the exchange, the assignments in ``gradebook.db`` with the registry's points, and
  the students of ``CSV`` (the columns of ``nbgrader db student import``:
  ``id,first_name,last_name,email``). Running it again updates the same things and keeps
  ``submitted/``, ``autograded/``, ``feedback/`` and every grade of the gradebook.
* ``collect DIR CHAPTER`` is ``nbgrader collect`` after setting aside the submissions whose name
  claims a student who does not own them: the exchange's ``inbound`` folder is writable by every
  learner, and nbgrader's own check of the owner only warns.
* ``feedback DIR CHAPTER --grades CSV`` turns the rows of ``python -m autograder grade`` into
  nbgrader's feedback layout (``feedback/<student>/<chapter>/<chapter>.html``) and runs nbgrader's
  ``release_feedback``: learners fetch it from the Assignment List.

:class:`PrivateSubmit` is the learners' side of the exchange on the hub (``deploy/jupyterhub/``):
nbgrader's submit leaves a submission readable by every user who can guess its folder's name;
this one leaves it to its owner and the course's group.
"""

from __future__ import annotations

import argparse
import csv
import os
import pwd
import re
import shutil
import stat
import sys
from pathlib import Path

import nbformat
from nbgrader.exchange.default.submit import ExchangeSubmit

from autograder import environment, registry, release

DEFAULT_EXCHANGE = Path("/srv/nbgrader/exchange")
CONFIG_NAME = "nbgrader_config.py"
KEPT = ("submitted", "autograded", "feedback", "gradebook.db")  # what init never touches (said in its output)
STUDENT_COLUMNS = ("id", "first_name", "last_name", "email")
# nbgrader splits exchange names on '+' and globs with '*'; the hub maps ids to system users.
STUDENT_ID = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")
COURSE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class CourseError(Exception):
    """One line for the instructor: what is wrong and what to do; nothing was changed."""


# --- the learners' submit ---------------------------------------------------------------------


class PrivateSubmit(ExchangeSubmit):
    """nbgrader's submit, leaving the submission to its owner and the group of ``inbound``.

    ``inbound`` is set-group-ID (nbgrader makes it so), so a submission belongs to the course's
    group; nbgrader then makes its files readable by everyone (0644, the folder 0777) and relies on
    the random folder name alone. Here files become 0640 and folders 0750 (the top one 0770, so the
    course's group can remove it), and learners are not in that group.
    """

    def do_copy(self, src, dest, log=None):
        inbound = os.path.join(self.inbound_path, "")
        if not os.path.abspath(dest).startswith(inbound):  # the learner's own cache: as nbgrader does it
            return super().do_copy(src, dest, log)
        # copytree gives the folder it makes the mode of ``src``, which drops the set-group-ID bit it got from
        # inbound: timestamp.txt and submission_secret.txt, written next, would then belong to the learner's
        # group and stay unreadable to the course. So the top folder is made here and keeps the bit.
        os.mkdir(dest)
        staging = os.path.join(dest, ".copy")
        super().do_copy(src, staging, log)
        for name in os.listdir(staging):
            os.rename(os.path.join(staging, name), os.path.join(dest, name))
        os.rmdir(staging)

    def copy_files(self):
        super().copy_files()
        top = os.path.join(self.inbound_path, self.assignment_filename)
        for folder, _, files in os.walk(top):
            for name in files:
                os.chmod(os.path.join(folder, name), 0o640)
            os.chmod(folder, 0o770 if folder == top else 0o750)


# --- init ---------------------------------------------------------------------------------------


def read_students(path: Path) -> list[dict]:
    """The students of a CSV with ``nbgrader db student import``'s columns; CourseError naming the bad row."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise CourseError(f"--students {path}: cannot be read ({err.__class__.__name__}: {err})") from None
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in reader.fieldnames or []]
    if "id" not in header:
        raise CourseError(f"--students {path}: row 1 (the header) has no 'id' column; expected the columns "
                          f"{','.join(STUDENT_COLUMNS)} (id is required)")
    unknown = [h for h in header if h not in STUDENT_COLUMNS]
    if unknown:
        raise CourseError(f"--students {path}: row 1 (the header) has unknown column(s) {', '.join(unknown)}; "
                          f"expected {','.join(STUDENT_COLUMNS)}")
    students, seen = [], {}
    for number, row in enumerate(reader, start=2):
        if None in row:
            raise CourseError(f"--students {path}: row {number} has {len(header) + len(row[None])} fields, "
                              f"the header {len(header)}")
        row = {k.strip(): (v or "").strip() for k, v in row.items()}
        if not any(row.values()):
            continue
        sid = row.get("id", "")
        if not STUDENT_ID.match(sid):
            raise CourseError(f"--students {path}: row {number}: id {sid!r} is not a login name (lower-case letters, "
                              "digits, '_', '.', '-', starting with a letter or '_', at most 32 characters): the hub "
                              "maps each id to the system user of that name")
        if sid in seen:
            raise CourseError(f"--students {path}: row {number}: id {sid!r} is already on row {seen[sid]}")
        seen[sid] = number
        students.append({k: row.get(k) or None for k in STUDENT_COLUMNS})
    return students


def config_text(course_id: str, root: Path, exchange: Path) -> str:
    """``nbgrader_config.py`` of a course directory: the course's settings, then this course's own."""
    course = release.CONFIG_FILE.read_text()
    course = course.split('"""', 2)[2].lstrip() if course.startswith('"""') else course
    course = re.sub(r"^c\.CourseDirectory\.course_id = .*\n", "", course, flags=re.MULTILINE)  # set below
    points = "\n".join(f"#   {c.id:<28} {c.points:>3} points  ({', '.join(f'{e.name} {e.points}' for e in c.exercises)})"
                       for c in registry.CHAPTERS)
    return f'''"""nbgrader configuration of the course {course_id!r}, written by
`python -m autograder course init` (running it again rewrites this file: change the command's options,
not this file)."""

{course}
# --- this course -------------------------------------------------------------------------------
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.root = {str(root)!r}
c.CourseDirectory.db_url = {"sqlite:///" + str(root / "gradebook.db")!r}
c.Exchange.root = {str(exchange)!r}
# A submission readable only by its learner and the course's group (autograder/course.py).
c.ExchangeFactory.submit = "autograder.course.PrivateSubmit"
# A submission and its notebooks at most 64 MB and 64 MB a file (what `autograder grade` reads).
c.CourseDirectory.max_file_size = 65536
c.CourseDirectory.max_dir_size = 65536

# The chapters and their points (autograder/registry.py; each notebook's graded cells carry them):
{points}
'''


def ensure_exchange(exchange: Path) -> list[str]:
    """Create the exchange root 1777: writable by all as nbgrader needs, but (unlike nbgrader's 0777) with the
    sticky bit, so that no learner can rename or replace the course's folder in it."""
    notes = []
    if not exchange.exists():
        exchange.mkdir(parents=True)
        notes.append(f"created the exchange {exchange}")
    mode = stat.S_IMODE(exchange.stat().st_mode)
    if mode != 0o1777:
        try:
            os.chmod(exchange, 0o1777)
            notes.append(f"exchange {exchange}: mode {mode:04o} -> 1777 (writable by all, sticky)")
        except PermissionError:
            raise CourseError(f"the exchange {exchange} has mode {mode:04o}; it must be 1777 (run once as root: "
                              f"chmod 1777 {exchange})") from None
    return notes


def copy_sources(root: Path, names: list[str]) -> None:
    """``root/source/NN_name/`` from ``autograder/source/``, graded test cells tagged as the release tags them."""
    for name in names:
        target = root / "source" / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(registry.SOURCE_DIR / name, target, ignore=shutil.ignore_patterns(*release.IGNORED))
        notebook = target / f"{name}.ipynb"
        nb = nbformat.read(notebook, as_version=4)
        release.tag_test_cells(nb)
        nbformat.write(nb, notebook)


def nbgrader_api(root: Path, **overrides):
    """nbgrader's API on the course directory ``root``, with its own ``nbgrader_config.py``."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    environment.for_nbgrader()
    config = PyFileConfigLoader(CONFIG_NAME, path=str(root)).load_config()
    for section, values in overrides.items():
        for key, value in values.items():
            setattr(config[section], key, value)
    return NbGraderAPI(CourseDirectory(config=config), config=config)


def _check(result: dict, what: str) -> None:
    if not result.get("success"):
        log = (result.get("error") or "") + (result.get("log") or "")
        raise CourseError(f"{what} failed: " + (log.strip().splitlines() or ["(no output)"])[-1])


def _released(exchange: Path, course_id: str, name: str, root: Path) -> bool:
    """Whether the exchange already holds exactly this release of chapter ``name``."""
    out, new = exchange / course_id / "outbound" / name, root / "release" / name
    files = lambda d: {p.relative_to(d): p.read_bytes() for p in d.rglob("*") if p.is_file()}  # noqa: E731
    return out.is_dir() and files(out) == files(new)


def registered_points(root: Path) -> dict[str, float]:
    """Chapter -> the points of its graded cells in the course's gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        return {a.name: sum(c.max_score for nb in a.notebooks for c in nb.grade_cells) for a in gb.assignments}


def init(root: Path, course_id: str, exchange: Path = DEFAULT_EXCHANGE, students: Path | None = None,
         chapters: list[str] | None = None) -> list[str]:
    """Make or update the course directory ``root``; returns what was done, one line each."""
    if not COURSE_ID.match(course_id):
        raise CourseError(f"--course-id {course_id!r}: use letters, digits, '_', '.' and '-' (at most 64), "
                          "starting with a letter or digit; it names the course's folder in the exchange")
    names = chapters or release.chapters()
    unknown = sorted(set(names) - set(registry.ids()))
    if unknown:
        raise CourseError(f"--chapter {', '.join(unknown)}: no such chapter; choose from {', '.join(registry.ids())}")
    roster = read_students(students) if students else []
    problems = release.metadata_problems(names=names)
    if problems:
        raise CourseError(f"the source notebooks disagree with autograder/registry.py: {problems[0]}")
    root = Path(root).resolve()
    config = root / CONFIG_NAME
    if config.exists():
        existing = re.findall(r"^c\.CourseDirectory\.course_id = (['\"])(.*)\1$", config.read_text(), re.MULTILINE)
        if existing and existing[-1][1] != course_id:
            raise CourseError(f"{root} is the course {existing[-1][1]!r}; --course-id {course_id!r} would leave its "
                              "submissions and grades under the old id: use the same id, or a new folder")
    exchange = Path(exchange).resolve()
    notes = ensure_exchange(exchange)
    root.mkdir(parents=True, exist_ok=True)
    kept = [k for k in KEPT if (root / k).exists()]
    config.write_text(config_text(course_id, root, exchange))
    copy_sources(root, names)
    api = nbgrader_api(root, ExchangeReleaseAssignment={"force": True})
    for name in names:
        _check(api.generate_assignment(name, force=True, create=True), f"nbgrader generate_assignment {name}")
        for notebook in (root / "release" / name).rglob("*.ipynb"):
            nbformat.write(release.stamped(nbformat.read(notebook, as_version=4)), notebook)
        if _released(exchange, course_id, name, root):
            notes.append(f"{name}: already released, unchanged")
            continue
        _check(api.release_assignment(name), f"nbgrader release_assignment {name}")
        notes.append(f"{name}: released into {exchange / course_id / 'outbound' / name}")
    points = registered_points(root)
    for name in names:
        chapter = registry.get(name)
        if points.get(name) != chapter.points:
            raise CourseError(f"{name} is worth {points.get(name)} points in the gradebook and {chapter.points} in "
                              "autograder/registry.py")
    notes.append("gradebook: " + ", ".join(f"{n} ({points[n]:g} points)" for n in names))
    if roster:
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
            for s in roster:
                gb.update_or_create_student(s["id"], **{k: s[k] for k in STUDENT_COLUMNS[1:]})
        notes.append(f"gradebook: {len(roster)} student(s) from {students}")
    if kept:
        notes.append(f"kept as they were: {', '.join(kept)}")
    return notes


# --- collect ------------------------------------------------------------------------------------


def forged_submissions(inbound: Path, chapter: str) -> list[tuple[Path, str]]:
    """The entries of ``inbound`` for ``chapter`` whose name claims a student who does not own them."""
    forged = []
    for entry in sorted(inbound.glob(f"*+{chapter}+*")):
        claimed = entry.name.rsplit("+", 3)[0]
        st = entry.lstat()
        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = f"uid {st.st_uid}"
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            forged.append((entry, f"not a folder (claims {claimed}, owned by {owner})"))
        elif owner != claimed:
            forged.append((entry, f"claims {claimed} but is owned by {owner}"))
    return forged


def collect(root: Path, chapter: str) -> list[str]:
    """Set aside forged submissions of ``chapter`` (into ``root/quarantine/``), then ``nbgrader collect``."""
    root = Path(root).resolve()
    api = nbgrader_api(root)
    course_id = api.coursedir.course_id
    inbound = Path(api.exchange.ReleaseAssignment(coursedir=api.coursedir, parent=api).root) / course_id / "inbound"
    if not inbound.is_dir():
        raise CourseError(f"no {inbound}: release the chapters first (python -m autograder course init)")
    notes = []
    for entry, why in forged_submissions(inbound, chapter):
        quarantine = root / "quarantine"
        quarantine.mkdir(mode=0o700, exist_ok=True)
        shutil.move(str(entry), str(quarantine / entry.name))
        notes.append(f"set aside {entry.name}: {why} (moved to {quarantine / entry.name})")
    _check(api.collect(chapter, update=True), f"nbgrader collect {chapter}")
    submitted = sorted(p.name for p in (root / "submitted").glob(f"*/{chapter}") if p.is_dir())
    notes.append(f"collected {chapter}: {len(submitted)} submission(s) in {root / 'submitted'}")
    return notes


# --- feedback -----------------------------------------------------------------------------------


def feedback(root: Path, chapter: str, grades: Path) -> list[str]:
    """Feedback pages of ``chapter`` from ``grades`` into nbgrader's layout, then ``nbgrader release_feedback``."""
    from autograder import feedback as pages
    from autograder import record

    root = Path(root).resolve()
    # nbgrader's layout: <student>/<chapter>/<notebook>; a missing chapter's row names <student>/<chapter>.ipynb
    rows = [r for r in record.read_csv(Path(grades))
            if Path(r["notebook"]).parts[1:2] == (chapter,) or Path(r["notebook"]).name == f"{chapter}.ipynb"]
    released = 0
    for submission in sorted((root / "submitted").glob(f"*/{chapter}")):
        student = submission.parent.name
        mine = [r for r in rows if r["student"] == student]
        if not mine:
            continue
        out = root / "feedback" / student / chapter
        out.mkdir(parents=True, exist_ok=True)
        for name in ("timestamp.txt", "submission_secret.txt"):  # nbgrader's key to the learner's copy
            if (submission / name).is_file():
                shutil.copyfile(submission / name, out / name)
        record.atomic_write(out / f"{chapter}.html", pages.render(student, mine).encode())
        released += 1
    if not released:
        raise CourseError(f"{grades} has no row of a submission of {chapter} in {root / 'submitted'}: grade it first "
                          f"(python -m autograder grade submitted --chapter {chapter} ...)")
    _check(nbgrader_api(root).release_feedback(chapter), f"nbgrader release_feedback {chapter}")
    return [f"released feedback on {chapter} for {released} student(s); they fetch it from the Assignment List"]


# --- the command ----------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("init", help="make or update an nbgrader course directory (keeps submissions and grades)")
    p.add_argument("dir", type=Path, help="the course directory")
    p.add_argument("--course-id", required=True, help="the course's id (its folder in the exchange); your choice")
    p.add_argument("--students", type=Path, help="CSV with the columns id,first_name,last_name,email (id required)")
    p.add_argument("--exchange", type=Path, default=DEFAULT_EXCHANGE,
                   help=f"nbgrader's exchange folder, shared by every user (default {DEFAULT_EXCHANGE})")
    p.add_argument("--chapter", action="append", metavar="NN_name",
                   help="only this chapter (repeatable); default: every chapter")
    p = sub.add_parser("collect", help="nbgrader collect, after setting aside submissions under another's name")
    p.add_argument("dir", type=Path, help="the course directory")
    p.add_argument("chapter", choices=registry.ids())
    p = sub.add_parser("feedback", help="feedback pages from a grades CSV, released through nbgrader's exchange")
    p.add_argument("dir", type=Path, help="the course directory")
    p.add_argument("chapter", choices=registry.ids())
    p.add_argument("--grades", type=Path, required=True, help="the CSV written by python -m autograder grade")


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "init":
            notes = init(args.dir, args.course_id, args.exchange, args.students, args.chapter)
        elif args.action == "collect":
            notes = collect(args.dir, args.chapter)
        else:
            notes = feedback(args.dir, args.chapter, args.grades)
    except CourseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for note in notes:
        print(note)
    return 0
