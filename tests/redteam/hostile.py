"""The second red-team batch: hostile files and paths, batch breakers, output injection.

``build(root, source_dir, host)`` writes ``root/submissions/...`` (names are bytes: any
name Linux allows) and returns ``{student display name: expectation}`` where an
expectation is ``{"points": total, "statuses": {exercise: status}}`` for the chapter-1
notebook of that student, plus an honest control student. ``host`` holds files outside
every sandbox whose owner, mode and content must survive the batch, and a root-only
secret that must never appear in any output.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat

from redteam.build import (
    ATTACK_MISSING,
    BESIDE_ATTACK,
    CH1,
    CH1_POINTS,
    WRONG_PADDING,
    insert_after_imports,
    release,
    set_cell,
    solved,
)

NB = f"{CH1}.ipynb"
SECRET = b"HOST-SECRET-5b1d2e77"
DEEP_LEVELS = 1500  # folders above too_deep's notebook: past Python's recursion limit (1000)
FULL = sum(CH1_POINTS.values())


def expect(points: int | None = None, *, base: bool = True, **statuses: str) -> dict:
    """Full marks except the exercises in ``statuses`` (0 points each), or an explicit total. ``base``: the
    notebook is an attack's (:data:`~tests.redteam.build.BESIDE_ATTACK` solved, tiled_attention missing)."""
    if base:
        statuses = {**ATTACK_MISSING, **statuses}
    if points is None:
        points = FULL - sum(CH1_POINTS[ex] for ex in statuses)
    return {"points": points, "statuses": {ex: statuses.get(ex, "passed") for ex in CH1_POINTS}}


def _write(root: Path, student: bytes, nb, name: bytes = NB.encode()) -> Path:
    folder = Path(os.fsdecode(bytes(root) + b"/" + student))
    folder.mkdir(parents=True, exist_ok=True)
    path = Path(os.fsdecode(bytes(folder) + b"/" + name))
    nbformat.write(nb, path)
    return path


def _deep_tree(top: Path, levels: int, nb) -> None:
    """``top/d/d/…/d/NB``, ``levels`` folders deep (by descriptors: the path is longer than PATH_MAX)."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        out = os.open(NB, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        with os.fdopen(out, "w", encoding="utf-8") as f:
            nbformat.write(nb, f)
    finally:
        os.close(fd)


def host_files(host: Path) -> dict[str, Path]:
    """Files outside the sandbox: a root-only secret, and a file of another user."""
    host.mkdir(parents=True, exist_ok=True)
    secret = host / "secret.txt"
    secret.write_bytes(SECRET + b"\n")
    os.chmod(secret, 0o600)
    other = host / "other_user.txt"
    other.write_bytes(b"belongs to uid 4242\n")
    if os.geteuid() == 0:
        os.chown(other, 4242, 4242)
    os.chmod(other, 0o640)
    return {"secret": secret, "other": other}


class _Batch:
    """The submissions folder being written and the expectation of each student."""

    def __init__(self, subs: Path, source_dir: Path) -> None:
        self.subs, self.source_dir = subs, source_dir
        self.out: dict[str, dict] = {}

    def honest(self):
        """Every exercise solved: the control, and the attacks that need all of them."""
        return solved(CH1, self.source_dir)

    def base(self):
        """What an attack's notebook solves beside its attack (build.BESIDE_ATTACK)."""
        return solved(CH1, self.source_dir, BESIDE_ATTACK)

    def add(self, student: bytes, nb, expectation: dict, display: str | None = None) -> None:
        _write(self.subs, student, nb)
        self.out[display or student.decode()] = expectation

    def padding(self, cell: str, expectation: dict, student: str, *, in_function: bool = False) -> None:
        nb = self.base()
        if in_function:  # the learner's function misbehaves when called
            body = "\n".join("    " + line for line in cell.splitlines())
            set_cell(nb, "padding_mask_solution", f"def padding_mask(tokens, pad_id):\n{body}\n")
        else:  # the cell that defines padding_mask misbehaves after defining it
            set_cell(nb, "padding_mask_solution", cell, append=True)
        self.add(student.encode(), nb, expectation)


def build(root: Path, source_dir: Path, host: dict[str, Path]) -> dict[str, dict]:
    subs = Path(root) / "submissions"
    subs.mkdir(parents=True, exist_ok=True)  # the shared batch holds other corpora too (tests/batch.py)
    batch = _Batch(subs, Path(source_dir))
    batch.add(b"control", batch.honest(), expect(base=False))
    for section in (_files_and_paths, _names, _one_notebook_per_chapter, _statuses, _answers, _sandbox,
                    _static_pass, _dodges, _lockdown, _caps):
        section(batch, host)
    return batch.out


