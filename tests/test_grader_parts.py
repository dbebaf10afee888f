"""The grader's parts on hostile input, without a sandbox: discovery, reading, the wire, output, cleanup.

Each test names the attack class of docs/grading.md's threat model it covers.
"""

from __future__ import annotations

import csv
import gc
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autograder import record, registry, results, sandbox, submissions, wire
from autograder.checks import core, honesty

CH1 = registry.CHAPTERS[0]
NB = CH1.notebook


def _touch(path: Path, data: bytes = b"{}") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# --- discovery: links, special files, depth, names -----------------------------------------


def test_discover_never_follows_links_and_reports_them(tmp_path):
    root = tmp_path / "subs"
    _touch(root / "alice" / NB)
    (root / "bob").mkdir()
    os.symlink(root / "alice" / NB, root / "bob" / NB)  # a link to a peer's notebook
    os.symlink(root / "alice", root / "carol")  # a student folder that is a link
    outside = _touch(tmp_path / "outside" / "x" / NB)
    os.symlink(outside.parent, root / "alice" / "sub")  # a link to a folder outside
    found = submissions.discover(root)
    by_student = {(f.student, f.relpath): f for f in found.found}
    assert by_student[("bob", f"bob/{NB}")].problem.startswith("a link")
    assert by_student[("alice", f"alice/{NB}")].problem is None
    assert not any("outside" in f.relpath or f.relpath.startswith("alice/sub") for f in found.found)
    assert "carol" in found.students and not any(f.student == "carol" for f in found.found)
    assert any("carol" in line and "link" in line for line in found.skipped)


def test_discover_lists_a_hidden_student_folder_as_skipped_with_the_reason(tmp_path):
    """A student folder (or flat notebook) whose name starts with '.' is not graded, and says so; inside a
    student's folder, .ipynb_checkpoints (Jupyter's autosaved copies) is passed over without a word."""
    root = tmp_path / "subs"
    _touch(root / ".hidden" / NB)
    _touch(root / f".eve_{NB}")
    _touch(root / "alice" / NB)
    _touch(root / "alice" / ".ipynb_checkpoints" / f"{CH1.id}-checkpoint.ipynb")
    found = submissions.discover(root)
    assert [f.relpath for f in found.found] == [f"alice/{NB}"] and found.students == ["alice"]
    hidden = [line for line in found.skipped if "starts with '.'" in line]
    assert sorted(line.split(":")[0] for line in hidden) == [".eve_" + NB, ".hidden"], found.skipped
    assert all("rename it to grade it" in line for line in hidden)
    assert len(found.skipped) == 2


def test_read_refuses_links_fifos_devices_and_oversized_files(tmp_path):
    root = tmp_path / "subs"
    secret = _touch(tmp_path / "secret.txt", b"TOP-SECRET-BYTES")
    os.chmod(secret, 0o600)
    _touch(root / "a" / NB, b'{"cells": []}')
    os.symlink(secret, root / "a" / "link.ipynb")
    os.mkfifo(root / "a" / "fifo.ipynb")
    with open(root / "a" / "sparse.ipynb", "wb") as f:
        f.truncate(8 * 2**30)  # 8 GiB, no blocks
    assert submissions.read(root, f"a/{NB}".encode(), 1000)[0] == b'{"cells": []}'
    for name, expected in (("link.ipynb", "a link"), ("fifo.ipynb", "a FIFO"), ("sparse.ipynb", "larger than")):
        started = time.monotonic()
        with pytest.raises(submissions.Unreadable, match=expected) as err:
            submissions.read(root, f"a/{name}".encode(), 64 * 2**20)
        assert "TOP-SECRET" not in str(err.value)
        assert time.monotonic() - started < 30  # a FIFO must not block; the sparse file is never read
    os.symlink(tmp_path, root / "dirlink")
    with pytest.raises(submissions.Unreadable):
        submissions.read(root, "dirlink/secret.txt".encode(), 1000)  # no link on the way either


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_read_refuses_a_device(tmp_path):
    root = tmp_path / "subs"
    (root / "a").mkdir(parents=True)
    os.mknod(root / "a" / NB, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    with pytest.raises(submissions.Unreadable, match="a device"):
        submissions.read(root, f"a/{NB}".encode(), 1000)


def test_discover_is_iterative_and_bounded_in_depth(tmp_path):
    root = tmp_path / "subs"
    deep = root / "deep"
    deep.mkdir(parents=True)
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(3000):  # far deeper than Python's recursion limit
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    _touch(root / "ok" / "a" / "b" / NB)
    try:
        found = submissions.discover(root)
        assert [f.relpath for f in found.found] == [f"ok/a/b/{NB}"]
        assert any("deeper than" in line for line in found.skipped)
    finally:
        sandbox.remove_tree(deep)  # pytest's own cleanup (shutil.rmtree) recurses and would fail


def test_discover_any_file_name_linux_allows(tmp_path):
    root = tmp_path / "subs"
    names = [b"stud\xffent", b"eve\rmallory", b"=cmd|' /C calc'!A0", b"a b", b"a_b", b"\x1b]52;c;aGk=\x07x",
             b"back\\slash", b"n" * 240]
    for name in names:
        _touch(Path(os.fsdecode(bytes(root) + b"/" + name + b"/" + NB.encode())))
    found = submissions.discover(root)
    students = sorted(f.student for f in found.found)
    assert len(set(students)) == len(names)  # one-to-one
    for s in students:
        assert s == record.printable(s)  # nothing a terminal would interpret
    assert "stud\\xffent" in students and "eve\\x0dmallory" in students and "back\\\\slash" in students


def test_display_name_keeps_a_c1_character_apart_from_a_byte_that_is_not_utf8(tmp_path):
    """U+0085 (bytes c2 85) and the lone byte 85 are two folders, so two students."""
    assert record.display_name(b"a\xc2\x85") != record.display_name(b"a\x85")
    root = tmp_path / "subs"
    for name in (b"a\xc2\x85", b"a\x85"):
        _touch(Path(os.fsdecode(bytes(root) + b"/" + name + b"/" + NB.encode())))
    found = submissions.discover(root)
    assert len({f.student for f in found.found}) == 2
    assert all(f.problem is None for f in found.found)


def test_match_chapter_exact_renamed_and_flat():
    assert submissions.match_chapter(NB) == (CH1.id, True, "")
    for renamed in (f"{CH1.id}-Copy1.ipynb", f"{CH1.id} (1).ipynb", f"{CH1.id}_v2.ipynb", f"{CH1.id}-checkpoint.ipynb"):
        assert submissions.match_chapter(renamed)[:2] == (CH1.id, False), renamed
    assert submissions.match_chapter(f"alice_{CH1.id}.ipynb") == (CH1.id, False, "alice")
    assert submissions.match_chapter("homework.ipynb")[0] is None
    assert submissions.match_chapter(f"{CH1.id}_but_different.ipynb")[0] is None


def _plan(root: Path, tmp_path: Path, chapters: tuple[str, ...] | None = None):
    from autograder import engine

    return engine.work_list(root, chapters, 10**6, tmp_path / "state")


def test_two_renamed_copies_lose_the_chapter_with_a_reason(tmp_path):
    """No exact name and two copies: every exercise of the chapter gets a row with 0 points and says why,
    never a silent 0 of 0."""
    root = tmp_path / "subs"
    _touch(root / "alice" / f"{CH1.id}-Copy1.ipynb")
    _touch(root / "alice" / f"{CH1.id} (1).ipynb")
    _, jobs, fixed = _plan(root, tmp_path)
    assert jobs == []
    rows = [row for r in fixed for row in r["rows"]]
    scored = [row for row in rows if row["max_points"] > 0]
    assert sum(row["max_points"] for row in scored) == sum(ex.points for ex in CH1.exercises)
    assert all(row["points"] == 0 and "renamed copies" in row["reason"] for row in scored)
    assert [row["status"] for row in rows if row["max_points"] == 0] == ["duplicate"]


def test_flat_layout_exact_name_wins_over_a_copy(tmp_path):
    root = tmp_path / "subs"
    _touch(root / f"alice_{CH1.id}.ipynb")
    _touch(root / f"alice_{CH1.id} (1).ipynb")
    _, jobs, fixed = _plan(root, tmp_path)
    assert [(j.student, j.submission) for j in jobs] == [("alice", f"alice_{CH1.id}.ipynb")]
    assert [r["kind"] for r in fixed] == ["duplicate"]


def test_a_flat_notebook_without_a_student_says_so(tmp_path):
    from autograder import engine

    root = tmp_path / "subs"
    _touch(root / NB)
    with pytest.raises(engine.BadInput, match="no student to grade it for"):
        _plan(root, tmp_path)


# --- the wire: nothing from the kernel is trusted --------------------------------------------


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b"[1, 2]", b"\xff\xfe", b"{\"a\": ", b"5"])
def test_wire_parse_rejects_anything_but_an_object(body):
    with pytest.raises(wire.ProtocolError):
        wire.parse(body)


