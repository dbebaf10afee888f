"""Grade one notebook: static checks and verdicts here, the learner's code in the sandboxed runner.

This module runs in the verdict process, where no learner code ever runs. It reads
the notebook with nbformat, matches its chapter by file name, flags delegation with
an AST pass over the learner's cells, sends the learner's cells to a sandboxed
:class:`autograder.sandbox.Runner`, builds every check's inputs here from fresh random
seeds, asks the runner only for the probe outputs (decoded with :func:`core.decode`,
never unpickled) and calls the judges.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import re
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import torch

from autograder import sandbox
from autograder.checks import core

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_DIR = PACKAGE_DIR / "source"
RELEASE_DIR = PACKAGE_DIR.parent / "course"
STATUSES = ("passed", "failed", "error", "timeout", "memory", "crashed", "missing", "invalid", "flagged")
_CHECKS_IMPORT = re.compile(r"from\s+autograder\.checks\s+import\s+(\w+)")


@dataclass
class Chapter:
    name: str  # "01_attention_by_hand"
    module: str  # the checks and solutions module: "attention"
    exercises: list[core.Exercise]  # graded exercises, in notebook order
    release_cells: dict[str, bool]  # source of each release code cell -> is it a test cell
    release_sources: set[str] = field(default_factory=set)


def load_chapters(source_dir: Path = SOURCE_DIR, release_dir: Path = RELEASE_DIR) -> dict[str, Chapter]:
    """The chapters whose source notebook and release exist, keyed by name."""
    chapters = {}
    if not Path(source_dir).is_dir():
        return chapters
    for folder in sorted(Path(source_dir).iterdir()):
        nb_path = folder / f"{folder.name}.ipynb"
        release_path = Path(release_dir) / folder.name / f"{folder.name}.ipynb"
        if not nb_path.is_file() or not release_path.is_file():
            continue
        nb = nbformat.read(nb_path, as_version=4)
        module, grade_ids = None, []
        for cell in nb.cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
                found = _CHECKS_IMPORT.search(cell.source)
                module = module or (found.group(1) if found else None)
                grade_ids.append(meta.get("grade_id", ""))
        if module is None:
            continue
        checks = importlib.import_module(f"autograder.checks.{module}")
        exercises = [checks.EXERCISES[g.removesuffix("_tests")] for g in grade_ids
                     if g.removesuffix("_tests") in checks.EXERCISES]
        release = nbformat.read(release_path, as_version=4)
        cells = {}
        for cell in release.cells:
            if cell.cell_type != "code":
                continue
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("solution"):
                continue
            cells[cell.source] = bool(meta.get("grade"))
        chapters[folder.name] = Chapter(folder.name, module, exercises, cells)
    return chapters


def chapter_of(path: Path, chapters: dict[str, Chapter]) -> Chapter | None:
    return chapters.get(Path(path).stem)


# --- static pass -------------------------------------------------------------------


def _defines(tree: ast.AST, name: str) -> bool:
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(t)):
                    return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
    return False


def _parse(source: str) -> ast.AST | None:
    lines = [("pass  # " + line) if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _solutions_imports(tree: ast.AST, module: str) -> tuple[set[str], bool]:
    """Names bound to the chapter's solutions module or its members, and whether it is imported at all."""
    names, imported = set(), False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == f"solutions.{module}" or a.name.startswith(f"solutions.{module}."):
                    imported = True
                    names.add(a.asname or "solutions")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == f"solutions.{module}" or node.module.startswith(f"solutions.{module}."):
                imported = True
                names.update(a.asname or a.name for a in node.names)
            elif node.module == "solutions":
                for a in node.names:
                    if a.name == module:
                        imported = True
                        names.add(a.asname or a.name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("__import__",):
            if any(isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("solutions")
                   for a in node.args):
                imported = True
    return names, imported


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside a type annotation (naming a class there is not calling it)."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                "isinstance", "issubclass") and len(node.args) == 2:
            roots.append(node.args[1])
    return {id(n) for root in roots for n in ast.walk(root)}


def _is_used_as_value(node: ast.AST, tree: ast.AST) -> bool:
    """Whether ``node`` is called, or bound/returned/passed (so that it can be called later)."""
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            if child is node:
                return not isinstance(parent, ast.Attribute)  # `F.softmax` inside `F.softmax.__doc__` etc.
    return True


def flag_reasons(exercise: core.Exercise, cells: list[str], module: str) -> str | None:
    """Why ``exercise`` counts as delegated, or None: static pass over the learner's code cells."""
    trees = [t for t in (_parse(c) for c in cells) if t is not None]
    bound: set[str] = set()
    for tree in trees:
        names, imported = _solutions_imports(tree, module)
        bound |= names
    forbidden_from: dict[str, str] = {}
    for tree in trees:  # names imported straight from a forbidden module: `from torch.nn.functional import softmax`
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    for mod, attr in exercise.forbidden:
                        if node.module == mod and a.name == attr:
                            forbidden_from[a.asname or a.name] = f"{mod}.{attr}"
    for tree in trees:
        if not _defines(tree, exercise.target):
            continue
        ignored = _annotation_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in ignored:
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names, imported = _solutions_imports(ast.Module(body=[node], type_ignores=[]), module)
                if imported:
                    return f"uses solutions.{module} instead of solving the exercise"
            if isinstance(node, ast.Name) and node.id in bound:
                return f"uses solutions.{module} ({node.id}) instead of solving the exercise"
            if isinstance(node, ast.Name) and node.id in forbidden_from and _is_used_as_value(node, tree):
                return f"delegates to {forbidden_from[node.id]}, the function the exercise asks you to write"
            if isinstance(node, ast.Attribute) and _is_used_as_value(node, tree):
                for mod, attr in exercise.forbidden:
                    if node.attr == attr and not mod.startswith("solutions"):
                        return f"delegates to {mod}.{attr}, the function the exercise asks you to write"
                    if mod.startswith("solutions") and node.attr == attr and "solutions" in ast.unparse(node.value):
                        return f"uses {mod}.{attr} instead of solving the exercise"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
                    "getattr", "__import__", "import_module", "eval", "exec"):
                for arg in ast.walk(node):
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        for mod, attr in exercise.forbidden:
                            if attr in arg.value and not mod.startswith("solutions"):
                                return f"delegates to {mod}.{attr} (by name), the function the exercise asks you to write"
                        if arg.value.startswith("solutions"):
                            return f"uses solutions.{module} instead of solving the exercise"
    return None