def _files_and_paths(batch: _Batch, host: dict[str, Path]) -> None:
    """Never followed, never read beyond what is needed."""
    subs, out, invalid = batch.subs, batch.out, expect(0, **{ex: "invalid" for ex in CH1_POINTS})
    (subs / "link_peer").mkdir()
    os.symlink(subs / "control" / NB, subs / "link_peer" / NB)
    out["link_peer"] = invalid
    (subs / "link_source").mkdir()
    os.symlink(batch.source_dir / CH1 / NB, subs / "link_source" / NB)
    out["link_source"] = invalid
    # nbgrader's course layout: submitted/<student>/<chapter>/<chapter>.ipynb beside source/<chapter>/<chapter>.ipynb
    (subs / "link_relative" / CH1).mkdir(parents=True)
    relative = subs / "link_relative" / CH1 / NB
    os.symlink(f"../../../source/{CH1}/{NB}", relative)
    assert relative.resolve() == (batch.source_dir / CH1 / NB).resolve(), "the source copy must be ROOT/source"
    out["link_relative"] = invalid
    (subs / "link_secret").mkdir()
    os.symlink(host["secret"], subs / "link_secret" / NB)
    out["link_secret"] = invalid
    os.symlink(subs / "control", subs / "link_folder")
    out["link_folder"] = expect(0, **{ex: "missing" for ex in CH1_POINTS})
    (subs / "fifo").mkdir()
    os.mkfifo(subs / "fifo" / NB)
    out["fifo"] = invalid
    (subs / "sparse").mkdir()
    with open(subs / "sparse" / NB, "wb") as f:
        f.truncate(100 * 2**30)
    out["sparse"] = invalid
    _deep_tree(subs / "too_deep", DEEP_LEVELS, batch.base())  # deep enough to have broken a recursive walk
    out["too_deep"] = expect(0, **{ex: "missing" for ex in CH1_POINTS})
    _write(subs, b".hidden", batch.base())  # not graded, and listed as skipped with the reason: not in `out`


def _names(batch: _Batch, host: dict[str, Path]) -> None:
    """Any bytes; shown escaped, one-to-one, never as a formula or a terminal command. The notebooks are the
    untouched release (graded in seconds: what is tested here is the name, not the answers)."""
    add, none = batch.add, expect(0, **{ex: "missing" for ex in CH1_POINTS})

    def untouched():
        return release(CH1)

    add(b"stud\xffent", untouched(), none, display="stud\\xffent")
    add(b"eve\rmallory", untouched(), none, display="eve\\x0dmallory")
    add(b"=HYPERLINK(\"x\")", untouched(), none)
    add(b"+1", untouched(), none)
    add(b"@SUM(A1)", untouched(), none)
    add(b"a b", batch.base(), expect())
    nb = batch.base()
    set_cell(nb, "padding_mask_solution", WRONG_PADDING)
    add(b"a_b", nb, expect(padding_mask="failed"))  # "a b" and "a_b" must not share a feedback page
    add(b"n" * 240, untouched(), none)
    add(b"\x1b]52;c;aGVsbG8=\x07clip", untouched(), none, display="\\x1b]52;c;aGVsbG8=\\x07clip")


def _one_notebook_per_chapter(batch: _Batch, host: dict[str, Path]) -> None:
    _write(batch.subs, b"dup", batch.base())
    _write(batch.subs, b"dup/old", batch.base(), name=f"{CH1}-Copy1.ipynb".encode())
    batch.out["dup"] = expect()
    _write(batch.subs, b"renamed", batch.base(), name=f"{CH1} (1).ipynb".encode())
    batch.out["renamed"] = expect()


def _statuses(batch: _Batch, host: dict[str, Path]) -> None:
    """From the grader's classification, never from a name the student chose."""
    batch.padding("class MemoryError(Exception):\n    pass\nraise MemoryError('fake')", expect(padding_mask="error"),
                  "named_memoryerror", in_function=True)
    batch.padding("class Missing(Exception):\n    pass\nraise Missing('fake')", expect(padding_mask="error"),
                  "named_missing", in_function=True)
    batch.padding("raise ValueError('\\x1b[2J\\x1b]0;pwned\\x07 cleared')", expect(padding_mask="error"),
                  "escape_message", in_function=True)


