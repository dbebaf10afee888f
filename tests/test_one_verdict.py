"""One verdict everywhere: the notebook's own test cells, ``nbgrader autograde`` and ``autograder grade``
give the same points to the same submissions.

The submissions are the chapter releases with the source's solutions filled in, then, per chapter, some
exercises replaced by a delegating answer (it calls the PyTorch function or the library code the exercise
asks for) or by one that changes its inputs in place; the rest stays honest, and one chapter-1 submission is
honest throughout. Each is graded three ways:

* **notebook** — the release, run top to bottom in a kernel: an exercise scores when its visible test cell
  runs without an error (what a learner sees);
* **nbgrader** — ``nbgrader autograde`` in a temporary course (visible and hidden tests);
* **grade** — ``python -m autograder grade`` (sandboxed kernel, fresh seeds, hidden tests).

All three must agree with each other and with the expected points, exercise by exercise.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from autograder import registry, sandbox
from autograder.kernel_client import SlicedKernelManager
from autograder.release import CONFIG_FILE, make_course_dir
from redteam import build as redteam

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "autograder" / "source"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.sandbox,
    pytest.mark.skipif(sandbox.detect() != "bwrap", reason="bubblewrap (bwrap) is not usable here: "
                       "autograder grade cannot run its sandbox"),
]

CH1, CH2, CH3 = (c.id for c in registry.CHAPTERS[:3])

IN_PLACE_SCORES = '''
def attention_scores(q, k):
    """q @ kᵀ / √d_k, scaling q in place to save memory: the caller's q changes too."""
    q.mul_(1.0 / math.sqrt(q.shape[-1]))
    return einsum(q, k, "... seq_q d_head, ... seq_k d_head -> ... seq_q seq_k")
'''
DELEGATING_SOFTMAX = '''
def softmax(x, dim=-1):
    return torch.log_softmax(x, dim).exp()
'''
DELEGATING_SDPA = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = getattr(torch, "soft" + "max")(scores, dim=-1)
    if mask is not None:
        weights = weights * mask.any(dim=-1, keepdim=True)
    return weights @ v, weights
'''
DELEGATING_MHA = '''
_Honest = MultiHeadAttention


class MultiHeadAttention(_Honest):
    def forward(self, x, context=None, mask=None, *, is_causal=False):
        theirs = nn.MultiheadAttention(self.d_model, self.n_heads, batch_first=True)
        kv = x if context is None else context
        return theirs(x, kv, kv, need_weights=False)[0]
'''
IN_PLACE_ROPE = '''
def apply_rope(x, start_pos=0, base=10000.0):
    """Rotates the pairs of x in place (and returns it): the caller's queries and keys change."""
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, heads, seq, d_head); got shape {tuple(x.shape)}")
    if x.shape[-1] % 2:
        raise ValueError(f"d_head={x.shape[-1]} must be even")
    if not isinstance(start_pos, int) or start_pos < 0:
        raise ValueError(f"start_pos must be a non-negative int; got {start_pos!r}")
    angle = rope_angles(x.shape[-2], x.shape[-1], start_pos, base)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., 0::2].clone(), x[..., 1::2].clone()
    x[..., 0::2] = even * cos - odd * sin
    x[..., 1::2] = even * sin + odd * cos
    return x
'''
DELEGATING_ROPE_COMPLEX = '''
def apply_rope_complex(x, start_pos=0, base=10000.0):
    return apply_rope(x.clone(), start_pos, base)  # the cos/sin rotation of exercise 3
'''

# student -> (chapter, {exercise: replacement solution cell}); the other exercises keep the honest solution
SUBMISSIONS = {
    "honest": (CH1, {}),
    "mixed1": (CH1, {"attention_scores": IN_PLACE_SCORES, "softmax": DELEGATING_SOFTMAX,
                     "scaled_dot_product_attention": DELEGATING_SDPA}),
    "mixed2": (CH2, {"MultiHeadAttention": None}),  # None: the delegating subclass is appended to the honest class
    "mixed3": (CH3, {"apply_rope": IN_PLACE_ROPE, "apply_rope_complex": DELEGATING_ROPE_COMPLEX}),
}


def expected_points(student: str) -> dict[str, float]:
    chapter, changed = SUBMISSIONS[student]
    return {ex.name: 0.0 if ex.name in changed else float(ex.points) for ex in registry.get(chapter).exercises}


def submission(student: str) -> nbformat.NotebookNode:
    chapter, changed = SUBMISSIONS[student]
    nb = redteam.solved(chapter, SOURCE)
    for exercise, code in changed.items():
        if code is None:
            redteam.set_cell(nb, f"{exercise}_solution", DELEGATING_MHA, append=True)
        else:
            redteam.set_cell(nb, f"{exercise}_solution", code)
    return nb


