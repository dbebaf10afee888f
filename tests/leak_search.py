"""What a learner can reach while a chapter is graded, tried against that chapter's hidden checks.

Used by tests/test_leaks.py (which says what it finds and what it cannot see). A chapter is graded while
its answers are withheld, and so are the answers of every chapter that needs it (the registry's
``needs``: such a chapter cannot open before it). Everything else may be out already, whatever the
due dates, so for chapter C the search takes the most a learner can have then:

* **notebooks**: every release notebook (``course/``) of a chapter that does not need C, and
  ``00_start_here.ipynb``: the top-level definitions of their cells outside the solution cells, run with
  the notebook's imports in one namespace per notebook (no kernel); and each bug hunt's definitions
  again with the fix its folded answer gives (``FIXES`` of tests/test_bug_hunts.py);
* **C's own notebook on a learner's finished answers** (the source notebook's solution cells): its given
  definitions, and its bug hunts' with their fixes, again with C's *other* exercises done (given code that
  composes them into this exercise's answer); and a given class that subclasses an exercise's class, on the
  finished class, when it overrides a method the stub leaves to write (given code that holds part of an
  answer, such as a ``forward``, and needs only the learner's constructor);
* **the edition**: every module of ``autograder`` and ``solutions`` as ``autograder publish`` writes it
  for an edition withholding C and its dependents (checks with their hidden cases removed and, where
  they need a withheld module, their ``@core.recorded`` functions emptied and replayed from the
  recordings; withheld library modules are not importable), except the grader's commands
  (:data:`COMMANDS`) — module-level functions and classes defined there, and the static and class methods
  of those classes.

Each candidate whose signature fits an exercise of C is judged by that exercise's hidden checks (every
case, three fresh seeds, in this process as tests/test_mutants.py does), with the no-delegation guard
watching the withheld modules as in the grader. A candidate that passes is a leak; one that passes every case
but those in which the reference itself raises an error (the checks of bad input) is a near leak: an answer
but for its ``ValueError`` s. And each function of one argument of the edition's checks modules is called as
the checks call their helpers, with a case's inputs: one that returns the reference's output for every hidden
case and seed is a leak too (the checks' code computing an answer, such as an expected size).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import functools
import importlib
import inspect
import io
import math
import os
import signal
import sys
import tempfile
import time
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import nbformat
import torch

from autograder import publish, registry
from autograder.checks import core

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "course"
START_HERE = COURSE / publish.START_HERE
# The grader's hidden checks run on fresh seeds; this one no notebook's hidden test uses.
SEED = 31_337
# CPU seconds for one candidate on one exercise; one that runs longer is tried again with three times what the
# reference takes (the hidden checks of DecoderLayer take the reference about 13 s), then reported as cut.
TIME_LIMIT = 10.0
# Modules of the edition whose functions are the grader's and the course's commands: they take folders,
# files, argv and processes, and calling them starts processes or writes files (grading, publishing,
# the sandbox, Jupyter's config). tests/test_leaks.py checks that none defines a function of an exercise's name
# and parameters.
COMMANDS = frozenset({
    "autograder.__main__", "autograder.feedback", "autograder.grade", "autograder.gradebook",
    "autograder.kernel_client", "autograder.merge", "autograder.nbgrader_config", "autograder.plan",
    "autograder.publish", "autograder.record", "autograder.release", "autograder.runner", "autograder.sandbox",
    "autograder.selfcheck", "autograder.shard", "autograder.submissions", "autograder.verdict",
    "autograder.workspace", "autograder.course", "autograder.engine", "autograder.environment",
    "autograder.identity", "autograder.limits", "autograder.lockdown", "autograder.protocol", "autograder.results",
})


class TooSlow(BaseException):
    """A candidate ran past TIME_LIMIT (a BaseException: the probe's own `except Exception` lets it through)."""


@dataclass(frozen=True)
class Candidate:
    label: str  # where a learner finds it: "course/04_…ipynb: DecoderCache (cell ch4-014)"
    obj: Any


@dataclass(frozen=True)
class Leak:
    exercise: str  # "06_kv_cache_inference:KVCache"
    candidate: str  # its label


@dataclass
class Found:
    leaks: list[Leak] = dataclasses.field(default_factory=list)
    # answers but for their input checks: they pass every hidden case in which the reference raises no error
    near: list[Leak] = dataclasses.field(default_factory=list)
    cut: list[str] = dataclasses.field(default_factory=list)  # "exercise: candidate" run past TIME_LIMIT
    skipped: list[str] = dataclasses.field(default_factory=list)  # notebook statements that could not run
    tried: int = 0  # candidate × exercise pairs judged
    candidates: int = 0


# --- what is released while a chapter is graded ---------------------------------------------


def withheld_chapters(chapter_id: str) -> set[str]:
    """The chapters whose answers are withheld, at the least, while ``chapter_id`` is graded."""
    return {chapter_id, *registry.dependents(chapter_id)}


@functools.cache
def withheld_modules(chapter_id: str) -> dict[str, str]:
    """The library modules an edition withholds while ``chapter_id`` is graded and every other chapter's
    answers are released."""
    return publish.withheld_modules(set(registry.ids()) - withheld_chapters(chapter_id))


def open_notebooks(chapter_id: str) -> list[tuple[str | None, Path]]:
    """(chapter id or None, path) of the notebooks a learner may have while ``chapter_id`` is graded."""
    closed = set(registry.dependents(chapter_id))
    return [(None, START_HERE)] + [(c.id, c.release_path()) for c in registry.CHAPTERS
                                   if c.id not in closed and c.release_path().is_file()]


# --- candidates from a notebook --------------------------------------------------------------


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _code(cell) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in cell.source.splitlines())


