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

from redteam.build import CH1, CH1_POINTS, WRONG_PADDING, insert_after_imports, set_cell, solved

NB = f"{CH1}.ipynb"
SECRET = b"HOST-SECRET-5b1d2e77"
FULL = sum(CH1_POINTS.values())


def expect(points: int | None = None, **statuses: str) -> dict:
    """Full marks except the exercises in ``statuses`` (0 points each), or an explicit total."""
    if points is None:
        points = FULL - sum(CH1_POINTS[ex] for ex in statuses)
    return {"points": points, "statuses": {ex: statuses.get(ex, "passed") for ex in CH1_POINTS}}


def _write(root: Path, student: bytes, nb, name: bytes = NB.encode()) -> Path:
    folder = Path(os.fsdecode(bytes(root) + b"/" + student))
    folder.mkdir(parents=True, exist_ok=True)
    path = Path(os.fsdecode(bytes(folder) + b"/" + name))
    nbformat.write(nb, path)
    return path


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


def build(root: Path, source_dir: Path, host: dict[str, Path]) -> dict[str, dict]:
    subs = Path(root) / "submissions"
    subs.mkdir(parents=True)
    honest = lambda: solved(CH1, source_dir)  # noqa: E731
    out: dict[str, dict] = {}

    def add(student: bytes, nb, expectation: dict, display: str | None = None) -> None:
        _write(subs, student, nb)
        out[display or student.decode()] = expectation

    def padding(cell: str, expectation: dict, student: str, *, in_function: bool = False) -> None:
        nb = honest()
        if in_function:  # the learner's function misbehaves when called
            body = "\n".join("    " + line for line in cell.splitlines())
            set_cell(nb, "padding_mask_solution", f"def padding_mask(tokens, pad_id):\n{body}\n")
        else:  # the cell that defines padding_mask misbehaves after defining it
            set_cell(nb, "padding_mask_solution", cell, append=True)
        add(student.encode(), nb, expectation)

    add(b"control", honest(), expect())

    # --- files and paths: never followed, never read beyond what is needed ---
    (subs / "link_peer").mkdir()
    os.symlink(subs / "control" / NB, subs / "link_peer" / NB)
    out["link_peer"] = expect(0, **{ex: "invalid" for ex in CH1_POINTS})
    (subs / "link_source").mkdir()
    os.symlink(Path(source_dir) / CH1 / NB, subs / "link_source" / NB)
    out["link_source"] = expect(0, **{ex: "invalid" for ex in CH1_POINTS})
    (subs / "link_secret").mkdir()
    os.symlink(host["secret"], subs / "link_secret" / NB)
    out["link_secret"] = expect(0, **{ex: "invalid" for ex in CH1_POINTS})
    os.symlink(subs / "control", subs / "link_folder")
    out["link_folder"] = expect(0, **{ex: "missing" for ex in CH1_POINTS})
    (subs / "fifo").mkdir()
    os.mkfifo(subs / "fifo" / NB)
    out["fifo"] = expect(0, **{ex: "invalid" for ex in CH1_POINTS})
    (subs / "sparse").mkdir()
    with open(subs / "sparse" / NB, "wb") as f:
        f.truncate(100 * 2**30)
    out["sparse"] = expect(0, **{ex: "invalid" for ex in CH1_POINTS})
    _write(subs, b"too_deep/1/2/3/4/5/6/7/8/9", honest())
    out["too_deep"] = expect(0, **{ex: "missing" for ex in CH1_POINTS})

    # --- names: any bytes; shown escaped, one-to-one, never as a formula or a terminal command ---
    add(b"stud\xffent", honest(), expect(), display="stud\\xffent")
    add(b"eve\rmallory", honest(), expect(), display="eve\\x0dmallory")
    add(b"=HYPERLINK(\"x\")", honest(), expect())
    add(b"+1", honest(), expect())
    add(b"@SUM(A1)", honest(), expect())
    add(b"a b", honest(), expect())
    nb = honest()
    set_cell(nb, "padding_mask_solution", WRONG_PADDING)
    add(b"a_b", nb, expect(padding_mask="failed"))  # "a b" and "a_b" must not share a feedback page
    add(b"n" * 240, honest(), expect())
    add(b"\x1b]52;c;aGVsbG8=\x07clip", honest(), expect(), display="\\x1b]52;c;aGVsbG8=\\x07clip")

    # --- one chapter, one notebook ---
    _write(subs, b"dup", honest())
    _write(subs, b"dup/old", honest(), name=f"{CH1}-Copy1.ipynb".encode())
    out["dup"] = expect()
    _write(subs, b"renamed", honest(), name=f"{CH1} (1).ipynb".encode())
    out["renamed"] = expect()

    # --- statuses from the grader's classification, never from a name the student chose ---
    padding("class MemoryError(Exception):\n    pass\nraise MemoryError('fake')", expect(padding_mask="error"),
            "named_memoryerror", in_function=True)
    padding("class Missing(Exception):\n    pass\nraise Missing('fake')", expect(padding_mask="error"),
            "named_missing", in_function=True)
    padding("raise ValueError('\\x1b[2J\\x1b]0;pwned\\x07 cleared')", expect(padding_mask="error"),
            "escape_message", in_function=True)

    # --- the kernel's answers are untrusted: deep, wrong shapes, huge ---
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
        nb = honest()
        insert_after_imports(nb, patch)
        add(student.encode(), nb, expect(0, **{ex: "any" for ex in CH1_POINTS}))  # sabotaged every answer

    # --- a kernel that stops reading its input, then a large cell is sent: every write has a deadline ---
    nb = honest()
    insert_after_imports(nb, "import os\n_keep = os.dup(0)\n_r, _w = os.pipe()\nos.dup2(_r, 0)\n")
    set_cell(nb, "padding_mask_solution", "# " + "x" * 300_000 + "\n" + "def padding_mask(tokens, pad_id):\n"
             "    return (tokens != pad_id)[:, None, None, :]\n")
    add(b"stops_reading", nb, expect(0, **{ex: "timeout" for ex in CH1_POINTS}))

    # --- the sandbox's files: deep chains, links to host files, the total written ---
    padding("import os\nos.chdir('/sandbox')\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n"
            f"os.symlink({str(host['secret'])!r}, '/sandbox/s')\nos.symlink({str(host['other'])!r}, '/tmp/o')\n"
            "os._exit(3)", expect(padding_mask="crashed"), "deep_scratch")
    nb = honest()  # correct only if it could write more than the sandbox's disk cap
    set_cell(nb, "padding_mask_solution", WRONG_PADDING + "import os\n_total = 0\nfor _dir in ('/sandbox', '/tmp'):\n"
             "    for _i in range(12):\n        try:\n"
             "            with open(f'{_dir}/f{_i}', 'wb') as _f:\n                _f.write(b'x' * (32 * 2**20))\n"
             "            _total += 32 * 2**20\n        except OSError:\n            break\n"
             "    for _i in range(12):  # clean up, so that only this exercise is affected\n"
             "        if os.path.exists(f'{_dir}/f{_i}'):\n            os.unlink(f'{_dir}/f{_i}')\n"
             "if _total > 300 * 2**20:\n    def padding_mask(tokens, pad_id):\n"
             "        return (tokens != pad_id)[:, None, None, :]\n")
    add(b"disk_filler", nb, expect(padding_mask="failed"))

    # --- the static pass on a very large cell ---
    nb = honest()
    big = "def padding_mask(tokens, pad_id):\n" + "    _x = (tokens + 1) * 2 - 1\n" * 14_000 + \
          "    return (tokens != pad_id)[:, None, None, :]\n"
    set_cell(nb, "padding_mask_solution", big)
    add(b"huge_cell", nb, expect())

    # --- delegation dodges the static pass alone would miss; the run-time rule does not ---
    for student, cell in (
        ("dodge_alias", "import torch.nn.functional as F\n_sm = F.softmax\n"),
        ("dodge_module", ""),
        ("dodge_getattr", ""),
        ("dodge_private", ""),
        ("dodge_log", ""),
    ):
        nb = honest()
        body = {
            "dodge_alias": "def softmax(x, dim=-1):\n    return _sm(x, dim)\n",
            "dodge_module": "import torch\ndef softmax(x, dim=-1):\n    return torch.nn.Softmax(dim)(x)\n",
            "dodge_getattr": "import torch\ndef softmax(x, dim=-1):\n    return getattr(torch, 'soft' + 'max')(x, dim)\n",
            "dodge_private": "import torch\ndef softmax(x, dim=-1):\n    return torch._softmax(x, dim, False)\n",
            "dodge_log": "def softmax(x, dim=-1):\n    return x.log_softmax(dim).exp()\n",
        }[student]
        if cell:
            insert_after_imports(nb, cell)
        set_cell(nb, "softmax_solution", body)
        # scaled_dot_product_attention calls the learner's softmax, so it delegates too (the same in the notebook)
        add(student.encode(), nb, expect(softmax="flagged", scaled_dot_product_attention="flagged"))
    return out
