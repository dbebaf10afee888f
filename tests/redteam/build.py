"""Build the red-team corpus from the chapter releases (course/) and sources, into a folder.

``build(root, source_dir)`` writes ``root/submissions/<student>/<notebook>`` and returns the
manifest: for each submission (path relative to ``submissions``) the exact points and
status every exercise must get. Built at test time, so it never drifts from the releases.
Run ``python tests/redteam/build.py DIR`` to look at it.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import nbformat

from autograder import registry

REPO = Path(__file__).resolve().parents[2]
CH1 = registry.CHAPTERS[0].id  # "01_attention_by_hand"
CH1_POINTS = {e.name: e.points for e in registry.get(CH1).exercises}  # follows the registry
# What an attack's notebook solves honestly beside its attack: every exercise but tiled_attention, whose
# checks (an 8,192-key memory case) take about 7 s of a full notebook's 16 s in the grader; the honest
# students and the controls solve it, and the attacks on it solve it too.
BESIDE_ATTACK = frozenset(CH1_POINTS) - {"tiled_attention"}
ATTACK_MISSING = {ex: "missing" for ex in CH1_POINTS if ex not in BESIDE_ATTACK}
SENTINEL = "REDTEAM-SENTINEL-7f3c9a1e"  # planted in the hidden tests of the source copy the grader uses

# A bracket never closed: graded as an error that says "syntax error" and gives the line, never "not done".
SYNTAX_ERROR_PADDING = "def padding_mask(tokens, pad_id):\n    return (tokens != pad_id[:, None, None, :]\n"
WRONG_PADDING = '''def padding_mask(tokens, pad_id):
    """True where the key is a real token, False where it is padding."""
    return (tokens == pad_id)[:, None, None, :]  # inverted: the mistake a hostile submission tries to hide
'''


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def release(chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(REPO / "course" / chapter / f"{chapter}.ipynb", as_version=4)


def solutions_of(chapter: str, source_dir: Path) -> dict[str, str]:
    nb = nbformat.read(Path(source_dir) / chapter / f"{chapter}.ipynb", as_version=4)
    return {_meta(c)["grade_id"]: "\n".join(line for line in c.source.splitlines()
                                            if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)
            for c in nb.cells if _meta(c).get("solution") and c.cell_type == "code"}


def solved(chapter: str, source_dir: Path, only: set[str] | None = None) -> nbformat.NotebookNode:
    """The release with the solution cells filled in from the source (only those of ``only``)."""
    nb = copy.deepcopy(release(chapter))
    sols = solutions_of(chapter, source_dir)
    for cell in nb.cells:
        gid = _meta(cell).get("grade_id", "")
        if _meta(cell).get("solution") and gid in sols and (only is None or gid.removesuffix("_solution") in only):
            cell.source = sols[gid]
    return nb


def set_cell(nb, grade_id: str, source: str, append: bool = False) -> None:
    for cell in nb.cells:
        if _meta(cell).get("grade_id") == grade_id:
            cell.source = cell.source + "\n" + source if append else source
            return
    raise KeyError(grade_id)


def insert_after_imports(nb, source: str) -> None:
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells.insert(first + 1, nbformat.v4.new_code_cell(source))


def expect(points: dict[str, int], **changes: tuple[int, str] | str) -> dict:
    """Expected rows: full points and passed, except the exercises in ``changes`` ((points, status) or status -> 0)."""
    out = {}
    for ex, p in points.items():
        change = changes.get(ex)
        if change is None:
            out[ex] = [p, "passed"]
        elif isinstance(change, str):
            out[ex] = [0, change]
        else:
            out[ex] = list(change)
    return out


def plant_sentinel(source_dir: Path) -> None:
    """Put the sentinel in the hidden tests of every chapter of ``source_dir``."""
    for nb_path in Path(source_dir).glob("*/*.ipynb"):
        nb = nbformat.read(nb_path, as_version=4)
        for cell in nb.cells:
            if "### BEGIN HIDDEN TESTS" in cell.source:
                cell.source = cell.source.replace("### BEGIN HIDDEN TESTS", f"### BEGIN HIDDEN TESTS\n# {SENTINEL}")
        nbformat.write(nb, nb_path)


def build(root: Path, source_dir: Path, chapters: tuple[str, ...] = (CH1,)) -> dict:
    """Write the corpus under ``root/submissions`` and return the manifest {relpath: {exercise: [points, status]}}."""
    root = Path(root)
    subs = root / "submissions"
    manifest: dict[str, dict] = {}
    nb_name = f"{CH1}.ipynb"
    gradebook = root / "out" / "gradebook.db"
    solution_line = next(line for line in (REPO / "solutions" / "attention.py").read_text().splitlines()
                         if len(line.strip()) > 30 and "import" not in line)

    def add(student: str, nb, expected: dict, name: str = nb_name, raw: bytes | None = None,
            extra: dict[str, str] | None = None) -> None:
        path = subs / student / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if raw is not None:
            path.write_bytes(raw)
        else:
            nbformat.write(nb, path)
        for fname, text in (extra or {}).items():
            (path.parent / fname).write_text(text)
        manifest[f"{student}/{name}"] = expected

    def base() -> nbformat.NotebookNode:
        return solved(CH1, source_dir, BESIDE_ATTACK)

    def wrong_padding(**kw) -> nbformat.NotebookNode:
        nb = base()
        set_cell(nb, "padding_mask_solution", WRONG_PADDING)
        return nb

    def attacked(**changes: str) -> dict:  # the expected rows of an attack's notebook (base())
        return expect(CH1_POINTS, **ATTACK_MISSING, **changes)

    full = expect(CH1_POINTS)
    add("honest", solved(CH1, source_dir), full)
    for chapter in chapters[1:]:
        exercises = registry.get(chapter).exercises
        add("honest", solved(chapter, source_dir), expect({e.name: e.points for e in exercises}),
            name=f"{chapter}.ipynb")
    add("untouched", release(CH1), {ex: [0, "missing"] for ex in CH1_POINTS})
    add("one_solved", solved(CH1, source_dir, only={"softmax"}),
        {ex: ([2, "passed"] if ex == "softmax" else [0, "missing"]) for ex in CH1_POINTS})
    add("wrong", wrong_padding(), attacked(padding_mask="failed"))
    syntax = base()
    set_cell(syntax, "padding_mask_solution", SYNTAX_ERROR_PADDING)
    add("syntax_error", syntax, attacked(padding_mask="error"))

    # --- hostile: each one targets padding_mask (1 point); the rest is solved honestly ---
    def hostile(student: str, cell: str, status: str, *, in_function: bool = False) -> None:
        nb = base()
        if in_function:  # the learner's function misbehaves when called
            body = "\n".join("    " + line for line in cell.splitlines())
            set_cell(nb, "padding_mask_solution", f"def padding_mask(tokens, pad_id):\n{body}\n")
        else:  # the cell that defines padding_mask misbehaves at top level
            set_cell(nb, "padding_mask_solution", cell, append=True)
        add(student, nb, attacked(padding_mask=status))

    hostile("infinite_loop", "while True:\n    pass", "timeout", in_function=True)
    hostile("infinite_loop_cell", "while True:\n    pass", "timeout")
    hostile("os_exit", "import os\nos._exit(1)", "crashed", in_function=True)
    # a segfault (ctypes, the usual way, is refused in the grader's kernel: the signal itself)
    hostile("segfault", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "crashed")
    hostile("alloc_50gb", "import torch\nx = torch.ones(50 * 2**30, dtype=torch.uint8)\nreturn x", "memory",
            in_function=True)
    # a process started while the check runs is out of its sight: refused whatever it does (0 points, as before)
    hostile("fork_bomb", "import os\nwhile True:\n    os.fork()", "flagged", in_function=True)
    hostile("print_1gb", "for _ in range(2**20):\n    print('x' * 1024)", "error")

    nb = wrong_padding()
    insert_after_imports(nb, "import torch, numpy, numpy.testing\n"
                             "torch.allclose = lambda *a, **k: True\n"
                             "torch.equal = lambda *a, **k: True\n"
                             "torch.testing.assert_close = lambda *a, **k: None\n"
                             "numpy.testing.assert_allclose = lambda *a, **k: None\n"
                             "numpy.allclose = lambda *a, **k: True\n")
    add("comparator_patch", nb, attacked(padding_mask="failed"))

    nb = wrong_padding()
    insert_after_imports(nb, "import builtins\n"
                             "class _Yes(Exception):\n    pass\n"
                             "builtins.AssertionError = _Yes\n"
                             "_real_isinstance = builtins.isinstance\n"
                             "builtins.isinstance = lambda obj, cls: True\n")
    add("builtins_patch", nb, attacked(padding_mask="failed"))

    nb = wrong_padding()
    insert_after_imports(nb, "ip = get_ipython()\n"
                             "def _neuter(lines):\n"
                             "    return [l.replace('checks.run(', 'print(') for l in lines]\n"
                             "ip.input_transformers_post.append(_neuter)\n"
                             "ip.showtraceback = lambda *a, **k: None\n"
                             "ip.run_cell_orig = ip.run_cell\n")
    add("ipython_hooks", nb, attacked(padding_mask="failed"))

    add("shadow_modules", base(), attacked(),
        extra={"torch.py": "raise SystemExit('shadowed torch')\n", "numpy.py": "raise SystemExit('shadowed')\n"})

    # test cells: edited, deleted, reordered, metadata stripped (and a wrong answer each time)
    nb = wrong_padding()
    for cell in nb.cells:
        if _meta(cell).get("grade") and not _meta(cell).get("solution"):
            cell.source = "print('all tests passed')"
    add("tests_edited", nb, attacked(padding_mask="failed"))
    nb = wrong_padding()
    nb.cells = [c for c in nb.cells if not (_meta(c).get("grade") and not _meta(c).get("solution"))]
    add("tests_deleted", nb, attacked(padding_mask="failed"))
    nb = wrong_padding()
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    nb.cells = [nb.cells[i] for i in code[:1]] + [nb.cells[i] for i in reversed(code[1:])]
    add("tests_reordered", nb, attacked(padding_mask="failed"))
    nb = wrong_padding()
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
    add("metadata_stripped", nb, attacked(padding_mask="failed"))

    invalid = {ex: [0, "invalid"] for ex in CH1_POINTS}
    add("malformed_json", None, invalid, raw=b'{"cells": [ {"cell_type": "code", "source": "x = ')
    add("wrong_name", base(), {"-": [0, "invalid"]}, name="attention_homework.ipynb")
    # ... and the chapter it should have been shows 0 of its points, never 0/0
    manifest[f"wrong_name/{CH1}.ipynb"] = {ex: [0, "missing"] for ex in CH1_POINTS}

    # reading what must stay hidden: a correct padding_mask only if a sentinel was found
    nb = wrong_padding()
    search = f'''import os
# the strings are stored reversed, so that this notebook's own copy does not match
_needles = [{SENTINEL[::-1]!r}[::-1].encode(), {solution_line.strip()[::-1]!r}[::-1].encode()]
_found = []
for _top in ["/tmp", "/work", "/root", "/home", "/srv", "/var", "/sandbox", "/mnt", "/opt"]:
    for _dir, _subdirs, _files in os.walk(_top):
        _subdirs[:] = [d for d in _subdirs if d not in (".venv", "site-packages", ".git", "proc", "sys")]
        for _f in _files:
            try:
                with open(os.path.join(_dir, _f), "rb") as _h:
                    _data = _h.read(4_000_000)
            except OSError:
                continue
            if _needles[0] in _data or _needles[1] in _data:
                _found.append(os.path.join(_dir, _f))
if _found:
    def padding_mask(tokens, pad_id):
        return (tokens != pad_id)[:, None, None, :]
'''
    insert_after_imports(nb, WRONG_PADDING)  # keep the wrong one unless the search succeeds
    set_cell(nb, "padding_mask_solution", search)
    add("sentinel_search", nb, attacked(padding_mask="failed"))

    nb = wrong_padding()
    other = subs / "honest" / nb_name
    attack = f'''_ok = 0
for _path in [{str(gradebook)!r}, {str(other)!r}]:
    try:
        with open(_path, "ab") as _h:
            _h.write(b"tampered")
        _ok += 1
    except OSError:
        pass
try:
    import socket
    socket.create_connection(("1.1.1.1", 53), timeout=3).close()
    _ok += 1
except OSError:
    pass
if _ok:
    def padding_mask(tokens, pad_id):
        return (tokens != pad_id)[:, None, None, :]
'''
    set_cell(nb, "padding_mask_solution", WRONG_PADDING + "\n" + attack)
    add("write_and_network", nb, attacked(padding_mask="failed"))

    nb = base()
    set_cell(nb, "softmax_solution", "from solutions.attention import softmax\n")
    set_cell(nb, "scaled_dot_product_attention_solution",
             "import torch.nn.functional as F\n"
             "def scaled_dot_product_attention(q, k, v, mask=None):\n"
             "    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None\n")
    add("delegation", nb, attacked(softmax="flagged", scaled_dot_product_attention="flagged"))
    return manifest


if __name__ == "__main__":
    target = Path(sys.argv[1])
    print(json.dumps(build(target, REPO / "autograder" / "source"), indent=1))