def _answers(batch: _Batch, host: dict[str, Path]) -> None:
    """The kernel's answers are untrusted (deep, wrong shapes, huge), and so is its reading of its input."""
    for student, payload in (
        ("deep_answer", "'{\"ok\": true, \"outputs\": \"' + '[' * 200000 + '\"}'"),
        ("list_answer", "'[1, 2, 3]'"),
        ("odd_answer", "'{\"ok\": true, \"outputs\": 5, \"inputs_after\": {\"x\": 1}, \"violation\": [1]}'"),
    ):
        patch = ("import json as _json\n_real = _json.dumps\n"
                 "def _fake(obj, *a, **k):\n"
                 "    if isinstance(obj, dict) and 'outputs' in obj:\n"
                 f"        return {payload}\n"
                 "    return _real(obj, *a, **k)\n"
                 "_json.dumps = _fake\n")
        nb = batch.base()
        insert_after_imports(nb, patch)
        # json is put back before every answer is framed (autograder/lockdown.py): the patch changes nothing
        batch.add(student.encode(), nb, expect())
    # a kernel that stops reading its input, then a large cell is sent: every write has a deadline
    nb = batch.base()
    insert_after_imports(nb, "import os\n_keep = os.dup(0)\n_r, _w = os.pipe()\nos.dup2(_r, 0)\n")
    set_cell(nb, "padding_mask_solution", "# " + "x" * 300_000 + "\n" + "def padding_mask(tokens, pad_id):\n"
             "    return (tokens != pad_id)[:, None, None, :]\n")
    batch.add(b"stops_reading", nb, expect(0, **{ex: "timeout" for ex in CH1_POINTS}))


def _sandbox(batch: _Batch, host: dict[str, Path]) -> None:
    """The sandbox's files: deep chains, links to host files, the total written."""
    batch.padding("import os\nos.chdir('/sandbox')\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n"
                  f"os.symlink({str(host['secret'])!r}, '/sandbox/s')\nos.symlink({str(host['other'])!r}, '/tmp/o')\n"
                  "os._exit(3)", expect(padding_mask="crashed"), "deep_scratch")
    nb = batch.base()  # correct only if it could write more than the sandbox's disk cap
    set_cell(nb, "padding_mask_solution", WRONG_PADDING + "import os\n_total = 0\nfor _dir in ('/sandbox', '/tmp'):\n"
             "    for _i in range(12):\n        try:\n"
             "            with open(f'{_dir}/f{_i}', 'wb') as _f:\n                _f.write(b'x' * (32 * 2**20))\n"
             "            _total += 32 * 2**20\n        except OSError:\n            break\n"
             "    for _i in range(12):  # clean up, so that only this exercise is affected\n"
             "        if os.path.exists(f'{_dir}/f{_i}'):\n            os.unlink(f'{_dir}/f{_i}')\n"
             "if _total > 300 * 2**20:\n    def padding_mask(tokens, pad_id):\n"
             "        return (tokens != pad_id)[:, None, None, :]\n")
    batch.add(b"disk_filler", nb, expect(padding_mask="failed"))


def _static_pass(batch: _Batch, host: dict[str, Path]) -> None:
    """A very large cell (test_hostile_batch_static_pass_on_a_huge_cell_is_quick reads its time)."""
    nb = batch.base()
    big = "def padding_mask(tokens, pad_id):\n" + "    _x = (tokens + 1) * 2 - 1\n" * 14_000 + \
          "    return (tokens != pad_id)[:, None, None, :]\n"
    set_cell(nb, "padding_mask_solution", big)
    batch.add(b"huge_cell", nb, expect())


DODGES = {  # student -> (a cell after the imports, the softmax cell)
    "dodge_alias": ("import torch.nn.functional as F\n_sm = F.softmax\n",
                    "def softmax(x, dim=-1):\n    return _sm(x, dim)\n"),
    "dodge_module": ("", "import torch\ndef softmax(x, dim=-1):\n    return torch.nn.Softmax(dim)(x)\n"),
    "dodge_getattr": ("", "import torch\ndef softmax(x, dim=-1):\n    return getattr(torch, 'soft' + 'max')(x, dim)\n"),
    "dodge_private": ("", "import torch\ndef softmax(x, dim=-1):\n    return torch._softmax(x, dim, False)\n"),
    "dodge_log": ("", "def softmax(x, dim=-1):\n    return x.log_softmax(dim).exp()\n"),
    # PyTorch's function modes switched off around the call, every name built from pieces (no name the
    # static pass knows appears): for the run-time guard alone
    "dodge_disable_modes": ("", "import importlib\nimport torch\ndef softmax(x, dim=-1):\n"
                                "    modes = importlib.import_module('torch.utils._python' + '_dispatch')\n"
                                "    with getattr(torch._C, 'Disable' + 'TorchFunction')(), "
                                "getattr(modes, '_disable_' + 'current_modes')():\n"
                                "        return getattr(torch, 'soft' + 'max')(x, dim)\n"),
}


