"""An untouched chapter says what is coming: at the top, what each exercise unlocks.

A cell that uses an exercise the learner has not done yet prints "(this cell uses your …)" (``uses_your``) and Run
All goes on. The chapter's first cell has a table, after "**What your exercises unlock.**", of the exercises such
cells use and the sections (``## N.`` headings) where they are: this test keeps that table equal to the notebook.
"""

from __future__ import annotations

import re

import nbformat
import pytest

from autograder import registry

MARK = "**What your exercises unlock.**"
# The chapters whose notebooks carry the table; any other chapter whose first cell has it is checked too.
WITH_TABLE = ("01_attention_by_hand", "02_multi_head_attention", "03_positional_encodings")
CHAPTERS = [c for c in registry.CHAPTERS if c.id in WITH_TABLE
            or c.release_path().is_file() and MARK in nbformat.read(c.release_path(), as_version=4).cells[0].source]


def used(nb: nbformat.NotebookNode) -> dict[str, set[int]]:
    """Exercise name -> the numbers of the sections whose cells use it through ``uses_your("a, b and c")``."""
    found: dict[str, set[int]] = {}
    section = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            numbers = re.findall(r"^## (\d+)\. ", cell.source, re.MULTILINE)
            section = int(numbers[-1]) if numbers else section
        elif "def uses_your" not in cell.source:
            for names in re.findall(r'uses_your\("([^"]+)"\)', cell.source):
                for name in re.split(r", | and ", names):
                    found.setdefault(name.strip(), set()).add(section)
    return found


def table(first: str) -> dict[str, set[int]]:
    """Exercise name -> the section numbers of its row in the first cell's table."""
    rows = first.split(MARK, 1)[1]
    found: dict[str, set[int]] = {}
    for names, sections in re.findall(r"^\| ((?:`\w+`(?:, )?)+) \| ((?:§\d+(?:, )?)+) \|", rows, re.MULTILINE):
        for name in re.findall(r"`(\w+)`", names):
            found.setdefault(name, set()).update(int(n) for n in re.findall(r"§(\d+)", sections))
    return found


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.id)
def test_chapter_top_says_what_each_exercise_unlocks(chapter):
    nb = nbformat.read(chapter.release_path(), as_version=4)
    first = nb.cells[0].source
    assert MARK in first, f"{chapter.id}: the first cell does not say what the exercises unlock"
    uses = used(nb)
    assert uses, f"{chapter.id}: no cell uses an exercise through uses_your(...)"
    assert set(uses) <= {ex.target for ex in chapter.exercises}, set(uses)
    assert table(first) == uses


def test_unlock_table_parser_reads_names_and_sections():
    first = f"intro\n\n{MARK} text\n\n| finish | then | see |\n|---|---|---|\n| `a` | §2 | x |\n| `b`, `c` | §3, §10 | y |\n"
    assert table(first) == {"a": {2}, "b": {3, 10}, "c": {3, 10}}
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("## 3. Three"),
                                         nbformat.v4.new_code_cell('with uses_your("b and c"):\n    pass'),
                                         nbformat.v4.new_markdown_cell("## Exercise 4 — d"),
                                         nbformat.v4.new_code_cell('with uses_your("a, b and c"):\n    pass')])
    assert used(nb) == {"a": {3}, "b": {3}, "c": {3}}
