"""The grader's identity: its version and a digest of every source that decides a verdict.

A plan records it, and a shard or a merge run by another grader refuses that plan in one line; a graded
notebook's saved result is keyed by it (:func:`autograder.engine.state_key`), so a grader whose verdicts may
differ grades every notebook again instead of reusing an old verdict.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path

from autograder import registry

DISTRIBUTION = "transformer-deep-dive"
PACKAGE_DIR = Path(__file__).resolve().parent


def grader_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _module_file(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    return Path(spec.origin) if spec is not None and spec.origin else None


def sources_digest(package_dir: Path | None = None) -> str:
    """sha256 over everything that decides a verdict: every ``autograder/*.py`` and ``autograder/checks/*.py``
    (checks, judging, runner, sandbox, registry), the chapters' reference modules and the chapters' released
    notebooks (their unchanged test cells and demos are skipped).

    Files are named by module or by path below the course, not by where they are, so the same
    sources installed anywhere give the same digest; two grader images that differ in any of
    them refuse each other's plans.
    """
    package_dir = PACKAGE_DIR if package_dir is None else Path(package_dir)
    files = {f"autograder.{p.stem}": p for p in package_dir.glob("*.py")}
    files |= {f"autograder.checks.{p.stem}": p for p in (package_dir / "checks").glob("*.py")}
    for chapter in registry.CHAPTERS:
        for module in chapter.answers:
            path = _module_file(module)
            if path is not None:
                files[module] = path
    course = package_dir.parent / "course"
    for chapter in registry.CHAPTERS:
        release = chapter.release_path(course)
        if release.is_file():
            files[f"course/{release.relative_to(course).as_posix()}"] = release
    digest = hashlib.sha256()
    for name in sorted(files):
        data = files[name].read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def identity() -> dict:
    return {"version": grader_version(), "sources": sources_digest()}


@functools.lru_cache(maxsize=1)
def grader_key() -> str:
    """A short name of this grader's version and sources, for keying saved results."""
    return hashlib.sha256(f"{grader_version()}\0{sources_digest()}".encode()).hexdigest()[:12]