def _imports(tree: ast.Module) -> list[ast.stmt]:
    """The import statements of a cell, outside functions and classes."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo[:0] = [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]
    return found


def _no_call(node: ast.AST) -> bool:
    return not any(isinstance(n, ast.Call) for n in ast.walk(node))


def _definitions(tree: ast.Module) -> list[ast.stmt]:
    """A cell's top-level functions and classes, and the assignments that compute nothing (constants,
    lambdas): what a given function may read when it is called."""
    return [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            or isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None and _no_call(n.value)]


def _changed(before: str, after: str) -> list[ast.stmt]:
    """The definitions of the cell ``after`` that differ from those of ``before`` (a bug hunt and its fix)."""
    old = {ast.dump(n) for n in _definitions(ast.parse(before))}
    return [n for n in _definitions(ast.parse(after)) if ast.dump(n) not in old]


def _run(statements: list[ast.stmt], namespace: dict, where: str, skipped: list[str]) -> list[str]:
    """Run each statement in ``namespace``; the names of the functions and classes defined."""
    defined = []
    for node in statements:
        try:
            with _quiet():
                exec(compile(ast.Module([node], []), where, "exec"), namespace)  # noqa: S102
        except Exception as err:  # noqa: BLE001 — e.g. an import of a withheld module: nothing reachable
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):  # a constant of a demo: its names come later
                skipped.append(f"{where}: line {node.lineno}: {type(err).__name__}: {str(err)[:120]}")
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.append(node.name)
    return defined


def _bug_fixes() -> dict[str, dict[str, list[tuple[str, str]]]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        return importlib.import_module("test_bug_hunts").FIXES
    finally:
        sys.path.pop(0)


_NOTEBOOKS: dict[Path, tuple[list[Candidate], list[str]]] = {}


def notebook_candidates(path: Path, skipped: list[str],
                        fixes: dict[str, list[tuple[str, str]]] | None = None) -> list[Candidate]:
    """The functions and classes a notebook defines outside its solution cells, run with its imports (no
    kernel), and each bug hunt's with its fix (``fixes``: marker -> [(old, new)]). Made once per notebook."""
    if path not in _NOTEBOOKS:
        problems: list[str] = []
        _NOTEBOOKS[path] = (_notebook_candidates(path, problems, fixes or {}), problems)
    found, problems = _NOTEBOOKS[path]
    skipped += problems
    return found


