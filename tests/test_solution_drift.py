"""Each solution region of a source notebook is the library's code (AST-identical, docstrings ignored).

Solution cells must define only functions/classes of the chapter's ``solutions``
module; read-only "given code" cells (locked, not graded) are compared too for
every definition that the module also has.
"""

from __future__ import annotations

import ast
import importlib
import inspect

import nbformat
import pytest

from autograder.release import SOURCE_DIR, chapters

SOLUTIONS_MODULE = {
    "01_attention_by_hand": "solutions.attention",
    "02_multi_head_attention": "solutions.multihead",
    "03_positional_encodings": "solutions.positional",
}
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def strip_docstrings(node: ast.AST) -> ast.AST:
    for child in ast.walk(node):
        body = getattr(child, "body", None)
        if isinstance(child, DEFINITIONS) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            child.body = body[1:] or [ast.Pass()]
    return node


def normalised(node: ast.AST) -> str:
    return ast.dump(strip_docstrings(node), include_attributes=False)


def library_definitions(module_name: str) -> dict[str, ast.AST]:
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    return {node.name: node for node in tree.body if isinstance(node, DEFINITIONS)}


def notebook_cells(chapter: str):
    nb = nbformat.read(SOURCE_DIR / chapter / f"{chapter}.ipynb", as_version=4)
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and (meta.get("solution") or (meta.get("locked") and not meta.get("grade"))):
            yield meta, cell.source


@pytest.mark.parametrize("chapter", chapters())
def test_solution_drift_chapter_has_module(chapter):
    assert chapter in SOLUTIONS_MODULE, f"add {chapter} -> its solutions module to SOLUTIONS_MODULE"


@pytest.mark.parametrize("chapter", [c for c in chapters() if c in SOLUTIONS_MODULE])
def test_solution_drift_regions_match_library(chapter):
    library = library_definitions(SOLUTIONS_MODULE[chapter])
    n_solutions = 0
    for meta, source in notebook_cells(chapter):
        grade_id = meta.get("grade_id")
        tree = ast.parse(source)  # the ### BEGIN/END SOLUTION markers are comments
        defs = [node for node in tree.body if isinstance(node, DEFINITIONS)]
        if meta.get("solution"):
            n_solutions += 1
            assert defs, f"{chapter}/{grade_id}: a solution cell must define the exercise's function or class"
            assert len(defs) == len(tree.body) - sum(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body), (
                f"{chapter}/{grade_id}: solution cells hold only definitions")
        for node in defs:
            if node.name not in library:
                assert not meta.get("solution"), (
                    f"{chapter}/{grade_id}: {node.name} is not in {SOLUTIONS_MODULE[chapter]}")
                continue
            assert normalised(node) == normalised(library[node.name]), (
                f"{chapter}/{grade_id}: {node.name} differs from {SOLUTIONS_MODULE[chapter]}.{node.name}; "
                "the solution region must be the library's code (copy one into the other)")
    assert n_solutions >= 3, f"{chapter}: 3-6 exercises expected, found {n_solutions} solution cells"