def _dodges(batch: _Batch, host: dict[str, Path]) -> None:
    """Delegation dodges the static pass alone would miss; the run-time rule does not."""
    for student, (cell, body) in DODGES.items():
        nb = batch.base()
        if cell:
            insert_after_imports(nb, cell)
        set_cell(nb, "softmax_solution", body)
        # scaled_dot_product_attention calls the learner's softmax, so it delegates too (the same in the notebook)
        batch.add(student.encode(), nb, expect(softmax="flagged", scaled_dot_product_attention="flagged"))


# The third round: the rule that decides points, attacked from the learner's own process. Each student is the
# control with one change; what must hold is the status and the points (0 for the exercise that delegates).
THREAD = ("import queue as _queue\nimport threading as _threading\nimport torch as _torch\n"
          "_jobs, _done = _queue.Queue(), _queue.Queue()\n"
          "def _helper():\n    while True:\n        _x, _dim = _jobs.get()\n"
          "        _done.put(_torch.softmax(_x, _dim))\n"
          "_threading.Thread(target=_helper, daemon=True).start()\n")
LAZY = ("import torch\n"
        "class _Lazy(torch.Tensor):\n"
        "    @classmethod\n"
        "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
        "        args = [torch.softmax(a._src, a._dim) if isinstance(a, _Lazy) else a for a in args]\n"
        "        with torch._C.DisableTorchFunctionSubclass():\n"
        "            return func(*args, **(kwargs or {}))\n"
        "def softmax(x, dim=-1):\n"
        "    out = torch.empty_like(x).as_subclass(_Lazy)\n"
        "    out._src, out._dim = x, dim\n"
        "    return out\n")
ROUND3 = {  # student -> (a cell after the imports, the softmax cell, what softmax and the attention that calls it get)
    # a thread started in an earlier cell does the forbidden call: no check runs beside it (every exercise)
    "thread_earlier": (THREAD, "def softmax(x, dim=-1):\n    _jobs.put((x, dim))\n    return _done.get()\n", "all"),
    # the guard's state reached through the module table or the garbage collector, then switched off
    "guard_reach": ("import gc, sys\n_g = sys.modules.get('autograder.checks.guard')\n"
                    "try:\n    _objects = gc.get_objects()\nexcept PermissionError:\n    _objects = []\n"
                    "if _g is not None:\n    _g._CURRENT = None\n",
                    "import torch\ndef softmax(x, dim=-1):\n    return torch.softmax(x, dim)\n", "flagged"),
    # code compiled under a library's file name (library frames are trusted by their file)
    "library_filename": ("", "import torch\nexec(compile('def softmax(x, dim=-1):\\n    return torch.softmax(x, dim)\\n', "
                             "torch.__file__, 'exec'))\n", "any"),
    # a trace function silences every profile hook
    "settrace": ("", "import sys, torch\ndef softmax(x, dim=-1):\n    sys.settrace(lambda *a: None)\n"
                     "    return torch.softmax(x, dim)\n", "any"),
    # PyTorch's pure-Python reference implementation: nothing named softmax is called at the C level
    "dodge_refs": ("", "import torch._refs\ndef softmax(x, dim=-1):\n    return torch._refs.softmax(x, dim)\n", "flagged"),
    # a TorchScript function that calls softmax
    "dodge_torchscript": ("", "import torch\n@torch.jit.script\ndef _sm(x: torch.Tensor, dim: int) -> torch.Tensor:\n"
                              "    return torch.softmax(x, dim)\ndef softmax(x, dim=-1):\n    return _sm(x, dim)\n", "any"),
    # a tensor subclass that computes its values when it is read, after the function returned
    "lazy_subclass": ("", LAZY, "any"),
}