@pytest.mark.parametrize("value", [
    "[" * 50_000 + "]" * 50_000,
    json.dumps({"__list__": [{"__list__": [{"__list__": []}]}] }).replace("[]", "[" + "{\"__list__\": [" * 40 + "]}" * 40 + "]"),
    json.dumps({"__tensor__": "float32", "shape": [10**12], "data": ""}),
    json.dumps({"__tensor__": "object", "shape": [1], "data": "AAAA"}),
    json.dumps({"__dict__": 5}), json.dumps({"__float__": 1.5}), 5, None,
])
def test_wire_decode_value_rejects_malformed_and_deep_values(value):
    with pytest.raises(wire.ProtocolError):
        wire.decode_value(value)


def test_wire_header_cap():
    with pytest.raises(wire.ProtocolError):
        wire.body_size((wire.MAX_MESSAGE + 1).to_bytes(8, "big"))


@pytest.mark.parametrize("answer", [
    [1, 2], {"ok": "yes"}, {"ok": True, "outputs": 5}, {"ok": True, "outputs": "[", "inputs_after": "{}"},
    {"ok": False, "kind": ["memory"], "error": {"x": 1}}, {"ok": False, "kind": "MemoryError", "error": "x"},
])
def test_result_from_answer_is_strict(answer):
    with pytest.raises(core.ProbeError) as err:
        core.result_from_answer(answer)
    assert err.value.status in ("error", "missing")  # never "memory" or "passed" from a shape the grader did not make


# --- output that cannot be injected ------------------------------------------------------------


def test_csv_survives_carriage_returns_and_formulas(tmp_path):
    rows = [{"student": s, "notebook": f"{s}/{NB}", "exercise": e, "points": 1, "max_points": 2, "status": "failed",
             "reason": r}
            for s, e, r in (("eve\rmallory", "-", "line1\r\nline2"), ("=cmd|' /C calc'!A0", "softmax", "+1"),
                            ("@SUM(A1)", "softmax", "-1e4 fill"), ("'quoted", "softmax", "'=x"), ("\tTab", "x", "@"))]
    path = tmp_path / "grades.csv"
    record.write_csv(path, rows)
    back = record.read_csv(path)
    assert [{k: r[k] for k in ("student", "exercise", "reason")} for r in back] == \
        [{k: r[k] for k in ("student", "exercise", "reason")} for r in rows]
    with open(path, newline="") as f:  # what a spreadsheet sees: no cell starts a formula
        raw = list(csv.reader(f))
    assert len(raw) == len(rows) + 1
    for line in raw[1:]:
        assert not any(cell.startswith(("=", "+", "-", "@", "\t", "\r")) for cell in line), line
    assert b"\r\r" not in path.read_bytes().replace(b"\r\n", b"")


def test_feedback_names_are_collision_free_and_bounded():
    names = ["a b", "a_b", "ada", "ada.", "n" * 240, "é", "../../etc/passwd", ".hidden", "x~y", "a/b"]
    files = [record.feedback_filename(n) for n in names]
    assert len(set(files)) == len(files)
    assert record.feedback_filename("ada") == "ada.html"
    for f in files:
        assert len(f.encode()) <= 100 and "/" not in f and not f.startswith(".")


def test_printable_escapes_terminal_control():
    text = record.printable("ok\x1b]52;c;aGk=\x07\x1b[2J\u202eevil\x9b")
    assert not any(ord(ch) < 0x20 or 0x7f <= ord(ch) <= 0x9f or ch == "\u202e" for ch in text)
    assert "\\x1b" in text and "\\u202e" in text


def test_output_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        record.atomic_write(tmp_path / "f.csv", b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "f.csv").st_mode) == 0o644


# --- the static pass is linear -----------------------------------------------------------------


