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
* a function of another library the exercise forbids by its dotted name
  (``torchvision.models.vision_transformer.interpolate_embeddings``), named as an attribute
  or imported, whatever the module is called;
* what switches off the run-time guard (:data:`GUARD_OFF`: ``DisableTorchFunction``,
  ``_disable_current_modes``, ``sys.setprofile``...), as a name or inside any string;
* a forbidden name or ``solutions`` passed as a string to ``getattr``, ``__import__``,
  ``importlib.import_module``, ``eval`` or ``exec``.

Names in type annotations and ``isinstance`` do not count. Each cell is parsed once
(:class:`Code`) and walked once, iteratively, into the facts every exercise is judged on,
so the pass is linear in the size of the code, however deep an attribute chain goes.
"""

from __future__ import annotations

import ast
import fnmatch
from dataclasses import dataclass, field
from typing import Iterable

_BY_NAME = ("getattr", "__import__", "import_module", "eval", "exec", "compile", "attrgetter")
# Names of PyTorch's and Python's switches that turn the run-time guard's watch off.
GUARD_OFF = ("DisableTorchFunction", "_DisableTorchDispatch", "_disable_current_modes", "_pop_mode",
             "_pop_torch_function_stack", "_pop_torch_dispatch_stack", "_set_torch_function_state",
             "_unset_dispatch_mode", "_dispatch_tls_set_dispatch_key_excluded", "_python_dispatch", "setprofile")
_TORCH_SUBMODULES = ("nn", "functional", "special", "ops", "_C", "linalg", "fft")


def parse(source: str) -> ast.Module | None:
    """The cell's syntax tree (IPython magics and shell escapes ignored), or None on a syntax error."""
    lines = [("pass  # " + line) if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _top_level_names(tree: ast.AST) -> set[str]:
    """The names the cell binds at top level (def, class, assignment, import)."""
    names: set[str] = set()
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
    return names


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _is_answer_module(module: str, answers: tuple[str, ...]) -> bool:
    return any(module == a or module.startswith(a + ".") for a in answers)


# --- one walk per cell: the facts ---------------------------------------------------------


@dataclass
class Cell:
    """What one parsed cell holds that the rule reads (uses outside annotations and ``isinstance``)."""

    tree: ast.Module
    top: set[str]  # names bound at top level
    imports: list[tuple[str, str | None]] = field(default_factory=list)  # import NAME as ASNAME
    imports_from: list[tuple[str, str, str | None]] = field(default_factory=list)  # from MODULE import NAME as ASNAME
    loads: dict[str, ast.Name] = field(default_factory=dict)  # names read
    attributes: dict[tuple[str, str | None], ast.Attribute] = field(default_factory=dict)  # (attr, base name) read
    assigns: list[tuple[list[str], tuple]] = field(default_factory=list)  # (targets, ("name", x) | ("attr", a, base))
    by_name: set[str] = field(default_factory=set)  # strings passed to getattr, __import__, eval...
    guard_off: set[str] = field(default_factory=set)  # GUARD_OFF words inside any string


def _children(node: ast.AST, ignored: bool, by_name: bool) -> list[tuple[ast.AST, bool, bool]]:
    """The child nodes with their flags: inside an annotation or isinstance (ignored), inside a by-name call."""
    skip: set[int] = set()
    if isinstance(node, ast.arg) and node.annotation is not None:
        skip.add(id(node.annotation))
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
        skip.add(id(node.returns))
    elif isinstance(node, ast.AnnAssign):
        skip.add(id(node.annotation))
    elif isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in ("isinstance", "issubclass") and len(node.args) == 2:
            skip.add(id(node.args[1]))
        if name in _BY_NAME:
            args = {id(a) for a in node.args}
            return [(c, ignored or id(c) in skip, by_name or id(c) in args) for c in ast.iter_child_nodes(node)]
    return [(c, ignored or id(c) in skip, by_name) for c in ast.iter_child_nodes(node)]


def _chain_base(node: ast.Attribute, bases: dict[int, str | None]) -> str | None:
    """The name an attribute chain starts from (``torch`` for ``torch.nn.functional.softmax``), memoised
    for every link of the chain, so a chain of any depth is walked once."""
    if id(node) in bases:
        return bases[id(node)]
    links = []
    current: ast.AST = node
    while isinstance(current, ast.Attribute):
        links.append(current)
        current = current.value
    base = current.id if isinstance(current, ast.Name) else None
    for link in links:
        bases[id(link)] = base
    return base


def _value_fact(value: ast.AST, bases: dict[int, str | None]) -> tuple | None:
    if isinstance(value, ast.Name):
        return ("name", value.id)
    if isinstance(value, ast.Attribute):
        return ("attr", value.attr, _chain_base(value, bases))
    return None


def _record(cell: Cell, node: ast.AST, ignored: bool, by_name: bool, bases: dict[int, str | None]) -> None:
    if isinstance(node, ast.Name):
        if not ignored and not isinstance(node.ctx, ast.Store):
            cell.loads.setdefault(node.id, node)
    elif isinstance(node, ast.Attribute):
        base = _chain_base(node, bases)
        if not ignored and not isinstance(node.ctx, ast.Store):
            cell.attributes.setdefault((node.attr, base), node)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        if by_name:
            cell.by_name.add(node.value)
        cell.guard_off.update(word for word in GUARD_OFF if word in node.value)
    elif isinstance(node, ast.Import):
        cell.imports += [(a.name, a.asname) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
        cell.imports_from += [(node.module, a.name, a.asname) for a in node.names]
    elif isinstance(node, ast.Assign):
        fact = _value_fact(node.value, bases)
        if fact is not None:
            cell.assigns.append(([t.id for t in node.targets if isinstance(t, ast.Name)], fact))


def read_cell(tree: ast.Module) -> Cell:
    """The facts of one cell, in one iterative walk."""
    cell = Cell(tree=tree, top=_top_level_names(tree))
    bases: dict[int, str | None] = {}
    stack: list[tuple[ast.AST, bool, bool]] = [(tree, False, False)]
    while stack:
        node, ignored, by_name = stack.pop()
        _record(cell, node, ignored, by_name, bases)
        stack.extend(reversed(_children(node, ignored, by_name)))
    return cell


# --- what the cells bind, per rule ---------------------------------------------------------


@dataclass(frozen=True)
class _Rule:
    """One exercise's forbidden names, split by how they are recognised."""

    torch: tuple[str, ...]  # fnmatch patterns of PyTorch functions (reached from torch)
    functions: tuple[str, ...]  # dotted names of other libraries' functions
    anywhere: tuple[str, ...]  # the last parts of those, recognised from any base (as are the guard's switches)

    @classmethod
    def of(cls, forbidden: tuple[str, ...]) -> "_Rule":
        torch = tuple(p for p in forbidden if "." not in p)
        functions = tuple(p for p in forbidden if "." in p)
        return cls(torch, functions, tuple(f.rsplit(".", 1)[1] for f in functions))

    def anywhere_name(self, name: str) -> bool:
        return name in self.anywhere or switches_guard_off(name)


def switches_guard_off(name: str) -> bool:
    """Whether ``name`` is one of the switches that turn the run-time guard's watch off."""
    return name in GUARD_OFF or name.startswith("DisableTorchFunction")


@dataclass
class _Bindings:
    """What the cells bind: names of torch modules, of forbidden functions, of answer modules."""

    torch: set[str]
    aliases: set[str] = field(default_factory=set)  # bound to a forbidden function, in any cell
    answers: set[str] = field(default_factory=set)  # bound to an answer module or one of its members
    package: set[str] = field(default_factory=set)  # bound to the `solutions` package itself


def _torch_aliases(cells: list[Cell]) -> set[str]:
    """Names bound to torch or its submodules (``torch``, ``F``, ``nn``, ``sp``...)."""
    names = {"torch"}
    for cell in cells:
        names.update(asname or "torch" for name, asname in cell.imports if name == "torch" or name.startswith("torch."))
        names.update(asname or name for module, name, asname in cell.imports_from
                     if (module == "torch" or module.startswith("torch.")) and name in _TORCH_SUBMODULES)
    return names


def _forbidden_fact(fact: tuple, rule: _Rule, bound: _Bindings) -> bool:
    if fact[0] == "name":
        return fact[1] in bound.aliases
    _, attr, base = fact
    return (_matches(attr, rule.torch) and base in bound.torch) or rule.anywhere_name(attr)


def _bindings(cells: list[Cell], rule: _Rule, answers: tuple[str, ...]) -> _Bindings:
    found = _Bindings(torch=_torch_aliases(cells))
    for cell in cells:
        for module, name, asname in cell.imports_from:
            from_torch = module.startswith("torch") and not module.startswith("torchvision")
            if (from_torch and _matches(name, rule.torch)) or rule.anywhere_name(name):
                found.aliases.add(asname or name)
            if _is_answer_module(module, answers):
                found.answers.add(asname or name)
            elif module == "solutions" and _is_answer_module(f"solutions.{name}", answers):
                found.answers.add(asname or name)
        for name, asname in cell.imports:
            if asname and _is_answer_module(name, answers):
                found.answers.add(asname)
            elif name == "solutions" or (name.startswith("solutions.") and not asname):
                found.package.add(asname or "solutions")
        for targets, fact in cell.assigns:
            if _forbidden_fact(fact, rule, found):
                found.aliases.update(targets)
    return found


# --- the verdict of one cell --------------------------------------------------------------------


def _dotted(node: ast.AST, limit: int = 6) -> str:
    """``torch.nn.functional.softmax`` for an attribute chain (its last ``limit`` links), without recursion."""
    parts = []
    while isinstance(node, ast.Attribute) and len(parts) < limit:
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Attribute):
        parts.append("…")
    elif isinstance(node, ast.Name):
        parts.append(node.id)
    else:
        parts.append("(…)")
    return ".".join(reversed(parts))


def _imports_an_answer(cell: Cell, bound: _Bindings, answers: tuple[str, ...]) -> str | None:
    for module, name, _ in cell.imports_from:
        if _is_answer_module(module, answers) or (module == "solutions"
                                                  and _is_answer_module(f"solutions.{name}", answers)):
            return f"imports {module} (the library's answer) instead of solving the exercise"
    if any(_is_answer_module(name, answers) for name, _ in cell.imports):
        return "imports the library's answer instead of solving the exercise"
    for name in cell.loads:
        if name in bound.answers:
            return f"uses the library's answer ({name}) instead of solving the exercise"
    for attr, base in cell.attributes:
        if base in bound.package and _is_answer_module(f"solutions.{attr}", answers):
            return f"uses the library's answer (solutions.{attr}) instead of solving the exercise"
    return None


def _uses_forbidden(cell: Cell, rule: _Rule, bound: _Bindings) -> str | None:
    for name in cell.loads:
        if name in bound.aliases:
            return f"uses {name}, which {_why(name)}"
    for (attr, base), node in cell.attributes.items():
        if (_matches(attr, rule.torch) and base in bound.torch) or rule.anywhere_name(attr):
            return f"uses {_dotted(node)}, which {_why(attr)}"
    for module, name, _ in cell.imports_from:
        if rule.anywhere_name(name) or any(word in module for word in GUARD_OFF):
            return f"imports {name} from {module}, which {_why(name if rule.anywhere_name(name) else module)}"
    for name, _ in cell.imports:
        if any(word in name for word in GUARD_OFF):
            return f"imports {name}, which {_why(name)}"
    return None


def _why(name: str) -> str:
    if switches_guard_off(name) or any(word in name for word in GUARD_OFF):
        return "switches off the checks' watch on what your code calls"
    return "this exercise asks you to write yourself"


def _by_name(cell: Cell, rule: _Rule, answers: tuple[str, ...]) -> str | None:
    """``getattr(torch, "softmax")``, ``import_module("solutions.attention")``...: why it delegates, or None."""
    for text in sorted(cell.by_name):
        for part in text.replace("(", ".").split("."):
            if _matches(part, rule.torch) or rule.anywhere_name(part):
                return f"reaches `{text[:40]}` by name, which {_why(part)}"
        if text.startswith("solutions") and answers:
            return "reaches the library's answer by name instead of solving the exercise"
    if cell.guard_off:
        return f"names `{min(cell.guard_off)}`, which switches off the checks' watch on what your code calls"
    return None


def cell_delegates(cell: Cell, rule: _Rule, bound: _Bindings, answers: tuple[str, ...]) -> str | None:
    """Why the code of ``cell`` delegates the exercise, or None."""
    return (_imports_an_answer(cell, bound, answers) or _uses_forbidden(cell, rule, bound)
            or _by_name(cell, rule, answers))


# --- a notebook's code --------------------------------------------------------------------------


class Code:
    """A notebook's code cells (or one function's source), each parsed once and read once.

    ``Code(sources).delegation(target, forbidden, answers)`` for every exercise: the cells are
    not parsed or walked again, and what they bind is worked out once per set of forbidden names.
    """

    def __init__(self, sources: list[str]) -> None:
        self.trees = [parse(s) for s in sources]  # None where Python cannot parse the source
        self.facts = [None if t is None else read_cell(t) for t in self.trees]
        self.cells = [c for c in self.facts if c is not None]
        self.several = len(sources) > 1
        self._bound: dict[tuple, _Bindings] = {}

    def delegation(self, target: str, forbidden: tuple[str, ...], answers: tuple[str, ...]) -> str | None:
        """Why the code delegates ``target``, or None. With several sources (a notebook's cells),
        only the cells that define ``target`` are read, with the names the other cells bound."""
        rule = _Rule.of(tuple(forbidden))
        key = (rule, tuple(answers))
        if key not in self._bound:
            self._bound[key] = _bindings(self.cells, rule, tuple(answers))
        for cell in self.cells:
            if self.several and target not in cell.top:
                continue
            why = cell_delegates(cell, rule, self._bound[key], tuple(answers))
            if why:
                return why
        return None


def delegation(sources: list[str], target: str, forbidden: tuple[str, ...], answers: tuple[str, ...]) -> str | None:
    """Why the code in ``sources`` (cells, or a function's source) delegates ``target``, or None."""
    return Code(sources).delegation(target, forbidden, answers)