# --- grading -----------------------------------------------------------------------


def _row(exercise: core.Exercise | None, points: float, status: str, reason: str) -> dict:
    return {"exercise": exercise.name if exercise else "-", "points": points,
            "max_points": exercise.points if exercise else 0, "status": status, "reason": reason}


def _cells_to_run(nb, chapter: Chapter) -> list[tuple[int, str]]:
    """The learner's code cells that are run: all except release test cells and release demos left untouched."""
    run = []
    for i, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code" or not isinstance(cell.get("source"), str):
            continue
        src = cell.source
        if src in chapter.release_cells:
            if chapter.release_cells[src]:
                continue  # an unchanged test cell: verdicts never come from the notebook's own tests
            tree = _parse(src)
            keeps = tree is None or any(isinstance(n, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef))
                                        for n in getattr(tree, "body", [])) or "%" in src
            if not keeps:
                continue  # an unchanged demo: nothing a graded exercise can depend on
        run.append((i, src))
    return run


def _status_of_error(answer: dict) -> tuple[str, str]:
    kind, message = str(answer.get("type", "Error")), str(answer.get("error", ""))[:300]
    if kind == "Missing":
        return "missing", message
    if kind == "NotImplementedError":
        return "missing", "not implemented yet (still raises NotImplementedError)"
    if kind == "MemoryError" or "can't allocate memory" in message or "Cannot allocate memory" in message:
        return "memory", f"ran out of memory: {kind}: {message}"
    return "error", f"your code raised {kind}: {message}"