def test_honesty_pass_is_linear_in_the_cell_size():
    def cell(n: int) -> str:
        return "def padding_mask(tokens, pad_id):\n" + "    x = (tokens + 1) * 2 - tokens.sum()\n" * n + "    return x\n"

    def seconds(n: int) -> float:
        """The least CPU time of three passes, the collector off (as timeit does): on a busy machine one pass can
        be slowed by what runs beside it, and the collector's full passes grow with everything alive."""
        source = cell(n)
        best = float("inf")
        gc.disable()
        try:
            for _ in range(3):
                started = time.process_time()
                honesty.delegation([source], "padding_mask", ("*softmax*",), ("solutions.attention",))
                best = min(best, time.process_time() - started)
        finally:
            gc.enable()
        return best

    small, large = seconds(1000), seconds(8000)  # about 40 KB and 320 KB
    assert large < 20 * max(small, 0.01), (small, large)  # 8x the size: far below the 64x of a quadratic pass


def test_honesty_pass_is_linear_in_the_depth_of_attribute_chains():
    """``x.softmax.softmax…`` (each link an attribute of the previous one): the same amount of code in a few
    deep chains costs what it costs in many shallow ones (walking down each link's chain again was quadratic)."""
    def seconds(depth: int, chains: int) -> float:
        cell = "def padding_mask(tokens, pad_id):\n" + "".join(
            f"    y{i} = tokens{'.softmax' * depth}\n" for i in range(chains)) + "    return tokens\n"
        started = time.process_time()
        honesty.delegation([cell, "import torch"], "padding_mask", ("*softmax*",), ("solutions.attention",))
        return time.process_time() - started

    shallow, deep = seconds(25, 800), seconds(2500, 8)  # about 160 KB each
    assert deep < 5 * max(shallow, 0.01), (shallow, deep)


def test_static_pass_parses_each_code_cell_once_per_notebook(monkeypatch):
    """Not once per exercise: the cells are parsed once and every exercise is judged on what they hold."""
    from autograder import verdict

    parsed = []
    real_parse = honesty.parse

    def counting_parse(source):
        parsed.append(source)
        return real_parse(source)

    def no_kernel(self):
        raise sandbox.RunnerDied("start", "the kernel could not start: none in this test")

    monkeypatch.setattr(honesty, "parse", counting_parse)
    monkeypatch.setattr(sandbox.Runner, "start", no_kernel)
    nb = json.loads((registry.COURSE_DIR / CH1.id / NB).read_bytes())
    code_cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    rows = verdict.grade_notebook(json.dumps(nb).encode(), CH1)
    assert {r["status"] for r in rows} == {"crashed"}
    assert len(parsed) == len(code_cells) == len(set(parsed)), (len(parsed), len(code_cells))


def test_an_untouched_demo_that_imports_runs_only_when_a_running_cell_mentions_a_name_it_binds():
    """Chapter 1 imports PyTorch's ``causal_lower_right`` (whose module loads torch's compiler) in a demo of its
    own: the grader skips it for an answer that never mentions it, and runs it for one that does, so that answer
    works as it does in the notebook."""
    import nbformat
    from redteam import build as redteam

    from autograder import verdict

    release = verdict.release_cells(str(CH1.release_path()))
    nb = redteam.solved(CH1.id, registry.SOURCE_DIR)

    def imports_it(nb) -> bool:
        run = verdict.cells_to_run(verdict.Code(nb), release)
        assert [i for i, _ in run] == sorted(i for i, _ in run)
        return any("import causal_lower_right" in src for _, src in run)

    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    assert sum("from torch.nn.attention.bias import causal_lower_right" in src for src in cells) == 1
    assert not imports_it(nb)
    redteam.set_cell(nb, "causal_mask_solution", "def causal_mask(seq_q, seq_k=None):\n"
                     "    return causal_lower_right(seq_q, seq_k or seq_q)._materialize()")
    assert imports_it(nb)

    # The same rule on made-up cells: a magic, a definition or a mention keeps a demo; mentions count from the
    # demos this rule runs too (b is run because a's cell mentions it, c because b's does); test cells never run.
    demos = ["%matplotlib inline", "import a\nx = 1", "import b", "from m import c as cc\ny = b.f", "import d",
             "def given():\n    return x", "import e  # mentioned only by a test cell", "assert e", "import u"]
    learner = ["def answer():\n    return cc.g(y)"]
    nb = {"cells": [{"cell_type": "code", "source": src, "metadata": {}} for src in demos + learner]}
    release = {src: src.startswith("assert") for src in demos}
    run = [src for _, src in verdict.cells_to_run(verdict.Code(nbformat.from_dict(nb)), release)]
    assert run == ["%matplotlib inline", "import a\nx = 1", "import b", "from m import c as cc\ny = b.f",
                   "def given():\n    return x", *learner]


def test_probes_seed_the_global_generator_as_torch_manual_seed_does():
    """The sampling probes seed the CPU's generator alone when no accelerator is there (torch.manual_seed would
    also queue the seed for each accelerator, formatting the stack each time): the same draws as torch.manual_seed."""
    import torch

    from autograder.checks import probes

    state = torch.get_rng_state()
    try:
        draws = []
        for seed_with in (probes._seed_global, torch.manual_seed, probes._seed_global):
            seed_with(1234)
            draws.append(torch.multinomial(torch.ones(50), 20, replacement=True))
        probes._seed_global(1235)
        other = torch.multinomial(torch.ones(50), 20, replacement=True)
    finally:
        torch.set_rng_state(state)
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[1], draws[2])
    assert not torch.equal(draws[0], other)


