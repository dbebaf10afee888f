"""The static half of the no-delegation rule: read the learner's code without running it.

The rule is enforced at run time by :mod:`autograder.checks.guard` (what the code
calls). This pass is the second line, for code that hides its calls from the guard:
in the code that defines an exercise it flags

* an import of the chapter's answer modules (``from solutions.attention import softmax``),
  or of ``solutions`` then an attribute of them;
* a PyTorch function the exercise forbids, named as an attribute of ``torch`` (or of a
  module imported from it: ``F.softmax``, ``torch.special.softmax``), imported by name
  (``from torch.nn.functional import softmax as s``) or bound to a name in any cell
  (``_sm = F.softmax``);
* a forbidden name or ``solutions`` passed as a string to ``getattr``, ``__import__``,
  ``importlib.import_module``, ``eval`` or ``exec``.

Names in type annotations and ``isinstance`` do not count. Every pass is linear in the
size of the code.
"""

from __future__ import annotations

import ast
import fnmatch
from dataclasses import dataclass, field
from typing import Iterable

_BY_NAME = ("getattr", "__import__", "import_module", "eval", "exec", "compile", "attrgetter")


def parse(source: str) -> ast.Module | None:
    """The cell's syntax tree (IPython magics and shell escapes ignored), or None on a syntax error."""
    lines = [("pass  # " + line) if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def defines(tree: ast.AST, name: str) -> bool:
    """Whether the cell binds ``name`` at top level (def, class, assignment, import)."""
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


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _is_answer_module(module: str, answers: tuple[str, ...]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in answers)


def _torch_aliases(trees: list[ast.AST]) -> set[str]:
    """Names bound to torch or its submodules (``torch``, ``F``, ``nn``, ``sp``...)."""
    names = {"torch"}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "torch" or a.name.startswith("torch."):
                        names.add(a.asname or "torch")
            elif isinstance(node, ast.ImportFrom) and node.module and (
                    node.module == "torch" or node.module.startswith("torch.")):
                for a in node.names:
                    if a.name in ("nn", "functional", "special", "ops", "_C", "linalg", "fft"):
                        names.add(a.asname or a.name)
    return names


def _ignored(tree: ast.AST) -> set[int]:
    """ids of the nodes inside type annotations and isinstance/issubclass class arguments."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
            roots.append(node.args[1])
    return {id(n) for root in roots for n in ast.walk(root)}


def _forbidden_value(node: ast.AST, torch_names: set[str], aliases: set[str], forbidden: tuple[str, ...]) -> str | None:
    """The forbidden thing ``node`` refers to (``torch.softmax``, an alias), or None."""
    if isinstance(node, ast.Name) and node.id in aliases:
        return node.id
    if isinstance(node, ast.Attribute) and _matches(node.attr, forbidden):
        base = node.value
        while isinstance(base, ast.Attribute):
            base = base.value
        if isinstance(base, ast.Name) and base.id in torch_names:
            return ast.unparse(node)
    return None


@dataclass
class _Bindings:
    """What the cells bind: names of torch modules, of forbidden functions, of answer modules."""

    torch: set[str]
    aliases: set[str] = field(default_factory=set)  # bound to a forbidden function, in any cell
    answers: set[str] = field(default_factory=set)  # bound to an answer module or one of its members
    package: set[str] = field(default_factory=set)  # bound to the `solutions` package itself


def _bindings(trees: list[ast.AST], forbidden: tuple[str, ...], answers: tuple[str, ...]) -> _Bindings:
    found = _Bindings(torch=_torch_aliases(trees))
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                if (node.module.startswith("torch") and not node.module.startswith("torchvision")
                        and any(_matches(a.name, forbidden) for a in node.names)):
                    found.aliases.update(a.asname or a.name for a in node.names if _matches(a.name, forbidden))
                if _is_answer_module(node.module, answers):
                    found.answers.update(a.asname or a.name for a in node.names)
                elif node.module == "solutions":
                    found.answers.update(a.asname or a.name for a in node.names
                                         if _is_answer_module(f"solutions.{a.name}", answers))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname and _is_answer_module(a.name, answers):
                        found.answers.add(a.asname)
                    elif a.name == "solutions" or (a.name.startswith("solutions.") and not a.asname):
                        found.package.add(a.asname or "solutions")
            elif isinstance(node, ast.Assign) and _forbidden_value(node.value, found.torch, found.aliases, forbidden):
                found.aliases.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return found


def _by_name(node: ast.Call, forbidden: tuple[str, ...], answers: tuple[str, ...]) -> str | None:
    """``getattr(torch, "softmax")``, ``import_module("solutions.attention")``...: why it delegates, or None."""
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if name not in _BY_NAME:
        return None
    for arg in node.args:
        for const in ast.walk(arg):
            if isinstance(const, ast.Constant) and isinstance(const.value, str):
                text = const.value
                if any(_matches(part, forbidden) for part in text.replace("(", ".").split(".")):
                    return f"reaches `{text[:40]}` by name, which this exercise asks you to write yourself"
                if text.startswith("solutions") and answers:
                    return "reaches the library's answer by name instead of solving the exercise"
    return None


def _node_delegates(node: ast.AST, bound: _Bindings, forbidden: tuple[str, ...], answers: tuple[str, ...]) -> str | None:
    if isinstance(node, ast.ImportFrom) and node.module and (
            _is_answer_module(node.module, answers)
            or (node.module == "solutions" and any(_is_answer_module(f"solutions.{a.name}", answers)
                                                   for a in node.names))):
        return f"imports {node.module} (the library's answer) instead of solving the exercise"
    if isinstance(node, ast.Import) and any(_is_answer_module(a.name, answers) for a in node.names):
        return "imports the library's answer instead of solving the exercise"
    if isinstance(node, ast.Name) and node.id in bound.answers and not isinstance(node.ctx, ast.Store):
        return f"uses the library's answer ({node.id}) instead of solving the exercise"
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound.package
            and _is_answer_module(f"solutions.{node.attr}", answers)):
        return f"uses the library's answer (solutions.{node.attr}) instead of solving the exercise"
    found = _forbidden_value(node, bound.torch, bound.aliases, forbidden)
    if found and not isinstance(getattr(node, "ctx", None), ast.Store):
        return f"uses {found}, which this exercise asks you to write yourself"
    if isinstance(node, ast.Call):
        return _by_name(node, forbidden, answers)
    return None


def delegation(sources: list[str], target: str, forbidden: tuple[str, ...], answers: tuple[str, ...]) -> str | None:
    """Why the code in ``sources`` (cells, or a function's source) delegates ``target``, or None.

    With several sources (a notebook's cells), only the cells that define ``target`` are read,
    with the names the other cells bound.
    """
    trees = [t for t in (parse(s) for s in sources) if t is not None]
    bound = _bindings(trees, forbidden, answers)
    for tree in trees:
        if len(sources) > 1 and not defines(tree, target):
            continue
        ignored = _ignored(tree)
        for node in ast.walk(tree):
            if id(node) not in ignored:
                why = _node_delegates(node, bound, forbidden, answers)
                if why:
                    return why
    return None