def _notebook_candidates(path: Path, skipped: list[str], fixes: dict[str, list[tuple[str, str]]]) -> list[Candidate]:
    nb = nbformat.read(path, as_version=4)
    name = f"_reachable_{path.stem}"
    module = types.ModuleType(name)  # a dataclass looks its module up in sys.modules
    sys.modules[name] = module
    namespace = module.__dict__
    relative = _shown(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    trees = []
    for cell in code:
        try:
            trees.append((cell, ast.parse(_code(cell))))
        except SyntaxError:
            skipped.append(f"{relative}: cell {cell.get('id')}: syntax error")
    for cell, tree in trees:
        _run(_imports(tree), namespace, f"{relative} cell {cell.get('id')}", skipped)
    found = []
    for cell, tree in trees:  # the stubs are defined too (given code may use them) but are no candidates
        where = f"{relative} cell {cell.get('id')}"
        stub = cell.metadata.get("nbgrader", {}).get("solution", False)
        for defined in _run(_definitions(tree), namespace, where, skipped):
            if not stub:
                found.append(Candidate(f"{relative}: {defined} (cell {cell.get('id')})", namespace[defined]))
    cells = [c for c, _ in trees if not c.metadata.get("nbgrader", {}).get("solution")]
    for marker, fix in fixes.items():
        hunt = [c for c in cells if marker in c.source and "verdict(" in c.source]
        if len(hunt) != 1 or not all(old in hunt[0].source for old, _ in fix):
            continue  # tests/test_bug_hunts.py says why
        source = hunt[0].source
        for old, new in fix:
            source = source.replace(old, new)
        fixed = dict(namespace)
        where = f"{relative} cell {hunt[0].get('id')}, fixed"
        for defined in _run(_changed(_code(hunt[0]), source), fixed, where, skipped):
            found.append(Candidate(f"{relative}: {defined} with the fix its folded answer gives (cell "
                                   f"{hunt[0].get('id')})", fixed[defined]))
    return found


def _finished_cells(chapter: registry.Chapter) -> dict[str, str]:
    """grade id -> the code of each solution cell of the source notebook, markers removed: a learner's finished
    answers (tests/test_solution_drift.py keeps them equal to the library's code)."""
    nb = nbformat.read(chapter.source_path(), as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: "\n".join(
        line for line in c.source.splitlines() if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))
        for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")}


def _stub_methods(source: str, name: str) -> set[str]:
    """The methods of class ``name`` in a release solution cell that still raise NotImplementedError."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {f.name for f in node.body if isinstance(f, ast.FunctionDef) and any(
                isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n) for n in ast.walk(f))}
    return set()


def _bases(node: ast.stmt) -> set[str]:
    return {ast.unparse(b) for b in node.bases} if isinstance(node, ast.ClassDef) else set()


def own_candidates(chapter: registry.Chapter, skipped: list[str],
                   fixes: dict[str, list[tuple[str, str]]]) -> dict[str, list[Candidate]]:
    """Exercise name -> the given code of ``chapter``'s own notebook run on a learner's finished answers:

    * every given definition (and each bug hunt's with its fix) in a namespace where the chapter's *other*
      exercises are finished and this one is still the stub: given code that, with the learner's other
      answers, computes this exercise's answer;
    * every given class that subclasses this exercise's class, on the finished class, when it overrides a
      method the stub leaves to write: given code that holds part of the answer (a forward) and needs only
      the learner's rest (the constructor)."""
    path = chapter.release_path()
    if not path.is_file():
        return {}
    nb = nbformat.read(path, as_version=4)
    relative = _shown(path)
    finished = _finished_cells(chapter)
    code = []
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        try:
            code.append((cell, ast.parse(_code(cell))))
        except SyntaxError:
            continue
    given = [(cell, tree) for cell, tree in code if not cell.metadata.get("nbgrader", {}).get("solution")]
    fixed = []
    for marker, fix in fixes.items():
        hunt = [cell for cell, _ in given if marker in cell.source and "verdict(" in cell.source]
        if len(hunt) == 1 and all(old in hunt[0].source for old, _ in fix):
            source = hunt[0].source
            for old, new in fix:
                source = source.replace(old, new)
            fixed.append((hunt[0], ast.Module(_changed(_code(hunt[0]), source), [])))

    def namespace(stubbed: str | None) -> dict:
        module = types.ModuleType(f"_finished_{chapter.id}_{stubbed}")
        sys.modules[module.__name__] = module
        ns = module.__dict__
        for cell, tree in code:
            _run(_imports(tree), ns, f"{relative} cell {cell.get('id')}", [])
        for cell, tree in code:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
            if cell.metadata.get("nbgrader", {}).get("solution") and grade_id != f"{stubbed}_solution":
                tree = ast.parse(finished.get(grade_id, _code(cell)))
            _run(_definitions(tree), ns, f"{relative} cell {cell.get('id')}", [])
        return ns

    found: dict[str, list[Candidate]] = {}
    complete = namespace(None)
    for exercise in chapter.exercises:
        ns = namespace(exercise.name)
        stub = next((_code(cell) for cell, _ in code
                     if cell.metadata.get("nbgrader", {}).get("grade_id") == f"{exercise.name}_solution"), "")
        to_write = _stub_methods(stub, exercise.target)
        for (cell, tree), how in [*((g, "") for g in given), *((f, " with the fix its folded answer gives") for f in fixed)]:
            where, scope = f"{relative} cell {cell.get('id')}", dict(ns)
            defined = _run(_definitions(tree), scope, where, [])
            found.setdefault(exercise.name, []).extend(
                Candidate(f"{relative}: {d}{how}, with the chapter's other exercises done (cell {cell.get('id')})",
                          scope[d]) for d in defined)
            for node in tree.body:
                overrides = {f.name for f in getattr(node, "body", []) if isinstance(f, ast.FunctionDef)}
                if exercise.target in _bases(node) and overrides & to_write:
                    rebased = dict(complete)
                    if _run([node], rebased, where, skipped):
                        found[exercise.name].append(Candidate(
                            f"{relative}: {node.name}{how}, on a finished {exercise.target} (it gives "
                            f"{', '.join(sorted(overrides & to_write))}; cell {cell.get('id')})", rebased[node.name]))
    return found


# --- candidates from the edition ---------------------------------------------------------------


_CHECKS_MODULES: dict[tuple[str, frozenset], types.ModuleType] = {}  # (checks module, withheld it needs) -> loaded


@functools.cache
def _references(chapter: registry.Chapter) -> frozenset[str]:
    return frozenset(publish.reference_modules((ROOT / Path(*chapter.checks.split("."))).with_suffix(".py").read_text()))


@functools.cache
def _edition_source(chapter: registry.Chapter, replayed: bool) -> str:
    withheld = _references(chapter) if replayed else frozenset()
    return publish.edition_checks_source(chapter, withheld, ROOT, _imported_names())


@functools.cache
def _imported_names() -> frozenset[str]:
    return frozenset(publish.checks_imported_names(ROOT))


def _edition_checks(chapter: registry.Chapter, withheld: dict[str, str], recordings: Path | None) -> types.ModuleType:
    """``chapter``'s checks module loaded from the source an edition withholding ``withheld`` writes (its hidden
    cases removed; its recorded functions emptied and replayed from ``recordings`` where it needs a withheld
    module), under a name of its own."""
    needs = _references(chapter) & set(withheld)
    key = (chapter.checks, needs)
    if key not in _CHECKS_MODULES:
        path = (ROOT / Path(*chapter.checks.split("."))).with_suffix(".py")
        alias = f"_edition_{chapter.checks.replace('.', '_')}_{len(_CHECKS_MODULES)}"
        module = types.ModuleType(alias)
        module.__file__ = str(path)
        sys.modules[alias] = module
        exec(compile(_edition_source(chapter, bool(needs)), str(path), "exec"), module.__dict__)  # noqa: S102
        if needs:
            for attr, value in list(vars(module).items()):  # as core.reference gives them in the edition
                if isinstance(value, types.ModuleType) and value.__name__ in needs:
                    setattr(module, attr, core.Withheld(value.__name__))
            table = recordings / core.recording_path(chapter.checks).name if recordings is not None else None
            core._recordings[alias] = torch.load(table, weights_only=True) if table and table.is_file() else {}
        _CHECKS_MODULES[key] = module
    return _CHECKS_MODULES[key]


def edition_modules(withheld: dict[str, str], recordings: Path | None = None) -> dict[str, types.ModuleType]:
    """Every module of ``autograder`` and ``solutions`` an edition withholding ``withheld`` holds, loaded as
    it holds it: the library's released modules and the grader's are this repository's (the edition copies
    them unchanged), each chapter's checks module is loaded from the source the edition writes
    (:func:`_edition_checks`). Withheld modules and :data:`COMMANDS` are left out."""
    loaded = {}
    checks = {c.checks: c for c in registry.CHAPTERS}
    for path in sorted([*(ROOT / "autograder").rglob("*.py"), *(ROOT / "solutions").rglob("*.py")]):
        if publish.SKIPPED_PARTS & set(path.parts) or "source" in path.relative_to(ROOT).parts:
            continue
        name = publish.module_name(path, ROOT)
        if name in withheld or name in COMMANDS:
            continue
        loaded[name] = (_edition_checks(checks[name], withheld, recordings) if name in checks
                        else importlib.import_module(name))
    return loaded


def _one_argument(fn: Any) -> bool:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    required = [p for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return len(required) == 1 and required[0].kind in (required[0].POSITIONAL_ONLY, required[0].POSITIONAL_OR_KEYWORD)


def module_candidates(name: str, module: types.ModuleType) -> list[Candidate]:
    """The functions and classes ``module`` defines, and the static and class methods of those classes."""
    found = []
    for attr, obj in sorted(vars(module).items()):
        if not (inspect.isfunction(obj) or inspect.isclass(obj)) or getattr(obj, "__module__", None) != module.__name__:
            continue
        found.append(Candidate(f"{name}.{attr}", obj))
        if inspect.isclass(obj):
            for method, raw in sorted(vars(obj).items()):
                if isinstance(raw, (staticmethod, classmethod)):
                    found.append(Candidate(f"{name}.{attr}.{method}", getattr(obj, method)))
    return found


# --- judging -------------------------------------------------------------------------------------


def fits(candidate: Any, reference: Any) -> bool:
    """Whether ``candidate`` can be called as ``reference`` must be: with the reference's required positional
    arguments (by position) and required keyword-only ones (by name), and needing no other. The checks call
    the object at least that way (the reference passes them), so a candidate that does not fit raises a
    TypeError at their first call: leaving it out loses nothing."""
    try:
        wanted, offered = inspect.signature(reference), inspect.signature(candidate)
    except (TypeError, ValueError):
        return True  # cannot tell: try it
    positional = [p for p in wanted.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    keywords = {p.name: None for p in wanted.parameters.values() if p.kind == p.KEYWORD_ONLY and p.default is p.empty}
    try:
        offered.bind(*[None] * len(positional), **keywords)
    except TypeError:
        return False
    return True


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def stop(signum, frame):
        raise TooSlow()

    previous = signal.signal(signal.SIGPROF, stop)
    signal.setitimer(signal.ITIMER_PROF, seconds)  # CPU time: the same on a busy machine as on a quiet one
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _memoized(check: core.Check) -> core.Check:
    """``check`` with each case's inputs built once per seed (probes receive a decoded copy, never these)."""
    def memo(case: core.Case) -> core.Case:
        built: dict[int, dict] = {}

        def inputs(gen: torch.Generator) -> dict:
            seed = gen.initial_seed()
            if seed not in built:
                built[seed] = case.inputs(gen)
            return built[seed]

        return dataclasses.replace(case, inputs=inputs)

    return dataclasses.replace(check, visible=tuple(map(memo, check.visible)), hidden=tuple(map(memo, check.hidden)))


def judge(check: core.Check, obj: Any, answer_files: tuple[str, ...], limit: float = TIME_LIMIT) -> core.Verdict:
    """``obj`` against every case of ``check`` at the hidden level (three seeds), as the grader judges; TooSlow
    past ``limit`` CPU seconds."""
    probe = core.local_probe(obj, check.forbidden, answer_files)
    state = torch.get_default_dtype(), torch.is_grad_enabled()
    try:
        with _quiet(), _time_limit(limit):
            return core.judge_check(check, probe, core.notebook_seeds("hidden", SEED), level="hidden")
    finally:
        torch.set_default_dtype(state[0])
        torch.set_grad_enabled(state[1])


class Trial:
    """One exercise's hidden checks, to judge candidates with: :meth:`outcome` says "leak" (it passes), "near" (it
    passes every case in which the reference raises no error: an answer but for its checks of bad input), "cut"
    (it ran past the time limit) or None."""

    def __init__(self, check: core.Check, reference: Any, answer_files: tuple[str, ...]):
        self.check, self.reference, self.answer_files = check, reference, answer_files
        self.limits: dict[str, float] = {}
        self._errors: list[str] | None = None
        self._expected: dict[tuple[str, int], Any] = {}

    @property
    def errors(self) -> list[str]:
        """The names of the cases in which the reference's outputs hold an error it raised (measured once)."""
        if self._errors is None:
            self._errors = _error_cases(self.check, self.reference)
        return self._errors

    def expected(self, case: core.Case, seed: int) -> Any:
        """The reference's ``out`` for the case at ``seed`` (None when its probe gives no ``out``)."""
        key = (case.name, seed)
        if key not in self._expected:
            try:
                with _quiet():
                    outputs = core.local_probe(self.reference, self.check.forbidden)(
                        case, case.inputs(torch.Generator().manual_seed(seed))).outputs
                self._expected[key] = outputs.get("out")
            except core.ProbeError:
                self._expected[key] = None
        return self._expected[key]

    def computes_answer(self, fn: Any) -> bool | None:
        """Whether ``fn``, called with a case's inputs (as a checks module calls its helpers), returns the reference's
        output for them, for every hidden case and seed whose probe gives one (three or more, with two different
        answers among them); None when it ran past the time limit."""
        compared, answers = 0, set()
        try:
            with _quiet(), _time_limit(TIME_LIMIT):
                for case in self.check.cases("hidden"):
                    for seed in core.notebook_seeds("hidden", SEED)(case):
                        expected = self.expected(case, seed)
                        if expected is None:
                            continue
                        try:
                            got = fn(copy.deepcopy(case.inputs(torch.Generator().manual_seed(seed))))
                        except Exception:  # noqa: BLE001 — not a function of these inputs
                            return False
                        if not _same_value(got, expected):
                            return False
                        compared += 1
                        answers.add(repr(expected)[:200])
        except TooSlow:
            return None
        return compared >= 3 and len(answers) >= 2

    def outcome(self, obj: Any) -> str | None:
        verdict = self._judged(self.check, obj)
        if verdict is None:
            return "cut"
        if verdict.passed:
            return "leak"
        if verdict.status == "failed" and any(verdict.reason.startswith(f"{name}: ") for name in self.errors):
            rest = dataclasses.replace(self.check, visible=tuple(c for c in self.check.visible if c.name not in self.errors),
                                       hidden=tuple(c for c in self.check.hidden if c.name not in self.errors))
            again = self._judged(rest, obj)
            if again is not None and again.passed:
                return "near"
        return None

    def _judged(self, check: core.Check, obj: Any) -> core.Verdict | None:
        """:func:`judge`, tried again with three times what the reference takes when it runs past TIME_LIMIT
        (measured once per set of cases, when needed); None when it runs past that too."""
        try:
            return judge(check, obj, self.answer_files)
        except TooSlow:
            key = ",".join(c.name for c in check.cases("hidden"))
            if key not in self.limits:
                start = time.process_time()
                judge(check, self.reference, (), limit=600)
                self.limits[key] = TIME_LIMIT + 3 * (time.process_time() - start)
            try:
                return judge(check, obj, self.answer_files, limit=self.limits[key])
            except TooSlow:
                return None


def _same_value(got: Any, expected: Any) -> bool:
    """``got`` is ``expected``: tensors of the same shape and kind of dtype with close values, equal numbers, the
    same containers of such."""
    if isinstance(expected, torch.Tensor):
        return (isinstance(got, torch.Tensor) and got.shape == expected.shape
                and got.is_floating_point() == expected.is_floating_point() and (got.dtype == torch.bool) == (
                    expected.dtype == torch.bool)
                and torch.allclose(got.detach().double(), expected.detach().double(), rtol=1e-4, atol=1e-5))
    if isinstance(expected, bool) or isinstance(got, bool):
        return got is expected
    if isinstance(expected, (int, float)):
        return isinstance(got, (int, float)) and math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(expected, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(expected) and all(
            _same_value(g, e) for g, e in zip(got, expected))
    if isinstance(expected, dict):
        return isinstance(got, dict) and got.keys() == expected.keys() and all(
            _same_value(got[k], expected[k]) for k in expected)
    return got == expected


def _has_error(value: Any) -> bool:
    if isinstance(value, dict):
        if set(value) == {"type", "message"} and str(value["type"]).endswith("Error"):
            return True
        return any(_has_error(v) for v in value.values())
    return isinstance(value, (list, tuple)) and any(_has_error(v) for v in value)


def _error_cases(check: core.Check, reference: Any) -> list[str]:
    """The names of the cases in which the reference's outputs hold an error it raised: the checks of bad input."""
    found = []
    for case in check.cases("hidden"):
        for seed in core.notebook_seeds("hidden", SEED)(case):
            try:
                with _quiet():
                    outputs = core.local_probe(reference, check.forbidden)(case, case.inputs(
                        torch.Generator().manual_seed(seed))).outputs
            except core.ProbeError:
                continue
            if _has_error(outputs):
                found.append(case.name)
                break
    return found


def candidates_for(chapter_id: str, recordings: Path | None, skipped: list[str]) -> list[Candidate]:
    """Everything a learner can reach while ``chapter_id`` is graded (see the module docstring)."""
    fixes = _bug_fixes()
    found = []
    for notebook_chapter, path in open_notebooks(chapter_id):
        found += notebook_candidates(path, skipped, fixes.get(notebook_chapter or "", {}))
    for name, module in edition_modules(withheld_modules(chapter_id), recordings).items():
        found += module_candidates(name, module)
    unique, seen = [], set()
    for candidate in found:  # a class of a module is also reached through the modules that import it
        if id(candidate.obj) not in seen:
            seen.add(id(candidate.obj))
            unique.append(candidate)
    return unique


def search(chapter_id: str, recordings: Path | None = None,
           only: Callable[[Candidate], bool] = lambda c: True) -> Found:
    """Try every candidate reachable while ``chapter_id`` is graded against its exercises' hidden checks."""
    chapter = registry.get(chapter_id)
    found = Found()
    answer_files = tuple(str(path) for module, path in publish._library_modules(ROOT).items()
                         if module in withheld_modules(chapter_id))
    previous, threads, backend = os.getcwd(), torch.get_num_threads(), os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"  # a given plotting function called here opens no window
    torch.set_num_threads(1)  # the checks use tiny tensors
    scratch = tempfile.TemporaryDirectory(prefix="tdd-leak-search-")
    try:
        os.chdir(scratch.name)  # what a candidate writes lands there
        candidates = [c for c in candidates_for(chapter_id, recordings, found.skipped) if only(c)]
        own = {name: [c for c in found_own if only(c)] for name, found_own in
               own_candidates(chapter, found.skipped, _bug_fixes().get(chapter_id, {})).items()}
        # the checks modules' functions of one argument, as the checks call them: with a case's inputs
        helpers = [Candidate(f"{c.label}, called with a case's inputs", c.obj) for c in candidates
                   if c.label.startswith("autograder.checks.") and inspect.isfunction(c.obj) and _one_argument(c.obj)
                   and not getattr(c.obj, "recorded", False)]
        found.candidates = len(candidates) + sum(map(len, own.values())) + len(helpers)
        checks = {name: _memoized(check) for name, check in chapter.load_checks().items()}
        for exercise in chapter.exercises:
            trial = Trial(checks[exercise.name], exercise.load_reference(), answer_files)
            for candidate in helpers:
                computes = trial.computes_answer(candidate.obj)
                if computes is None:
                    found.cut.append(f"{chapter_id}:{exercise.name}: {candidate.label}")
                elif computes:
                    found.leaks.append(Leak(f"{chapter_id}:{exercise.name}", candidate.label))
            for candidate in candidates + own.get(exercise.name, []):
                if not fits(candidate.obj, trial.reference):
                    continue
                found.tried += 1
                outcome = trial.outcome(candidate.obj)
                where = Leak(f"{chapter_id}:{exercise.name}", candidate.label)
                if outcome == "cut":
                    found.cut.append(f"{where.exercise}: {where.candidate}")
                elif outcome == "leak":
                    found.leaks.append(where)
                elif outcome == "near":
                    found.near.append(where)
    finally:
        os.chdir(previous)
        scratch.cleanup()
        torch.set_num_threads(threads)
        if backend is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = backend
    return found
