"""``python -m autograder release``: regenerate the student release ``course/`` with nbgrader.

Every chapter ``autograder/source/NN_name/NN_name.ipynb`` goes through nbgrader's
``generate_assignment`` (solutions replaced by stubs, hidden tests removed,
outputs cleared, test cells locked) in a temporary nbgrader course directory with
its own gradebook; only ``course/NN_name/`` is written in the repository.
``--check`` regenerates into a temporary folder and fails if ``course/`` differs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

from autograder import registry

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_DIR = PACKAGE_DIR / "source"
COURSE_DIR = PACKAGE_DIR.parent / "course"
CONFIG_FILE = PACKAGE_DIR / "nbgrader_config.py"
CHAPTER_NAME = re.compile(r"^\d\d_[a-z0-9_]+$")


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


def ensure_scripts_on_path() -> None:
    """nbgrader's gradebook runs the ``alembic`` script by name: make the scripts of this
    interpreter's environment findable even when the virtualenv is not activated."""
    scripts = str(Path(sys.executable).parent)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")


def make_course_dir(course_root: Path, source_dir: Path = SOURCE_DIR, names: list[str] | None = None) -> list[str]:
    """Copy the chapters of ``source_dir`` into ``course_root/source/``; returns their names."""
    names = chapters(source_dir) if names is None else names
    for name in names:
        shutil.copytree(source_dir / name, course_root / "source" / name,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return names


def generate(out_dir: Path, source_dir: Path = SOURCE_DIR, names: list[str] | None = None) -> list[str]:
    """Write ``out_dir/NN_name/`` (the nbgrader release) for every chapter of ``source_dir`` (or ``names``)."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    ensure_scripts_on_path()
    with tempfile.TemporaryDirectory(prefix="tdd-nbgrader-") as tmp:
        root = Path(tmp)
        names = make_course_dir(root, source_dir, names)
        config = nbgrader_config(root)
        api = NbGraderAPI(CourseDirectory(config=config), config=config)
        for name in names:
            result = api.generate_assignment(name, force=True, create=True)
            if not result["success"]:
                raise RuntimeError(f"nbgrader generate_assignment failed for {name}:\n"
                                   f"{result.get('error', '')}\n{result.get('log', '')}")
            release = root / "release" / name
            target = out_dir / name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(release, target)
            notebook = target / f"{name}.ipynb"
            # One canonical serialisation, so that regenerating gives identical bytes.
            nbformat.write(nbformat.read(notebook, as_version=4), notebook)
    return names


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def differences(course_dir: Path = COURSE_DIR, source_dir: Path = SOURCE_DIR,
                names: list[str] | None = None) -> list[str]:
    """The files of ``course_dir`` that are not what nbgrader generates now (with the reason)."""
    problems = []
    every = names is None
    with tempfile.TemporaryDirectory(prefix="tdd-release-") as tmp:
        names = generate(Path(tmp), source_dir, names)
        for name in names:
            fresh, committed = _files(Path(tmp) / name), _files(course_dir / name) if (course_dir / name).is_dir() else {}
            for path in sorted(set(fresh) | set(committed)):
                if path not in committed:
                    problems.append(f"{course_dir.name}/{name}/{path}: missing")
                elif path not in fresh:
                    problems.append(f"{course_dir.name}/{name}/{path}: not generated from the source (stale)")
                elif fresh[path] != committed[path]:
                    problems.append(f"{course_dir.name}/{name}/{path}: differs from the source")
    if every and course_dir.is_dir():
        for p in sorted(course_dir.iterdir()):
            if p.is_dir() and CHAPTER_NAME.match(p.name) and p.name not in names:
                problems.append(f"{course_dir.name}/{p.name}: no chapter of that name in {source_dir}")
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
            print("course/ is out of date with autograder/source/ — run `make release`:", file=sys.stderr)
            for line in problems:
                print(f"  {line}", file=sys.stderr)
            return 1
        print(f"{course.name}/ is up to date ({len(names or available)} chapters)")
        return 0
    course.mkdir(parents=True, exist_ok=True)
    for name in generate(course, source, names):
        print(f"released {course.name}/{name}/{name}.ipynb")
    return 0
