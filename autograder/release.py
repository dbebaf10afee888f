"""``python -m autograder release``: regenerate the student release ``course/`` with nbgrader.

Every chapter ``autograder/source/NN_name/NN_name.ipynb`` goes through nbgrader's
``generate_assignment`` (solutions replaced by stubs, hidden tests removed,
outputs cleared, test cells locked) in a temporary nbgrader course directory with
its own gradebook; only ``course/NN_name/`` is written in the repository.
``--check`` regenerates into a temporary folder and fails if ``course/`` differs.

Two things are added to what nbgrader writes:

* every graded test cell is tagged with the registry's Run All tag (``registry.RUN_ALL_TAG``), so that JupyterLab's
  "Run All" goes on past an exercise that is not done yet (its test cell shows one
  red line) to the widgets and plots below; nbgrader still scores the cell 0, since
  it grades on the error in the cell's output, not on the tag;
* every release notebook carries its own fingerprint (notebook metadata
  ``course_release``), so that a notebook a learner changed — answers, outputs,
  added cells — is recognised. The release never replaces or deletes such a
  notebook without ``--force``, and ignores ``.ipynb_checkpoints`` folders.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from autograder import environment, registry

PACKAGE_DIR, SOURCE_DIR, COURSE_DIR = registry.PACKAGE_DIR, registry.SOURCE_DIR, registry.COURSE_DIR
CONFIG_FILE = PACKAGE_DIR / "nbgrader_config.py"
STAMP_KEY = "course_release"  # notebook metadata: {"fingerprint": ...} of the notebook as released
IGNORED = (".ipynb_checkpoints", "__pycache__")


class EditedNotebooks(Exception):
    """Notebooks with changes of their own (a learner's work) stand where the release would write or delete."""

    def __init__(self, paths: list[Path]):
        super().__init__(", ".join(map(str, paths)))
        self.paths = paths


def fingerprint(nb) -> str:
    """A hash of what a learner can change in a notebook: each cell's type, source and outputs."""
    cells = [[c.get("cell_type"), c.get("source", ""), c.get("outputs", []), c.get("execution_count")]
             for c in nb.get("cells", [])]
    return "sha256:" + hashlib.sha256(json.dumps(cells, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def stamped(nb):
    """``nb`` with its fingerprint recorded in its metadata."""
    nb = copy.deepcopy(nb)
    nb.metadata[STAMP_KEY] = {"fingerprint": fingerprint(nb)}
    return nb


def is_pristine(path: Path) -> bool:
    """Whether the notebook at ``path`` is exactly as a release (or a copy of one) wrote it.

    A notebook without a fingerprint (released before they existed) is pristine when git has
    it committed with the same cells.
    """
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001 — unreadable means "not ours to overwrite"
        return False
    recorded = nb.get("metadata", {}).get(STAMP_KEY)
    if isinstance(recorded, dict):
        return recorded.get("fingerprint") == fingerprint(nb)
    committed = _committed_notebook(path)
    return committed is not None and fingerprint(committed) == fingerprint(nb)


def _committed_notebook(path: Path):
    """The version of ``path`` in git's HEAD, or None (not in git, no git, unreadable)."""
    path = Path(path).resolve()
    try:
        out = subprocess.run(["git", "-C", str(path.parent), "show", f"HEAD:./{path.name}"],
                             capture_output=True, timeout=30)
        return nbformat.reads(out.stdout.decode(), as_version=4) if out.returncode == 0 else None
    except Exception:  # noqa: BLE001 — no git, or not a notebook: nothing to compare with
        return None


def is_ignored(relative: Path) -> bool:
    return any(part in IGNORED for part in relative.parts)


def tag_test_cells(nb) -> int:
    """Tag every graded test cell with the registry's Run All tag (a source notebook may lack it: plain nbgrader
    copies the tags it finds); returns how many cells were tagged."""
    tagged = 0
    for cell in nb.cells:
        if registry.is_test_cell(cell) and cell.cell_type == "code":
            tags = cell.metadata.setdefault("tags", [])
            if registry.RUN_ALL_TAG not in tags:
                tags.append(registry.RUN_ALL_TAG)
                tagged += 1
    return tagged


def chapters(source_dir: Path = SOURCE_DIR) -> list[str]:
    """The registry's chapters whose source notebook is in ``source_dir``, in course order."""
    return [c.id for c in registry.CHAPTERS if c.source_path(source_dir).is_file()]


def metadata_problems(source_dir: Path = SOURCE_DIR, names: list[str] | None = None) -> list[str]:
    """Where the source notebooks' nbgrader cells disagree with the registry (names, points, order)."""
    problems = []
    for name in chapters(source_dir) if names is None else names:
        nb = nbformat.read(registry.get(name).source_path(source_dir), as_version=4)
        problems += [f"{name}: {p}" for p in registry.notebook_problems(registry.get(name), nb)]
    return problems


def nbgrader_config(course_root: Path):
    """The course's nbgrader config (``autograder/nbgrader_config.py``) rooted at ``course_root``."""
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader(CONFIG_FILE.name, path=str(CONFIG_FILE.parent)).load_config()
    config.CourseDirectory.root = str(course_root)
    config.CourseDirectory.db_url = f"sqlite:///{course_root / 'gradebook.db'}"
    return config


def make_course_dir(course_root: Path, source_dir: Path = SOURCE_DIR, names: list[str] | None = None) -> list[str]:
    """Copy the chapters of ``source_dir`` into ``course_root/source/``; returns their names."""
    names = chapters(source_dir) if names is None else names
    for name in names:
        target = course_root / "source" / name
        shutil.copytree(source_dir / name, target, ignore=shutil.ignore_patterns(*IGNORED))
        notebook = target / f"{name}.ipynb"
        nb = nbformat.read(notebook, as_version=4)
        tag_test_cells(nb)
        nbformat.write(nb, notebook)
    return names


def _release_files(release: Path) -> set[Path]:
    return {p.relative_to(release) for p in release.rglob("*") if p.is_file() and not is_ignored(p.relative_to(release))}


def edited_notebooks(release: Path, target: Path) -> list[Path]:
    """The notebooks of ``target`` that writing ``release`` over it would replace although they have
    changes of their own (a learner's work)."""
    return [target / r for r in sorted(_release_files(release))
            if r.suffix == ".ipynb" and (target / r).is_file() and not is_pristine(target / r)]


def replace_folder(release: Path, target: Path, *, force: bool = False) -> None:
    """Make ``target`` hold ``release``'s files. Of the files the release no longer has, delete only
    release notebooks nobody changed (everything but checkpoints with ``force``)."""
    target.mkdir(parents=True, exist_ok=True)
    fresh = _release_files(release)
    for path in sorted(target.rglob("*"), reverse=True):
        relative = path.relative_to(target)
        if is_ignored(relative) or relative in fresh:
            continue
        if path.is_file() and (force or (path.suffix == ".ipynb" and is_pristine(path))):
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    for relative in sorted(fresh):
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(release / relative, target / relative)


def generate_in_course(root: Path, source_dir: Path = SOURCE_DIR, names: list[str] | None = None) -> list[str]:
    """nbgrader ``generate_assignment`` of the chapters of ``source_dir`` (or ``names``) in the nbgrader course
    directory ``root`` (its gradebook: ``root/gradebook.db``), each release notebook stamped in
    ``root/release/NN_name/``; returns the chapters' names."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    environment.for_nbgrader()  # nbgrader makes the course's gradebook
    names = make_course_dir(root, source_dir, names)
    config = nbgrader_config(root)
    api = NbGraderAPI(CourseDirectory(config=config), config=config)
    for name in names:
        result = api.generate_assignment(name, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader generate_assignment failed for {name}:\n"
                               f"{result.get('error', '')}\n{result.get('log', '')}")
        for notebook in (root / "release" / name).rglob("*.ipynb"):
            # One canonical serialisation, so that regenerating gives identical bytes.
            nbformat.write(stamped(nbformat.read(notebook, as_version=4)), notebook)
    return names


def generate(out_dir: Path, source_dir: Path = SOURCE_DIR, names: list[str] | None = None, *,
             force: bool = False) -> list[str]:
    """Write ``out_dir/NN_name/`` (the nbgrader release) for every chapter of ``source_dir`` (or ``names``).

    Raises :class:`EditedNotebooks` and writes nothing when a notebook of ``out_dir/NN_name/`` has changes
    of its own, unless ``force``: then those notebooks are overwritten or deleted like the others.
    """
    with tempfile.TemporaryDirectory(prefix="tdd-nbgrader-") as tmp:
        root = Path(tmp)
        names = generate_in_course(root, source_dir, names)
        edited = [] if force else [p for n in names for p in edited_notebooks(root / "release" / n, out_dir / n)]
        if edited:
            raise EditedNotebooks(edited)
        for name in names:
            replace_folder(root / "release" / name, out_dir / name, force=force)
    return names


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not is_ignored(p.relative_to(folder))}


EDITED = ("has changes of its own (a learner's answers or outputs?): the release keeps it; "
          "move your work to your work folder (`make lab` makes one), or discard it with `release --force`")


def differences(course_dir: Path = COURSE_DIR, source_dir: Path = SOURCE_DIR,
                names: list[str] | None = None) -> list[str]:
    """The files of ``course_dir`` that are not what nbgrader generates now (with the reason)."""
    with tempfile.TemporaryDirectory(prefix="tdd-release-") as tmp:
        generated = generate(Path(tmp), source_dir, names)
        problems = compare(Path(tmp), course_dir, generated)
    if names is None and course_dir.is_dir():
        for p in sorted(course_dir.iterdir()):
            if p.is_dir() and registry.CHAPTER_ID.match(p.name) and p.name not in generated:
                problems.append(f"{course_dir.name}/{p.name}: no chapter of that name in {source_dir}")
    return problems


def compare(fresh_dir: Path, course_dir: Path, names: list[str]) -> list[str]:
    """How the chapters ``names`` of ``course_dir`` differ from a fresh release in ``fresh_dir`` (with the reason)."""
    problems = []
    for name in names:
        fresh = _files(fresh_dir / name)
        committed = _files(course_dir / name) if (course_dir / name).is_dir() else {}
        for path in sorted(set(fresh) | set(committed)):
            where = f"{course_dir.name}/{name}/{path}"
            edited = path.endswith(".ipynb") and path in committed and not is_pristine(course_dir / name / path)
            if path not in committed:
                problems.append(f"{where}: missing")
            elif edited and fresh.get(path) != committed[path]:
                problems.append(f"{where}: {EDITED}")
            elif path not in fresh:
                problems.append(f"{where}: not generated from the source (stale)")
            elif fresh[path] != committed[path]:
                problems.append(f"{where}: differs from the source")
    return problems


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 listing the notebooks of course/ that differ from a fresh release")
    parser.add_argument("--source", type=Path, default=SOURCE_DIR,
                        help="folder of source chapters NN_name/NN_name.ipynb (default: autograder/source)")
    parser.add_argument("--course", type=Path, default=COURSE_DIR,
                        help="where the student release goes (default: course/)")
    parser.add_argument("--chapter", action="append", metavar="NN_name",
                        help="only this chapter (repeatable); default: every chapter of --source")
    parser.add_argument("--force", action="store_true",
                        help="also overwrite or delete release notebooks that were changed after their release "
                             "(a learner's answers and outputs are lost)")


def run(args: argparse.Namespace) -> int:
    source, course = Path(args.source), Path(args.course)
    available = chapters(source)
    if not available:
        print(f"error: no chapter NN_name/NN_name.ipynb found in {source}", file=sys.stderr)
        return 1
    unknown = sorted(set(args.chapter or ()) - set(available))
    if unknown:
        print(f"error: --chapter {', '.join(unknown)} not found in {source}; choose from {', '.join(available)}",
              file=sys.stderr)
        return 1
    names = args.chapter or None
    mismatch = metadata_problems(source, names)
    if mismatch:
        print("error: the source notebooks disagree with autograder/registry.py (fix the notebook or the registry):",
              file=sys.stderr)
        for line in mismatch:
            print(f"  {line}", file=sys.stderr)
        return 1
    if args.check:
        problems = differences(course, source, names)
        if problems:
            stale = [p for p in problems if EDITED not in p]
            print(f"{course.name}/ is not the release of {source.name}/"
                  + (" — run `make release`:" if stale else ":"), file=sys.stderr)
            for line in problems:
                print(f"  {line}", file=sys.stderr)
            return 1
        print(f"{course.name}/ is up to date ({len(names or available)} chapters)")
        return 0
    course.mkdir(parents=True, exist_ok=True)
    try:
        released = generate(course, source, names, force=args.force)
    except EditedNotebooks as err:
        print(f"error: nothing released: {len(err.paths)} notebook(s) have changes of their own, and the release "
              "would overwrite or delete them:", file=sys.stderr)
        for path in err.paths:
            print(f"  {path}", file=sys.stderr)
        print("Move that work to your work folder (`make lab` makes one and copies the chapters there), "
              "or discard it with `--force`.", file=sys.stderr)
        return 1
    for name in released:
        print(f"released {course.name}/{name}/{name}.ipynb")
    return 0
