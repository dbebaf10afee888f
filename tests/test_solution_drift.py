"""Each solution region of a source notebook is the library's code (AST-identical, docstrings ignored).

Solution cells must define only functions/classes of the chapter's answer modules
(:mod:`autograder.registry`); read-only "given code" cells (locked, not graded) are
compared too for every definition that one of those modules also has.
"""

from __future__ import annotations

import ast
import importlib
import inspect

import nbformat
import pytest

from autograder import registry

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


def library_definitions(modules: tuple[str, ...]) -> dict[str, tuple[str, ast.AST]]:
    """name -> (module, definition) over the chapter's answer modules."""
    found = {}
    for module_name in modules:
        tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
        for node in tree.body:
            if isinstance(node, DEFINITIONS):
                assert node.name not in found, f"{node.name} is defined in {found[node.name][0]} and {module_name}"
                found[node.name] = (module_name, node)
    return found


def notebook_cells(chapter: registry.Chapter):
    nb = nbformat.read(chapter.source_path(), as_version=4)
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and (meta.get("solution") or (meta.get("locked") and not meta.get("grade"))):
            yield meta, cell.source


@pytest.mark.parametrize("chapter", registry.CHAPTERS, ids=registry.ids())
def test_solution_drift_regions_match_library(chapter):
    library = library_definitions(chapter.answers)
    n_solutions = 0
    for meta, source in notebook_cells(chapter):
        grade_id = meta.get("grade_id")
        tree = ast.parse(source)  # the ### BEGIN/END SOLUTION markers are comments
        defs = [node for node in tree.body if isinstance(node, DEFINITIONS)]
        if meta.get("solution"):
            n_solutions += 1
            assert defs, f"{chapter.id}/{grade_id}: a solution cell must define the exercise's function or class"
            assert len(defs) == len(tree.body) - sum(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body), (
                f"{chapter.id}/{grade_id}: solution cells hold only definitions")
            exercise = chapter.exercise(grade_id.removesuffix("_solution"))
            assert exercise.target in [d.name for d in defs], (
                f"{chapter.id}/{grade_id}: the solution cell must define {exercise.target}")
        for node in defs:
            if node.name not in library:
                assert not meta.get("solution"), f"{chapter.id}/{grade_id}: {node.name} is not in {chapter.answers}"
                continue
            module, reference = library[node.name]
            assert normalised(node) == normalised(reference), (
                f"{chapter.id}/{grade_id}: {node.name} differs from {module}.{node.name}; "
                "the solution region must be the library's code (copy one into the other)")
    assert n_solutions == len(chapter.exercises), (
        f"{chapter.id}: {len(chapter.exercises)} exercises in the registry, {n_solutions} solution cells")