def test_notebook_with_more_code_than_the_static_pass_reads_is_invalid_at_once(monkeypatch):
    """More than 1 MB of code in all cells: every exercise `invalid`, with a reason that quotes nothing from the
    file, and neither the static pass nor a kernel runs."""
    from autograder import verdict

    monkeypatch.setattr(honesty, "parse", lambda source: pytest.fail("the static pass ran"))
    monkeypatch.setattr(sandbox.Runner, "start", lambda self: pytest.fail("a kernel was started"))
    nb = json.loads((registry.COURSE_DIR / CH1.id / NB).read_bytes())
    filler = "# SECRET-FILLER " + "y" * 1000 + "\n"
    nb["cells"].append({"cell_type": "code", "id": "filler", "metadata": {}, "execution_count": None, "outputs": [],
                        "source": filler * (verdict.MAX_CODE_BYTES // len(filler) + 1)})
    started = time.monotonic()
    rows = verdict.grade_notebook(json.dumps(nb).encode(), CH1)
    assert time.monotonic() - started < 30
    assert [r["exercise"] for r in rows] == [ex.name for ex in CH1.exercises]
    assert {r["status"] for r in rows} == {"invalid"}
    assert all(f"more than the {verdict.MAX_CODE_BYTES} bytes the grader reads" in r["reason"] for r in rows)
    assert not any("SECRET" in r["reason"] or "yyy" in r["reason"] for r in rows)


@pytest.mark.subprocess
def test_the_notebook_deadline_includes_the_static_pass(monkeypatch):
    """A static pass that takes the whole notebook's time leaves none for the kernel: every exercise
    `timeout`, and no kernel is started."""
    from autograder import verdict

    real_flags = verdict.static_flags

    def slow_flags(chapter, code):
        time.sleep(2.5)
        return real_flags(chapter, code)

    monkeypatch.setattr(verdict, "static_flags", slow_flags)
    monkeypatch.setattr(sandbox.Runner, "start", lambda self: pytest.fail("a kernel was started"))
    data = (registry.COURSE_DIR / CH1.id / NB).read_bytes()
    rows = verdict.grade_notebook(data, CH1, limits=sandbox.Limits(notebook_seconds=2))
    assert {r["status"] for r in rows} == {"timeout"}, rows
    assert all("longer than its 2 s limit" in r["reason"] for r in rows)


@pytest.mark.parametrize("dodge", [
    ["import torch.nn.functional as F\n_sm = F.softmax", "def softmax(x, dim=-1):\n    return _sm(x, dim)"],
    ["import torch\ndef softmax(x, dim=-1):\n    return getattr(torch, 'softmax')(x, dim)"],
    ["import torch\ndef softmax(x, dim=-1):\n    return torch._softmax(x, dim, False)"],
    ["from torch.nn.functional import softmax as s\ndef softmax(x, dim=-1):\n    return s(x, dim)"],
    ["import solutions\ndef softmax(x, dim=-1):\n    return solutions.attention.softmax(x, dim)"],
])
def test_honesty_static_pass_flags_dodges(dodge):
    assert honesty.delegation(dodge, "softmax", ("*softmax*", "softmin"), ("solutions.attention",))


@pytest.mark.parametrize("dodge", [
    "from torch._C import DisableTorchFunction\ndef softmax(x, dim=-1):\n    with DisableTorchFunction():\n"
    "        return x.exp() / x.exp().sum(dim, keepdim=True)",
    "import torch\ndef softmax(x, dim=-1):\n    with getattr(torch._C, 'DisableTorchFunction')():\n        return x",
    "import torch.utils._python_dispatch as d\ndef softmax(x, dim=-1):\n    with d._disable_current_modes():\n"
    "        return x",
    "import sys\ndef softmax(x, dim=-1):\n    sys.setprofile(None)\n    return x",
    "def softmax(x, dim=-1):\n    switch = '_pop_torch_dispatch_stack'\n    return x",
])
def test_honesty_static_pass_flags_what_switches_the_guard_off(dodge):
    """The names of the switches that turn the run-time guard off, as identifiers and inside any string."""
    why = honesty.delegation([dodge], "softmax", ("*softmax*",), ("solutions.attention",))
    assert why and "switches off the checks' watch" in why, why


def test_honesty_static_pass_flags_a_dotted_forbidden_function_however_imported():
    forbidden = ("torchvision.models.vision_transformer.interpolate_embeddings",)
    for cells in (["from torchvision.models.vision_transformer import interpolate_embeddings as ie",
                   "def interpolate_position_embeddings(p, g):\n    return ie(224, 16, {'e': p})"],
                  ["import torchvision.models.vision_transformer as vt\n"
                   "def interpolate_position_embeddings(p, g):\n"
                   "    return vt.interpolate_embeddings(224, 16, {'e': p})"],
                  ["import torchvision\ndef interpolate_position_embeddings(p, g):\n"
                   "    return getattr(torchvision.models.vision_transformer, 'interpolate_embeddings')(224, 16, p)"]):
        assert honesty.delegation(cells, "interpolate_position_embeddings", forbidden, ()), cells
    honest = ["import torchvision\nvit = torchvision.models.vit_b_16",  # the chapter's own demo cells
              "def interpolate_position_embeddings(p, g):\n    return p"]
    assert honesty.delegation(honest, "interpolate_position_embeddings", forbidden, ()) is None


# --- the run-time guard: what switches it off is itself a violation -----------------------------------

SOFTMAX_DODGES = {
    "both_modes_off": "from torch.utils._python_dispatch import _disable_current_modes\n"
                      "from torch._C import DisableTorchFunction\n"
                      "def softmax(x, dim=-1):\n    with DisableTorchFunction(), _disable_current_modes():\n"
                      "        return getattr(torch, 'soft' + 'max')(x, dim)\n",
    "by_strings": "import importlib\n"
                  "def softmax(x, dim=-1):\n"
                  "    modes = importlib.import_module('torch.utils._python' + '_dispatch')\n"
                  "    with getattr(torch._C, 'Disable' + 'TorchFunction')(), "
                  "getattr(modes, '_disable_' + 'current_modes')():\n"
                  "        return getattr(torch, 'soft' + 'max')(x, dim)\n",
    "from_c_code": "def softmax(x, dim=-1):\n"
                   "    with getattr(torch._C, 'Disable' + 'TorchFunction')(), torch._C._DisableTorchDispatch():\n"
                   "        return list(map(torch.softmax, [x], [dim]))[0]\n",
    "pop_the_stacks": "def softmax(x, dim=-1):\n    torch._C._pop_torch_dispatch_stack()\n"
                      "    return torch.softmax(x, dim)\n",
    "profile_off": "import sys\ndef softmax(x, dim=-1):\n    sys.setprofile(None)\n"
                   "    with torch._C.DisableTorchFunction(), torch.utils._python_dispatch._disable_current_modes():\n"
                   "        return torch.softmax(x, dim)\n",
    "in_a_thread": "import threading\ndef softmax(x, dim=-1):\n    out = []\n"
                   "    t = threading.Thread(target=lambda: out.append(torch.softmax(x, dim)))\n"
                   "    t.start()\n    t.join()\n    return out[0]\n",
}


def _learner_softmax(source: str):
    namespace = {"torch": __import__("torch")}
    exec(compile("import torch.utils._python_dispatch\n" + source, "<ipython-input-1-test>", "exec"), namespace)
    return namespace["softmax"]


@pytest.mark.parametrize("dodge", SOFTMAX_DODGES, ids=list(SOFTMAX_DODGES))
def test_guard_flags_a_softmax_that_switches_it_off(dodge):
    """The dodge of issue 16's second audit (PyTorch's function modes switched off, the names reached through
    strings) and its variants: flagged at run time, by the same probe the grader's kernel runs."""
    check = registry.get(CH1.id).load_checks()["softmax"]
    verdict = core.judge_check(check, core.local_probe(_learner_softmax(SOFTMAX_DODGES[dodge]), check.forbidden),
                               lambda case: [0], level="visible")
    assert verdict.status == "flagged", verdict
    assert sys.getprofile() is None  # the guard's hook is gone afterwards


def test_guard_names_a_torchscript_delegation_for_what_it_is():
    """A softmax delegated to a TorchScript function: flagged, and the reason says TorchScript (a scripted
    function's call is not a C call the hook sees; PyTorch's own code then runs with the modes off their
    stacks, which must not read as "switches off the checks' watch")."""
    import linecache
    import warnings

    from autograder.checks import guard

    source = ("import torch\n@torch.jit.script\ndef _sm(x: torch.Tensor, dim: int) -> torch.Tensor:\n"
              "    return torch.softmax(x, dim)\ndef softmax(x, dim=-1):\n    return _sm(x, dim)\n")
    filename = "<ipython-input-7-torchscript>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # as IPython keeps a cell
    namespace = {"__name__": "__main__"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated; still there to dodge with
        exec(compile(source, filename, "exec"), namespace)
    check = registry.get(CH1.id).load_checks()["softmax"]
    verdict = core.judge_check(check, core.local_probe(namespace["softmax"], check.forbidden),
                               lambda case: [0], level="visible")
    assert verdict.status == "flagged" and guard.TORCHSCRIPT in verdict.reason, verdict
    assert "switches off" not in verdict.reason, verdict


def test_guard_passes_an_honest_softmax_written_in_a_notebook_cell():
    check = registry.get(CH1.id).load_checks()["softmax"]
    honest = _learner_softmax("def softmax(x, dim=-1):\n    e = (x - x.amax(dim, keepdim=True)).exp()\n"
                              "    return e / e.sum(dim, keepdim=True)\n")
    verdict = core.judge_check(check, core.local_probe(honest, check.forbidden, CH1.answer_files()),
                               lambda case: [0, 1], level="hidden")
    assert verdict.status == "passed", verdict


def test_guard_flags_a_dotted_forbidden_function_however_it_is_reached():
    """A function of another library, forbidden by its dotted name: called directly, through a name built
    at run time, or as a copy of its code under other globals."""
    import types

    import torch
    from torchvision.models import vision_transformer

    from autograder.checks import probes

    forbidden = ("torchvision.models.vision_transformer.interpolate_embeddings",)
    real = vision_transformer.interpolate_embeddings
    copy = types.FunctionType(real.__code__, dict(vars(vision_transformer), __name__="elsewhere"), "mine",
                              real.__defaults__)
    by_name = getattr(vision_transformer, "interpolate_" + "embeddings")
    for function in (real, by_name, copy):
        def delegating(p, g, function=function):
            return function(g * 16, 16, {"encoder.pos_embedding": p})["encoder.pos_embedding"]

        answer = probes.execute(delegating, "call", wire.encode_value({"args": (torch.randn(1, 5, 3), 3)}), forbidden)
        assert answer["violation"] and "interpolate_embeddings" in answer["violation"], answer


# --- cleanup never follows a link and never recurses ---------------------------------------------


def test_remove_tree_deep_chains_links_and_locked_folders(tmp_path):
    keep = _touch(tmp_path / "outside" / "keep.txt", b"keep")
    os.chmod(keep, 0o600)
    before = os.stat(keep)
    root = tmp_path / "scratch"
    root.mkdir()
    os.symlink(keep, root / "link")
    os.symlink(keep.parent, root / "dirlink")
    fd = os.open(root, os.O_RDONLY)
    for _ in range(5000):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    _touch(root / "locked" / "f")
    os.chmod(root / "locked", 0)
    sandbox.remove_tree(root)
    assert not root.exists()
    after = os.stat(keep)
    assert keep.read_bytes() == b"keep" and (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)


def test_remove_tree_never_chmods_through_a_link_put_in_place_of_a_folder(tmp_path, monkeypatch):
    """A folder swapped for a link to a host folder while the tree is removed (a process still running):
    the host folder keeps its mode, and the link itself is removed."""
    outside = tmp_path / "host"
    outside.mkdir()
    os.chmod(outside, 0o755)
    root = tmp_path / "scratch"
    (root / "victim").mkdir(parents=True)
    real_rename = os.rename

    def rename_then_swap(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        real_rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        if src == "victim":
            os.rmdir(dst, dir_fd=dst_dir_fd)
            os.symlink(outside, dst, dir_fd=dst_dir_fd)

    monkeypatch.setattr(sandbox.os, "rename", rename_then_swap)
    sandbox.remove_tree(root)
    monkeypatch.undo()
    assert stat.S_IMODE(os.stat(outside).st_mode) == 0o755
    assert not root.exists() and outside.is_dir()
    assert [p.name for p in tmp_path.iterdir()] == ["host"]  # no link or moved folder left behind


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_remove_tree_as_the_learners_own_user_with_locked_folders():
    """Without root (the grader's own user is the learner's, level ``none``): folders made 0000 or 0500,
    the scratch folder itself included, are still removed."""
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="tdd-test-"))  # pytest's tmp_path is not reachable by another user
    os.chmod(tmp_path, 0o755)
    root = tmp_path / "scratch"
    _touch(root / "locked" / "inner" / "f")
    _touch(root / "readonly" / "g")
    for dirpath, dirnames, filenames in os.walk(tmp_path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), 4242, 4242)
    os.chmod(tmp_path, 0o777)
    os.chmod(root / "locked", 0)
    os.chmod(root / "readonly", 0o500)
    os.chmod(root, 0)
    pid = os.fork()
    if pid == 0:  # pragma: no cover — the child
        code = 1
        try:
            os.setgid(4242)
            os.setuid(4242)
            sandbox.remove_tree(root)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    try:
        assert os.waitstatus_to_exitcode(status) == 0 and not root.exists()
    finally:
        sandbox.remove_tree(tmp_path)


@pytest.mark.parametrize("chapter", registry.CHAPTERS, ids=registry.ids())
def test_hidden_paths_every_checks_module_and_the_answers_not_yet_due(chapter):
    """Read in the sandbox, a file can reach the reason column, so the learner's feedback: every chapter's
    checks (hidden cases) and the answers of this chapter and the later ones are hidden; earlier answers
    (which the notebook imports) are not."""
    hidden = {str(p) for p in sandbox.hidden_paths(chapter)}
    for other in registry.CHAPTERS:
        assert other.checks_file() in hidden, other.checks
        for f in other.answer_files():
            assert (f in hidden) == (other.number >= chapter.number), (other.id, f)


@pytest.mark.subprocess
def test_selfcheck_kernel_that_stops_reading_its_input_times_out_on_a_large_cell():
    """`autograder check` (its kernel at its own isolation level and limits) shares the grader's writes: a kernel
    that stops reading its input while a 300 KB cell is written to it is a timeout, not a hang."""
    from autograder import selfcheck

    runner = sandbox.Runner(selfcheck.limits(5.0), level=selfcheck.ISOLATION, unprivileged=False)
    runner.start()
    try:
        stop_reading = "import os\n_keep = os.dup(0)\n_r, _w = os.pipe()\nos.dup2(_r, 0)\n"
        assert runner.request({"op": "cell", "source": stop_reading}, 60)["ok"] is True
        outcome: list = []

        def send_large_cell():
            try:
                outcome.append(runner.request({"op": "cell", "source": "# " + "x" * 300_000 + "\nx = 1\n"}, 5.0))
            except sandbox.RunnerDied as died:
                outcome.append(died)

        started = time.monotonic()
        sender = threading.Thread(target=send_large_cell, daemon=True)
        sender.start()
        sender.join(60)  # a write without a deadline would block here for ever
        seconds = time.monotonic() - started
        if sender.is_alive():
            runner.kill()  # unblocks the write, so that the test ends
            pytest.fail("writing a large cell to a kernel that stopped reading hangs")
        died = outcome[0]
        assert isinstance(died, sandbox.RunnerDied) and died.kind == "timeout", died
        assert "stopped reading its input" in str(died), died
        assert seconds < 30, f"{seconds:.0f} s for a 5 s deadline"
        assert runner.proc is None  # the kernel was stopped
    finally:
        runner.close()


# --- bubblewrap older than 0.8: said, with what is lost -----------------------------------------------------


@pytest.mark.parametrize("printed,version", [("bubblewrap 0.6.1", (0, 6, 1)), ("bubblewrap 0.4.0", (0, 4, 0)),
                                             ("bubblewrap 0.8.0", (0, 8, 0)), ("bubblewrap 0.11.1", (0, 11, 1))])
def test_bwrap_version_is_read_and_an_old_one_is_named_in_the_warning(tmp_path, monkeypatch, printed, version):
    """A stub `bwrap` first on PATH prints a version: below 0.8 (no --size) the warning names it and says what
    the instructor loses (file-system hiding, the total disk cap); at 0.8 and later it does not blame the version."""
    stub = tmp_path / "bwrap"
    stub.write_text(f"#!/bin/sh\necho '{printed}'\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    assert sandbox.bwrap_version() == version
    for level in ("unshare", "none"):
        text = sandbox.warning(level)
        shown = ".".join(map(str, version))
        if version < (0, 8):
            assert f"bubblewrap {shown} is older than 0.8" in text and "--size" in text, text
        else:
            assert "older than" not in text, text
        assert "CAN READ" in text or "isolation" in text
        assert "in total" in text or "total disk use" in text
        assert "bubblewrap >= 0.8" in text
    assert sandbox.warning("bwrap") is None


def test_bwrap_version_without_bwrap_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sandbox.bwrap_version() is None
    assert "not usable" in sandbox.warning("unshare")


# --- processes left behind: killed after every request, however they move ---------------------------


def _live_in_session(session: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != session:
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] not in (b"Z", b"X") and fields[3] == str(session).encode():
                found.append(int(entry))
    return found


@pytest.mark.subprocess
def test_reap_without_a_sandbox_kills_a_sleeper_and_a_process_that_keeps_moving():
    """Level ``none`` (the self-check, and grading without bubblewrap): after a request nothing the
    learner's code started is left in the runner's session: neither a sleeping child nor a process
    that forks and exits over and over (its pid changes faster than one pass of "list, then kill")."""
    runner = sandbox.Runner(sandbox.Limits(cell_seconds=60), level="none", unprivileged=False)
    runner.start()
    try:
        cell = ("import os, time\n"
                "if os.fork() == 0:\n    time.sleep(600)\n    os._exit(0)\n"
                "if os.fork() == 0:\n    for _ in range(10**7):\n        if os.fork():\n            os._exit(0)\n"
                "    os._exit(0)\n"
                "time.sleep(0.5)\n")
        assert runner.request({"op": "cell", "source": cell}, 60)["ok"] is True
        time.sleep(1)
        assert _live_in_session(runner.proc.pid) == []
        assert runner.request({"op": "cell", "source": "x = 1"}, 60)["ok"] is True  # the runner itself lives on
    finally:
        runner.close()



def test_preloads_follow_what_the_notebook_and_the_checks_name():
    """torchvision (imported through ctypes, which the lockdown refuses) is loaded before the lockdown only where
    the cells or the chapter's checks name it: chapter 5, or any notebook that imports it; never in the others,
    where importing it would double each kernel's start."""
    from autograder import verdict

    first, fifth = registry.CHAPTERS[0], registry.get("05_vision_transformer")
    cells_of = {ch.id: [(i, c["source"]) for i, c in enumerate(json.loads(ch.release_path().read_text())["cells"])
                        if c["cell_type"] == "code"] for ch in (first, fifth)}
    assert verdict.preloads(first, cells_of[first.id]) == ()
    assert verdict.preloads(fifth, cells_of[fifth.id]) == ("torchvision",)
    assert verdict.preloads(first, [*cells_of[first.id], (99, "from torchvision import ops")]) == ("torchvision",)


@pytest.mark.subprocess
def test_runner_preloads_torchvision_only_when_asked_and_it_then_works_after_the_lockdown():
    for preload in ((), ("torchvision",)):
        runner = sandbox.Runner(sandbox.Limits(cell_seconds=60), level="none", unprivileged=False, preload=preload)
        runner.start()
        try:
            loaded = runner.request({"op": "cell", "source": "import sys\nassert 'torchvision' in sys.modules"}, 60)
            assert loaded["ok"] is bool(preload), loaded
            if preload:
                nms = runner.request({"op": "cell", "source": "import torch, torchvision\n"
                                      "torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)"}, 60)
                assert nms["ok"] is True, nms
        finally:
            runner.close()


def test_kernel_that_cannot_start_is_started_once_and_every_exercise_says_why(monkeypatch):
    """A memory limit no kernel can work in (issue 8: "a clear status in under 10 s"): one start, not a
    retry loop until the notebook's deadline; it gives up before loading PyTorch, so within a fraction
    of a second of CPU; every exercise gets the same `crashed` row with the reason; a later notebook of
    the same worker gets the same rows at once, without starting a kernel again."""
    import resource

    from autograder import verdict

    spawned = []
    real_popen = sandbox.subprocess.Popen

    def counting_popen(*args, **kwargs):
        spawned.append(args[0])
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(sandbox.subprocess, "Popen", counting_popen)
    monkeypatch.setattr(sandbox, "_START_FAILURES", {})
    data = (registry.COURSE_DIR / CH1.id / NB).read_bytes()
    limits = sandbox.Limits(memory_bytes=2**30, notebook_seconds=600)
    for notebook in ("first", "second"):
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        rows = verdict.grade_notebook(data, CH1, limits=limits, isolation="none")
        seconds = time.monotonic() - started
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        kernel_cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
        assert [r["exercise"] for r in rows] == [ex.name for ex in CH1.exercises]
        assert {r["status"] for r in rows} == {"crashed"}, rows
        assert all("could not start" in r["reason"] and "memory limit of 1 GB" in r["reason"] for r in rows), rows
        assert seconds < 10, f"{notebook} notebook: {seconds:.1f} s"
        assert kernel_cpu < 1.0, f"{notebook} notebook: the kernel used {kernel_cpu:.2f} s of CPU before giving up"
    assert len(spawned) == 1, f"the kernel was started {len(spawned)} times"


# --- a notebook that kills its grading worker: retried once, then an error row; the batch ends ------


def _settings(root: Path, tmp_path: Path, **changes):
    from autograder import engine

    values = dict(root=root, out=tmp_path / "out" / "grades.csv", state=tmp_path / "state", jobs=1, chapters=None,
                  gradebook=None, limits=sandbox.Limits(), hide=(), max_bytes=10**7, regrade=False,
                  course_dir=registry.COURSE_DIR)
    return engine.Settings(**{**values, **changes})


def test_grade_job_a_grader_failure_is_that_notebooks_error_rows_and_not_cached(tmp_path, monkeypatch):
    from autograder import engine, verdict

    root = tmp_path / "subs"
    _touch(root / "alice" / NB, (registry.COURSE_DIR / CH1.id / NB).read_bytes())

    def broken(*args, **kwargs):
        raise RecursionError("deep")

    monkeypatch.setattr(verdict, "grade_notebook", broken)
    cfg = _settings(root, tmp_path)
    (tmp_path / "state").mkdir()
    _, jobs, _ = engine.work_list(cfg.root, None, cfg.max_bytes, cfg.state)
    res = engine.grade_job(jobs[0], cfg)
    assert [r["exercise"] for r in res["rows"]] == [ex.name for ex in CH1.exercises]
    assert {r["status"] for r in res["rows"]} == {"error"} and res["retry"] is True
    assert "the grader failed on this notebook (RecursionError)" in res["rows"][0]["reason"]
    assert list((tmp_path / "state").iterdir()) == []  # graded again next run


def _jobs(root: Path, tmp_path: Path, students: str) -> list:
    """One chapter-1 job per student (a letter each), whose file holds the student's name: a stand-in grader
    can read who it grades."""
    from autograder import engine

    jobs = []
    for student in students:
        _touch(root / student / NB, student.encode())
        jobs.append(engine.Job(student, f"{student}/{NB}", f"{student}/{NB}".encode(), CH1.id, "0" * 64,
                               str(tmp_path / f"{student}.json")))
    return jobs


def _run_jobs_with(module, name: str, stand_in, jobs: list, cfg) -> list:
    """``engine.run_jobs`` with ``module.name`` replaced by ``stand_in`` in its workers (forked, so that they see
    it); the results in the order they were reported."""
    from autograder import engine

    got, real = [], getattr(module, name)
    setattr(module, name, stand_in)
    engine.MP_CONTEXT = "fork"
    try:
        engine.run_jobs(jobs, cfg, got.append)
    finally:
        setattr(module, name, real)
        engine.MP_CONTEXT = "forkserver"
    return got


@pytest.mark.slow
def test_run_jobs_charges_a_dead_worker_to_the_notebook_that_killed_it(tmp_path):
    """Two notebooks kill their grading worker, two are honest, two jobs at a time: a broken pool is retried one
    notebook at a time in a pool of its own, so only the killers get error rows; the honest ones are graded as
    usual (here: their grading also fails, through a monkeypatched grader, but with their own reason); and the
    batch ends, with every notebook's result."""
    from autograder import engine

    root = tmp_path / "subs"
    jobs = _jobs(root, tmp_path, "abcd")
    killers = {"a", "c"}
    cfg = _settings(root, tmp_path, jobs=2, max_bytes=10**6, course_dir=tmp_path / "course")
    real_grade_job = engine.grade_job

    def grade_job(job, cfg):
        if job.student in killers:
            os._exit(3)
        return real_grade_job(job, cfg)

    results = _run_jobs_with(engine, "grade_job", grade_job, jobs, cfg)
    assert sorted(r["student"] for r in results) == ["a", "b", "c", "d"]
    for r in results:
        reasons = {row["reason"] for row in r["rows"]}
        if r["student"] in killers:
            assert {row["status"] for row in r["rows"]} == {"error"} and r["retry"] is True
            assert all("the grading worker died on it" in reason for reason in reasons), reasons
        else:
            assert not any("worker died" in reason for reason in reasons), reasons


@pytest.mark.slow
def test_run_jobs_grades_a_kernel_that_could_not_start_once_more_alone_at_the_end(tmp_path):
    """A result marked retry (here: a kernel that could not start, the first time only) is not reported; its
    notebook is graded again after the others, alone, and only that result is reported. A notebook that fails
    to start twice is reported with its second result, still marked retry; one whose kernel cannot work within
    the memory limit is not tried again in this run (it is still marked retry: a rerun with more memory grades
    it)."""
    from autograder import verdict

    root = tmp_path / "subs"
    jobs = _jobs(root, tmp_path, "abcm")
    cfg = _settings(root, tmp_path, jobs=2, max_bytes=10**6, course_dir=tmp_path / "course")
    (tmp_path / "state").mkdir()
    log = tmp_path / "log"

    def grade_notebook(data, chapter, **kwargs):
        student = data.decode()
        tries = log.read_text().splitlines().count(student) if log.exists() else 0
        with log.open("a") as f:
            f.write(student + "\n")
        if student == "m":
            return results.rows_for_all(chapter, "crashed", f"the kernel could not start: {sandbox.NO_START_IN_MEMORY}"
                                                            " of 1 GB")
        if student == "c" or (student == "a" and tries == 0):
            return results.rows_for_all(chapter, "crashed", "the kernel could not start: it took longer than 60 s")
        return [results.row(ex, "passed", "") for ex in chapter.exercises]

    got = _run_jobs_with(verdict, "grade_notebook", grade_notebook, jobs, cfg)
    order = [r["student"] for r in got]
    assert sorted(order[:2]) == ["b", "m"] and order[2:] == ["a", "c"], order  # the retried ones after the others
    tries = log.read_text().splitlines()
    assert [tries.count(s) for s in ("a", "b", "c", "m")] == [2, 1, 2, 1], tries
    by = {r["student"]: r for r in got}
    assert {row["status"] for row in by["a"]["rows"]} == {"passed"} and by["a"]["retry"] is False
    assert {row["status"] for row in by["c"]["rows"]} == {"crashed"} and by["c"]["retry"] is True
    assert {row["status"] for row in by["m"]["rows"]} == {"crashed"} and by["m"]["retry"] is True


# --- the grader's command line on wrong input ------------------------------------------------------


def _grade(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", "grade", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


@pytest.mark.subprocess
def test_grade_without_notebooks_exits_1_with_the_layout(tmp_path):
    (tmp_path / "subs" / "alice").mkdir(parents=True)
    (tmp_path / "subs" / "bob").mkdir()
    done = _grade(str(tmp_path / "subs"), "--out", str(tmp_path / "out" / "g.csv"), cwd=tmp_path)
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: no notebook found") and "2 student folder(s)" in line and NB in line


@pytest.mark.subprocess
def test_grade_with_only_unknown_names_exits_1(tmp_path):
    _touch(tmp_path / "subs" / "alice" / "homework.ipynb")
    done = _grade(str(tmp_path / "subs"), "--out", str(tmp_path / "out" / "g.csv"), cwd=tmp_path)
    assert done.returncode == 1 and "has a chapter's name" in done.stderr


@pytest.mark.subprocess
def test_grade_out_inside_submissions_is_refused(tmp_path):
    _touch(tmp_path / "subs" / "alice" / NB)
    done = _grade(str(tmp_path / "subs"), "--out", str(tmp_path / "subs" / "g.csv"), cwd=tmp_path)
    assert done.returncode == 1 and "outside SUBMISSIONS" in done.stderr


def test_autograder_without_the_course_installed_says_which_python(tmp_path):
    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "nbformat.py").write_text("raise ModuleNotFoundError('nbformat', name='nbformat')\n")
    env = dict(os.environ, PYTHONPATH=f"{fake}{os.pathsep}{Path(__file__).resolve().parents[1]}")
    done = subprocess.run([sys.executable, "-m", "autograder", "check", "x.ipynb"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "does not have the course installed" in done.stderr


def test_runner_error_kind_by_class_not_by_name():
    import errno as errno_

    from autograder import runner

    assert runner._error_kind(MemoryError()) == "memory"
    assert runner._error_kind(OSError(errno_.ENOMEM, "Cannot allocate memory")) == "memory"
    assert runner._error_kind(OSError(errno_.ENOENT, "Cannot allocate memory")) == "raised"
    assert runner._error_kind(type("MemoryError", (Exception,), {})()) == "raised"


# --- the gradebook follows the registry's points ----------------------------------------------------


@pytest.mark.subprocess
def test_gradebook_sets_the_max_score_of_an_existing_grade_cell_to_the_registry_points(tmp_path):
    """A gradebook made when an exercise was worth other points (or by hand) gets the registry's points,
    so nbgrader's totals agree with grades.csv."""
    from nbgrader.api import Gradebook

    from autograder import gradebook

    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    book = gradebook.Recorder(url)  # puts this Python's alembic on PATH, which a new gradebook needs
    first = CH1.exercises[0]
    with Gradebook(url) as gb:
        gb.update_or_create_assignment(CH1.id)
        gb.update_or_create_notebook(CH1.id, CH1.id)
        gb.update_or_create_grade_cell(first.tests_id, CH1.id, CH1.id, max_score=first.points + 5.0,
                                       cell_type="code")
    rows = results.rows_for_all(CH1, "passed", "")
    book.record({"student": "alice", "submission": f"alice/{NB}", "chapter": CH1.id, "sha256": "0" * 64,
                 "rows": rows, "retry": False, "kind": "graded"})
    with Gradebook(url) as gb:
        cells = {c.name: c.max_score for c in gb.find_notebook(CH1.id, CH1.id).grade_cells}
        assert cells == {ex.tests_id: float(ex.points) for ex in CH1.exercises}
        assert gb.find_submission(CH1.id, "alice").score == CH1.points


def test_lockdown_restore_puts_back_patched_classes_and_modules_and_skips_only_classes_nothing_can_change():
    """The runner's :func:`lockdown.restore` (before each request and each answer) undoes a patch of a trusted module
    or of a class defined there; the snapshot leaves out only immutable classes, which no code can patch."""
    import torch

    from autograder import lockdown

    snapshot = lockdown.Snapshot()
    kept = {cls for _, _, classes in snapshot.modules.values() for cls, _ in classes.values()}
    skipped = [value for name in lockdown.TRUSTED_MODULES if name in sys.modules for value in
               vars(sys.modules[name]).values() if isinstance(value, type) and value.__module__ == name
               and value not in kept]
    assert len(skipped) >= 10 and torch.FloatTensor in skipped and torch.Tensor in kept
    for cls in skipped:
        with pytest.raises(TypeError, match="immutable"):
            cls._tdd_patched = True
    real_repr, real_dumps = torch.Tensor.__repr__, json.dumps
    try:
        torch.Tensor.__repr__ = lambda self: "patched"
        torch.Tensor._tdd_added = 1
        json.dumps = lambda *args, **kwargs: "{}"
        torch._tdd_added = 2
        lockdown.restore(snapshot)
        assert torch.Tensor.__repr__ is real_repr and json.dumps is real_dumps
        assert not hasattr(torch.Tensor, "_tdd_added") and not hasattr(torch, "_tdd_added")
    finally:
        torch.Tensor.__repr__, json.dumps = real_repr, real_dumps
        for owner in (torch.Tensor, torch):
            if hasattr(owner, "_tdd_added"):
                delattr(owner, "_tdd_added")
