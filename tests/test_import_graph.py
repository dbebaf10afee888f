"""The packages' import graph has no cycle, counting every import in a file (also those inside functions, the
usual way around a cycle): each module can be read knowing only what it imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support import REPO


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports anywhere in its file."""
    files = {}
    for path in (REPO / package).rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names if alias.name in files}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    parent = here[: len(here) - (node.level - 1)]
                    base = ".".join(parent + ([base] if base else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in files:
                        graph[name].add(target)
                    elif base in files:
                        graph[name].add(base)
        graph[name].discard(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_finds_a_cycle_through_a_function_level_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", ["autograder", "solutions"])
def test_no_import_cycle(package):
    graph = import_graph(package)
    assert len(graph) > 10
    assert cycles(graph) == [], f"{package}: modules that import each other (directly or through others)"


def test_grade_is_a_command_and_nobodys_library():
    """`grade` is a thin command over the engine: no other module imports it (plan, shard and merge used to)."""
    graph = import_graph("autograder")
    importers = sorted(name for name, imported in graph.items() if "autograder.grade" in imported)
    assert importers in ([], ["autograder.__main__"]), importers
    assert "autograder.engine" in graph["autograder.grade"]


COMMAND_IMPORTS = """
import contextlib, io, json, runpy, sys
sys.argv = ["autograder", *json.loads(sys.argv[1]), "--help"]
with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
    runpy.run_module("autograder", run_name="__main__", alter_sys=True)
print(json.dumps({name: name in sys.modules for name in ("torch", "nbgrader")}))
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("command,loads", [
    ([], set()), (["feedback"], set()), (["publish"], set()), (["workspace"], set()), (["release"], set()),
    (["plan"], set()), (["merge"], set()), (["grade"], set()),  # its workers load PyTorch, not the command
    (["check"], {"torch"}), (["course"], {"nbgrader"}),
])
def test_a_command_loads_only_what_it_uses(command, loads):
    """`python -m autograder CMD` imports CMD's module alone: importing every command loaded PyTorch and nbgrader
    (seconds of start-up, hundreds of times in a test run) for `feedback --help` too."""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", COMMAND_IMPORTS, json.dumps(command)], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = {name for name, present in json.loads(done.stdout.strip().splitlines()[-1]).items() if present}
    assert loaded == loads, (command, loaded)