def kernel_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg", TDD_QUICK="1")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def notebook_points(nb: nbformat.NotebookNode, chapter: registry.Chapter, cwd: Path) -> dict[str, float]:
    """Run the notebook as a learner would; an exercise scores when its test cell raised nothing."""
    nb = nbformat.from_dict(nb)
    client = NotebookClient(nb, kernel_manager_class=SlicedKernelManager, timeout=600, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(cwd)}})
    with client.setup_kernel(env=kernel_env()):
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
    points = {}
    for cell in nb.cells:
        meta = _meta(cell)
        if meta.get("grade") and not meta.get("solution"):
            name = meta["grade_id"].removesuffix("_tests")
            failed = any(o.get("output_type") == "error" for o in cell.get("outputs", []))
            points[name] = 0.0 if failed else float(chapter.exercise(name).points)
    return points


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("one-verdict")
    notebooks = {student: submission(student) for student in SUBMISSIONS}

    # 1. the notebook, as a learner runs it
    results = {"notebook": {}}
    for student, nb in notebooks.items():
        cwd = root / "run" / student
        cwd.mkdir(parents=True)
        results["notebook"][student] = notebook_points(nb, registry.get(SUBMISSIONS[student][0]), cwd)

    # 2. nbgrader autograde in a temporary course
    course = root / "nbgrader"
    course.mkdir()
    (course / "nbgrader_config.py").write_text(CONFIG_FILE.read_text())
    chapters = sorted({chapter for chapter, _ in SUBMISSIONS.values()})
    make_course_dir(course, names=chapters)
    for chapter in chapters:
        _nbgrader(course, "generate_assignment", chapter)
    for student, nb in notebooks.items():
        chapter = SUBMISSIONS[student][0]
        target = course / "submitted" / student / chapter / f"{chapter}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)
    for chapter in chapters:
        _nbgrader(course, "autograde", chapter)
    from nbgrader.api import Gradebook

    results["nbgrader"] = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for student, (chapter, _) in SUBMISSIONS.items():
            grades = gb.find_submission(chapter, student).notebooks[0].grades
            results["nbgrader"][student] = {g.name.removesuffix("_tests"): float(g.score) for g in grades}

    # 3. autograder grade, sandboxed
    subs = root / "submissions"
    for student, nb in notebooks.items():
        chapter = SUBMISSIONS[student][0]
        (subs / student).mkdir(parents=True)
        nbformat.write(nb, subs / student / f"{chapter}.ipynb")
    out = root / "out" / "grades.csv"
    out.parent.mkdir()
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", str(subs), "--out", str(out), "--jobs", "2",
                           "--gradebook", "none", "--cell-timeout", "60", "--notebook-timeout", "600"],
                          capture_output=True, text=True, cwd=REPO, env=kernel_env())
    assert done.returncode == 0, done.stderr[-3000:]
    results["grade"], results["reasons"] = {}, {}
    with open(out, newline="") as f:
        for row in csv.DictReader(f):
            if row["notebook"] != f"{row['student']}/{SUBMISSIONS[row['student']][0]}.ipynb":
                continue  # the chapters this student did not submit (graded "missing")
            results["grade"].setdefault(row["student"], {})[row["exercise"]] = float(row["points"])
            results["reasons"][(row["student"], row["exercise"])] = f"{row['status']}: {row['reason']}"
    return results


def _nbgrader(course: Path, *args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args, "--force"], cwd=course, env=kernel_env(),
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("student", list(SUBMISSIONS))
def test_one_verdict_same_points_in_notebook_nbgrader_and_grade(graded, student):
    expected = expected_points(student)
    got = {way: graded[way][student] for way in ("notebook", "nbgrader", "grade")}
    reasons = {ex: graded["reasons"].get((student, ex), "") for ex in expected}
    for way, points in got.items():
        assert points == expected, f"{student}, {way}: {points} != expected {expected}; grade said {reasons}"


def test_one_verdict_names_the_rule_that_was_broken(graded):
    reasons = graded["reasons"]
    assert reasons[("mixed1", "softmax")].startswith("flagged") and "log_softmax" in reasons[("mixed1", "softmax")]
    assert reasons[("mixed1", "scaled_dot_product_attention")].startswith("flagged")
    assert reasons[("mixed2", "MultiHeadAttention")].startswith("flagged")
    assert reasons[("mixed3", "apply_rope_complex")].startswith("flagged")
    for student, exercise in (("mixed1", "attention_scores"), ("mixed3", "apply_rope")):
        assert reasons[(student, exercise)].startswith("failed") and "in place" in reasons[(student, exercise)]
