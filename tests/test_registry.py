"""The chapter registry is the one source of truth: notebooks, checks, library and README agree with it."""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

import nbformat
import pytest

from autograder import registry
from autograder.checks.core import Check

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = registry.CHAPTERS
IDS = [c.id for c in CHAPTERS]


def test_registry_ids_are_unique_and_in_course_order():
    assert len(set(IDS)) == len(IDS)
    assert [c.number for c in CHAPTERS] == list(range(1, len(CHAPTERS) + 1))
    for c in CHAPTERS:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+", c.id), c.id
        assert 3 <= len(c.exercises) <= 7, f"{c.id}: 3-7 graded exercises per chapter"
        assert len({e.name for e in c.exercises}) == len(c.exercises)


def test_registry_answer_modules_belong_to_one_chapter():
    seen: dict[str, str] = {}
    for c in CHAPTERS:
        for module in c.answers:
            assert module not in seen, f"{module} is an answer module of both {seen[module]} and {c.id}"
            seen[module] = c.id
            importlib.import_module(module)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_registry_references_are_in_the_chapters_answer_modules(chapter):
    for ex in chapter.exercises:
        assert ex.module in chapter.answers, f"{ex.name}: {ex.reference} is not in {chapter.answers}"
        assert ex.load_reference() is not None
        assert 1 <= ex.points <= 3, f"{ex.name}: points must be 1-3"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_registry_checks_module_has_one_check_per_exercise(chapter):
    checks = chapter.load_checks()
    assert list(checks) == [e.name for e in chapter.exercises], (
        f"{chapter.checks}.CHECKS must list exactly the registry's exercises, in order")
    for name, check in checks.items():
        assert isinstance(check, Check) and check.name == name
        assert check.visible and check.hidden, f"{name}: needs visible and hidden cases"
    module = importlib.import_module(chapter.checks)
    assert callable(module.run)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_registry_points_equal_notebook_metadata(chapter):
    for path in (chapter.source_path(), chapter.release_path()):
        nb = nbformat.read(path, as_version=4)
        assert registry.notebook_problems(chapter, nb) == [], f"{path}: {registry.notebook_problems(chapter, nb)}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=IDS)
def test_registry_points_equal_readme_chapter_table(chapter):
    readme = (REPO / "README.md").read_text()
    line = next((l for l in readme.splitlines() if l.startswith("|") and f"`{chapter.id}`" in l), None)
    assert line, f"README.md's chapter table has no row for `{chapter.id}`"
    n = len(chapter.exercises)
    assert f"({n} exercises, {chapter.points} points)" in line, (
        f"README.md row of {chapter.id} must say ({n} exercises, {chapter.points} points): {line}")


def test_registry_knows_every_chapter_folder():
    for folder in (REPO / "autograder" / "source", REPO / "course"):
        for p in folder.iterdir():
            if p.is_dir() and re.fullmatch(r"\d\d_[a-z0-9_]+", p.name):
                assert p.name in IDS, f"{p} is a chapter folder missing from autograder/registry.py"


def test_registry_no_chapter_range_hard_coded():
    found = subprocess.run(["grep", "-rnE", r"0\[1-[0-9]\]", "tests", "autograder", "scripts"], cwd=REPO,
                           capture_output=True, text=True).stdout
    assert not found, f"derive chapters from autograder.registry, not a glob:\n{found}"


def test_registry_notebook_problems_names_the_mismatch():
    chapter = CHAPTERS[0]
    nb = nbformat.read(chapter.source_path(), as_version=4)
    first = chapter.exercises[0]
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade_id") == first.tests_id:
            meta["points"] = first.points + 1
    assert registry.notebook_problems(chapter, nb) == [
        f"{first.name}_tests is worth {first.points + 1} points in the notebook and {first.points} in the registry"]


def test_registry_lookup_errors_list_the_choices():
    with pytest.raises(ValueError, match="01_attention_by_hand"):
        registry.get("99_nothing")


def test_registry_notebook_problems_name_an_untagged_test_cell():
    """A graded test cell without ``raises-exception`` would stop Run All at an unsolved exercise
    where the source notebooks are released with plain nbgrader."""
    chapter = CHAPTERS[-1]
    nb = nbformat.read(chapter.source_path(), as_version=4)
    last = chapter.exercises[-1]
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == last.tests_id:
            cell.metadata["tags"].remove(registry.RUN_ALL_TAG)
    assert registry.notebook_problems(chapter, nb) == [
        f"{last.name}_tests is not tagged raises-exception (Run All would stop there)"]