def grade_notebook(path: Path, chapters: dict[str, Chapter], *, level: str = "hidden",
                   limits: sandbox.Limits = sandbox.Limits(), hide: list[Path] = (),
                   isolation: str | None = None, unprivileged: bool = True) -> list[dict]:
    """Rows (exercise, points, max_points, status, reason) for the notebook at ``path``."""
    path = Path(path)
    chapter = chapter_of(path, chapters)
    if chapter is None:
        names = ", ".join(f"{n}.ipynb" for n in chapters)
        return [_row(None, 0, "invalid", f"unknown notebook name {path.name!r}; expected one of {names}")]
    raw = path.read_bytes()
    try:
        nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
        nbformat.validate(nb)
    except Exception as err:  # malformed JSON or not a notebook
        reason = f"the notebook is not valid ({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''})"
        return [_row(ex, 0, "invalid", reason) for ex in chapter.exercises]

    cells = _cells_to_run(nb, chapter)
    student_cells = [c.source for c in nb.cells if c.get("cell_type") == "code" and isinstance(c.get("source"), str)]
    flags = {ex.name: flag_reasons(ex, student_cells, chapter.module) for ex in chapter.exercises}
    owner = {}  # cell index -> exercises whose target the cell defines
    for i, src in cells:
        tree = _parse(src)
        for ex in chapter.exercises:
            if tree is not None and _defines(tree, ex.target):
                owner.setdefault(i, []).append(ex.name)

    scratch = Path(tempfile.mkdtemp(prefix="tdd-sandbox-"))
    results: dict[str, dict] = {}
    deadline = time.monotonic() + limits.notebook_seconds
    killed: dict[int, tuple[str, str]] = {}
    runner = sandbox.Runner(limits, scratch, hide=list(hide) + sandbox.hidden_paths(chapter.module),
                            unprivileged=unprivileged, **({"level": isolation} if isolation else {}))
    try:
        shutil.copyfile(path, scratch / path.name)

        def start() -> None:
            """(Re)start the runner and run every cell except the ones that killed it."""
            while True:
                try:
                    runner.start()
                    for i, src in cells:
                        if i in killed:
                            continue
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise sandbox.RunnerDied("timeout", "the notebook ran longer than its time limit")
                        try:
                            runner.request({"op": "cell", "source": src}, min(limits.cell_seconds, left))
                        except sandbox.RunnerDied as died:
                            if deadline - time.monotonic() <= 0:
                                raise
                            killed[i] = (died.kind, str(died))
                            break
                    else:
                        return
                except sandbox.RunnerDied:
                    if deadline - time.monotonic() <= 0:
                        raise
                    if not runner.proc and len(killed) > len(cells):
                        raise

        notebook_dead: tuple[str, str] | None = None
        try:
            start()
        except sandbox.RunnerDied as died:
            notebook_dead = (died.kind, str(died))
        for i, (kind, message) in killed.items():
            for name in owner.get(i, []):
                results[name] = _died_row(kind, f"the cell that defines it was stopped: {message}")
        for ex in chapter.exercises:
            if ex.name in results:
                continue
            if flags[ex.name]:
                results[ex.name] = {"points": 0, "status": "flagged", "reason": flags[ex.name]}
                continue
            if notebook_dead:
                results[ex.name] = _died_row(*notebook_dead)
                continue
            try:
                results[ex.name] = _judge_exercise(runner, ex, level, limits, deadline)
            except sandbox.RunnerDied as died:
                results[ex.name] = _died_row(died.kind, str(died))
                try:
                    start()
                except sandbox.RunnerDied as again:
                    notebook_dead = (again.kind, str(again))
    finally:
        runner.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return [{"exercise": ex.name, "max_points": ex.points, **results[ex.name]} for ex in chapter.exercises]


def _died_row(kind: str, message: str) -> dict:
    status = {"timeout": "timeout", "memory": "memory", "crashed": "crashed", "output": "error"}.get(kind, "crashed")
    return {"points": 0, "status": status, "reason": message}


def _judge_exercise(runner: sandbox.Runner, ex: core.Exercise, level: str, limits: sandbox.Limits,
                    deadline: float) -> dict:
    cases = ex.visible if level == "visible" else ex.visible + ex.hidden
    seeds = 1 if level == "visible" else 3
    for case in cases:
        for _ in range(seeds):
            seed = 0 if level == "visible" else secrets.randbits(62)
            inputs = case.inputs(torch.Generator().manual_seed(seed))
            left = deadline - time.monotonic()
            if left <= 0:
                raise sandbox.RunnerDied("timeout", "the notebook ran longer than its time limit")
            answer = runner.request({"op": "probe", "target": ex.target, "probe": case.probe,
                                     "inputs": core.encode(inputs)}, min(limits.cell_seconds, left))
            if not answer.get("ok"):
                status, reason = _status_of_error(answer)
                return {"points": 0, "status": status, "reason": f"{case.name}: {reason}"}
            try:
                outputs = core.decode(answer.get("outputs", ""))
                if not isinstance(outputs, dict):
                    raise ValueError("the probe did not return a dict")
            except ValueError as err:
                return {"points": 0, "status": "error", "reason": f"{case.name}: unreadable outputs ({err})"}
            try:
                case.judge(inputs, outputs)
            except core.CheckFailed as err:
                return {"points": 0, "status": "failed", "reason": f"{case.name}: {err}"}
            except Exception as err:  # the outputs were not what the judge could read: a wrong answer
                return {"points": 0, "status": "failed",
                        "reason": f"{case.name}: your output could not be checked ({type(err).__name__}: {err})"[:400]}
    return {"points": ex.points, "status": "passed", "reason": ""}


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