def _lockdown(batch: _Batch, host: dict[str, Path]) -> None:
    """Round 3: the no-delegation rule cannot be switched off from the learner's process; an honest
    autograd.Function is not penalised; tiled_attention's memory rule sees memory numpy holds."""
    for student, (cell, body, outcome) in ROUND3.items():
        nb = batch.honest() if outcome == "all" else batch.base()  # a thread flags every exercise, answered or not
        if cell:
            insert_after_imports(nb, cell)
        set_cell(nb, "softmax_solution", body)
        if outcome == "all":
            expectation = expect(0, base=False, **{ex: "flagged" for ex in CH1_POINTS})
        else:
            expectation = expect(softmax=outcome, scaled_dot_product_attention=outcome)
        batch.add(student.encode(), nb, expectation)
    nb = batch.base()  # an honest softmax written as an autograd.Function: full marks
    set_cell(nb, "softmax_solution", "import torch\nclass _Softmax(torch.autograd.Function):\n"
             "    @staticmethod\n    def forward(ctx, x, dim):\n"
             "        e = (x - x.amax(dim=dim, keepdim=True)).exp()\n        y = e / e.sum(dim=dim, keepdim=True)\n"
             "        ctx.save_for_backward(y)\n        ctx.dim = dim\n        return y\n"
             "    @staticmethod\n    def backward(ctx, g):\n        (y,) = ctx.saved_tensors\n"
             "        return y * (g - (g * y).sum(dim=ctx.dim, keepdim=True)), None\n"
             "def softmax(x, dim=-1):\n    return _Softmax.apply(x, dim)\n")
    batch.add(b"honest_autograd_function", nb, expect())
    nb = batch.honest()  # the whole score matrix, built in numpy: right values, the memory rule broken
    set_cell(nb, "tiled_attention_solution",
             "import math\nimport numpy as np\nimport torch\n"
             "def tiled_attention(q, k, v, block_size=64):\n"
             "    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:\n"
             "        raise ValueError(f'block_size must be a positive int; got {block_size!r}')\n"
             "    if k.shape[-2] != v.shape[-2] or k.shape[-2] < 1:\n"
             "        raise ValueError('k and v must have the same seq_k >= 1')\n"
             "    qn, kn, vn = (t.detach().double().numpy() for t in (q, k, v))\n"
             "    s = qn @ np.swapaxes(kn, -1, -2) / math.sqrt(qn.shape[-1])\n"
             "    e = np.exp(s - s.max(axis=-1, keepdims=True))\n"
             "    out = (e / e.sum(axis=-1, keepdims=True)) @ vn\n"
             "    return torch.from_numpy(out).to(q.dtype)\n")
    batch.add(b"numpy_tiled", nb, expect(base=False, tiled_attention="any"))


def _caps(batch: _Batch, host: dict[str, Path]) -> None:
    """What one file can cost the grader, and what one student can change for the others: caps checked on the
    raw bytes before parsing, nbformat's warnings counted, a chapter taken from the assignment folder."""
    invalid = expect(0, **{ex: "invalid" for ex in CH1_POINTS})
    nb = batch.base()  # 50,000 empty cells: refused at once, not run until the notebook's time is up
    nb.cells += [nbformat.v4.new_code_cell("") for _ in range(50_000)]
    batch.add(b"many_cells", nb, invalid)
    nb = batch.base()  # 300,000 empty JSON objects in the metadata: refused before parsing
    nb.metadata["bomb"] = [{}] * 300_000
    batch.add(b"containers_bomb", nb, invalid)
    nb = batch.base()  # 1,500 raw cells: never run, and cheap to read
    nb.cells += [nbformat.v4.new_raw_cell(f"raw {i}") for i in range(1_500)]
    batch.add(b"raw_cells", nb, expect())
    nb = nbformat.writes(batch.base())  # two cells with one id: nbformat warns; graded all the same
    data = __import__("json").loads(nb)
    ids = [c["id"] for c in data["cells"]]
    data["cells"][1]["id"] = ids[0]
    path = Path(os.fsdecode(bytes(batch.subs) + b"/dup_ids")) / NB
    path.parent.mkdir(parents=True)
    path.write_text(__import__("json").dumps(data))
    batch.out["dup_ids"] = expect()
    # a notebook named after chapter 6 in a chapter-1 assignment folder: invalid for that student alone (the
    # others owe what the instructor gave with --chapter, nothing more)
    folder = Path(os.fsdecode(bytes(batch.subs) + b"/wrong_folder")) / CH1
    folder.mkdir(parents=True)
    nbformat.write(batch.base(), folder / "06_kv_cache_inference.ipynb")
    batch.out["wrong_folder"] = invalid  # charged to the folder's assignment, chapter 1
    batch.padding("import torch\nreturn torch.empty(0, 2**40, 2**40, dtype=torch.bool)",
                  expect(padding_mask="any"), "absurd_shape", in_function=True)
