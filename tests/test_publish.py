"""The student edition (`python -m autograder publish`): it works for a learner and hides what it must."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import editions
from autograder import publish, registry
from autograder.kernel_client import SlicedKernelManager

ROOT = Path(__file__).resolve().parent.parent
FIRST = registry.CHAPTERS[0]
SOLUTION_MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)


def _publish(dest: Path, *answers: str) -> subprocess.CompletedProcess:
    args = [a for chapter in answers for a in ("--answers", chapter)]
    return subprocess.run([sys.executable, "-m", "autograder", "publish", str(dest), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def _in_edition(edition: Path, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` with the edition's packages first on the path (as its own install would)."""
    env = {**os.environ, "PYTHONPATH": str(edition)}
    return subprocess.run([sys.executable, "-c", code], cwd=edition, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="session")
def edition() -> Path:
    """SESSION FIXTURE (tests/editions.py): the default student edition, built once per test process."""
    return editions.default_edition()


@pytest.fixture(scope="session")
def republished(edition, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """SESSION FIXTURE: the default edition as an instructor pushed it (a copy, with a git folder), then
    `python -m autograder publish DEST --answers <chapter 1>` run on it (chapter 1's answers released, as while
    learners work on chapter 2): the folder and that command's result."""
    dest = tmp_path_factory.mktemp("republished") / "student"
    shutil.copytree(edition, dest)
    (dest / ".git").mkdir()
    (dest / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return dest, _publish(dest, FIRST.id)


@pytest.mark.slow
def test_student_edition_has_no_solution_region_hidden_test_or_source(edition):
    assert not (edition / "autograder" / "source").exists()
    assert not (edition / "tests").exists()
    for path in edition.rglob("*"):
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.suffix == ".ipynb":
            text = "\n".join("".join(c.get("source", "")) for c in json.loads(text)["cells"])
        assert not publish.REGION.search(text), f"{path.relative_to(edition)} has a solution or hidden-test region"


def _hidden_arguments(source: str) -> list[str]:
    """The hidden-cases argument of every Check(...) call in ``source``, as source text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Check":
            found += [ast.unparse(v) for v in [kw.value for kw in node.keywords if kw.arg == "hidden"] + node.args[2:3]]
    return found


@pytest.mark.slow
def test_student_edition_checks_have_no_hidden_case(edition):
    # Chapter 1's checks import in the edition (its answers withheld): no Check has a hidden case.
    code = ("import json; from autograder import registry\n"
            f"print(json.dumps({{n: len(k.hidden) for n, k in registry.get({FIRST.id!r}).load_checks().items()}}))")
    out = _in_edition(edition, code)
    assert out.returncode == 0, out.stderr
    counts = json.loads(out.stdout)
    assert counts and set(counts.values()) == {0}, counts
    # Every chapter's checks module, read: each Check's hidden cases are ().
    for chapter in registry.CHAPTERS:
        source = (edition / Path(*chapter.checks.split("."))).with_suffix(".py").read_text()
        assert set(_hidden_arguments(source)) <= {"()"}, chapter.checks
        original = (ROOT / Path(*chapter.checks.split("."))).with_suffix(".py").read_text()
        assert set(_hidden_arguments(original)) - {"()"}, f"{chapter.checks}: no hidden case to remove in the source"
    hidden = publish.hidden_case_names()
    assert any(hidden.values()), "the instructor's checks have hidden cases: the test would prove nothing"
    for chapter in registry.CHAPTERS:
        source = (edition / Path(*chapter.checks.split("."))).with_suffix(".py").read_text()
        strings = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not hidden[chapter.checks] & strings, f"{chapter.checks}: hidden cases left in the edition"


@pytest.mark.slow
def test_student_edition_withholds_every_answer_module_by_default(edition):
    for chapter in registry.CHAPTERS:
        for module in chapter.answers:
            path = (edition / Path(*module.split("."))).with_suffix(".py")
            text = path.read_text()
            for exercise in chapter.exercises:
                if exercise.module == module:
                    assert not re.search(rf"\b(def|class) {exercise.target}\b", text), f"{module}:{exercise.target}"
            out = _in_edition(edition, f"import {module}")
            assert out.returncode != 0 and "withheld in this student edition" in out.stderr, out.stderr[-500:]
    assert json.loads((edition / publish.MARKER).read_text())["answers"] == []


@pytest.mark.slow
def test_student_edition_runs_chapter_1_with_a_learners_answers(edition, monkeypatch):
    """The learner's notebook, answers filled in: every visible test passes with the answers withheld."""
    notebook = edition / "course" / FIRST.id / FIRST.notebook
    nb = nbformat.read(notebook, as_version=4)
    source = nbformat.read(FIRST.source_path(), as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: SOLUTION_MARKERS.sub("", c.source)
               for c in source.cells if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = answers[cell.metadata["nbgrader"]["grade_id"]]
    monkeypatch.setenv("PYTHONPATH", str(edition))
    monkeypatch.setenv("TDD_QUICK", "1")
    nb.cells.insert(0, nbformat.v4.new_code_cell("import autograder, solutions\nprint('from', autograder.__file__, solutions.__file__)"))
    NotebookClient(nb, kernel_manager_class=SlicedKernelManager, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(notebook.parent)}}).execute()
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert printed.count(f"from {edition}") == 1 and str(ROOT / "solutions") not in printed.split("\n")[0]
    assert not errors, [f"{e.ename}: {e.evalue}" for e in errors]
    assert printed.count("visible checks passed") == len(FIRST.exercises), printed[-2000:]

    out = subprocess.run([sys.executable, "-m", "autograder", "check", str(notebook)], cwd=edition,
                         env={**os.environ}, capture_output=True, text=True, timeout=600)
    # the untouched release in the edition: the self-check runs there and scores 0
    assert out.returncode == 0, out.stderr
    assert f"visible score: 0/{FIRST.points}" in out.stdout, out.stdout


@pytest.mark.slow
def test_publish_again_releases_a_chapters_answers_and_keeps_git(edition, republished):
    # the first edition, as built (tests/editions.py): chapter 1 open, its answers withheld
    assert any(note.startswith("withheld solutions.attention") for note in editions.default_edition.notes)
    assert json.loads((edition / publish.MARKER).read_text())["chapters"] == [FIRST.id]
    dest, out = republished
    assert out.returncode == 0, out.stdout + out.stderr
    assert "withheld solutions.attention" not in out.stdout and f"answers released: {FIRST.id})" in out.stdout, out.stdout
    for module in FIRST.answers:
        path = Path(*module.split(".")).with_suffix(".py")
        assert (dest / path).read_text() == (ROOT / path).read_text()
    assert (dest / ".git" / "HEAD").is_file()
    assert json.loads((dest / publish.MARKER).read_text())["answers"] == [FIRST.id]
    # the chapters that waited only for chapter 1's answers open with them
    waiting = [c.id for c in registry.CHAPTERS if registry.prerequisites(c.id) == (FIRST.id,)]
    assert waiting and all((dest / "course" / c / f"{c}.ipynb").is_file() for c in waiting)
    assert json.loads((dest / publish.MARKER).read_text())["chapters"] == [FIRST.id, *waiting]


@pytest.mark.slow
def test_publish_refuses_a_folder_that_is_not_an_edition_and_the_repository(tmp_path):
    dest = tmp_path / "thesis"
    dest.mkdir()
    (dest / "chapter1.tex").write_text("mine")
    out = _publish(dest)
    assert out.returncode == 1 and "not an earlier student edition" in out.stderr
    assert (dest / "chapter1.tex").read_text() == "mine"
    out = _publish(ROOT / "solutions")
    assert out.returncode == 1 and "outside the repository" in out.stderr
    out = _publish(tmp_path / "x", "99_nothing")
    assert out.returncode == 1 and "no such chapter" in out.stderr


def test_strip_hidden_removes_hidden_cases_and_their_private_helpers():
    source = '''
from autograder.checks.core import Case, Check

def _shared(g): return {}
def _only_hidden(g): return {}
def _judge(i, o): pass
CHECKS = {
    "f": Check(name="f", visible=(Case("v", _shared, "call", _judge),),
               hidden=(Case("secret edge case", _only_hidden, "call", _judge),), forbidden=("x",)),
    "g": Check("g", (Case("v2", _shared, "call", _judge),), (Case("another secret", _only_hidden, "call", _judge),)),
}
'''
    stripped = publish.strip_hidden(source)
    assert "secret" not in stripped and "_only_hidden" not in stripped
    assert "_shared" in stripped and 'forbidden=("x",)' in stripped and "hidden=()" in stripped
    namespace: dict = {}
    exec(compile(stripped, "<checks>", "exec"), namespace)
    assert all(check.hidden == () and len(check.visible) == 1 for check in namespace["CHECKS"].values())


def test_withheld_modules_follow_imports():
    withheld = publish.withheld_modules(set())
    assert set(registry.answer_modules()) <= set(withheld)
    everything = publish.withheld_modules(set(registry.ids()))
    assert not set(registry.answer_modules()) & set(everything)
    if len(registry.CHAPTERS) > 1:
        second = registry.CHAPTERS[1]
        needs_first = any(m in publish.imported_modules((ROOT / Path(*a.split("."))).with_suffix(".py").read_text())
                          for a in second.answers for m in FIRST.answers)
        if needs_first:
            with pytest.raises(publish.PublishError, match="release that chapter's answers too"):
                publish.withheld_modules({second.id})


def test_make_student_edition_passes_dest_and_answers():
    out = subprocess.run(["make", "-n", "-C", str(ROOT), "-o", ".venv/.installed", "student-edition",
                          "DEST=../student", "ANSWERS=01_a 02_b"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "-m autograder publish \"../student\" --answers 01_a --answers 02_b" in out.stdout
    usage = subprocess.run(["make", "-C", str(ROOT), "-o", ".venv/.installed", "student-edition"],
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode != 0 and "usage: make student-edition DEST=folder" in usage.stdout


def _visible_verdicts(repo: Path) -> dict:
    """tests/visible_verdicts.py in ``repo`` (this repository or an edition): the references and mutants come
    from this repository's modules, the checks and ``solutions`` from ``repo``."""
    exercises = json.dumps([[c.checks, e.name, e.reference] for c in registry.CHAPTERS for e in c.exercises])
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "visible_verdicts.py"), str(ROOT), exercises],
                         cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.slow
def test_student_edition_visible_verdicts_match_the_repository(edition):
    """Every chapter withheld: the visible checks replay the reference's recorded results and give the same
    verdict and hint as here, for the reference answers and for every planted bug."""
    here, there = _visible_verdicts(ROOT), _visible_verdicts(edition)
    assert here["solutions"] == str(ROOT / "solutions") and there["solutions"] == str(edition / "solutions")
    assert not any(here["replayed"].values())
    compared = [c.checks for c in registry.CHAPTERS]  # each computes its answers in @core.recorded functions
    assert sorted(m for m, replayed in there["replayed"].items() if replayed) == sorted(compared)
    for chapter in registry.CHAPTERS:
        references = {k: v for k, v in here["verdicts"].items() if k.startswith(f"reference {chapter.checks}:")}
        assert len(references) == len(chapter.exercises) and all(p for p, _ in references.values()), references
        mutants = {k: v for k, v in here["verdicts"].items() if k.startswith(f"mutant {chapter.checks}:")}
        assert sum(not p for p, _ in mutants.values()) >= 2, f"{chapter.id}: fewer than two mutants caught"
    differ = {k: (v, there["verdicts"].get(k)) for k, v in here["verdicts"].items() if there["verdicts"].get(k) != v}
    assert not differ, differ
    assert there["verdicts"].keys() == here["verdicts"].keys()


def _plain_values(value) -> list:
    """Every leaf of recorded data; TypeError for anything but tensors, numbers, strings and containers."""
    import torch

    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _plain_values(k) + _plain_values(v)]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _plain_values(v)]
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor, torch.dtype, torch.Size)):
        return [value]
    raise TypeError(type(value).__name__)


@pytest.mark.slow
def test_student_edition_recordings_are_data_and_the_checks_hold_no_reference_code(edition):
    import zipfile

    import torch

    folder = edition / "autograder" / "checks" / "recorded"
    files = sorted(folder.iterdir())
    assert [p.stem for p in files] == sorted(c.checks.rsplit(".", 1)[1] for c in registry.CHAPTERS)
    # Every visible case of six chapters, with the known mistakes a judge names: about 255 KiB. A bound that
    # catches a recording gone wrong (a model's weights, a tensor per seed) while leaving room for a chapter.
    assert sum(p.stat().st_size for p in files) < 512 * 1024
    for path in files:
        assert all(not n.endswith(".py") for n in zipfile.ZipFile(path).namelist())
        table = torch.load(path, weights_only=True)  # refuses anything that is not plain data
        assert table and all(isinstance(k, str) for k in table)
        strings = [v for v in _plain_values(list(table.values())) if isinstance(v, str)]
        assert not [s for s in strings if re.search(r"\b(def|return|import|lambda)\b|[(){}=]", s)], strings[:5]
    for chapter in registry.CHAPTERS:
        source = (edition / Path(*chapter.checks.split("."))).with_suffix(".py").read_text()
        # the reference is named only where it is imported; the functions that computed with it are empty
        assert not re.search(r"\b(ref|reference|multihead|transformer)\.\w+", source.replace("core.reference(", "")), \
            chapter.checks
        assert not re.search(r"\b(_decoder_by_hand|_by_hand|_sdpa_of|_grad_norm_of)\b", source), chapter.checks
    # a call that was not recorded (another seed, say) says why it cannot be checked here
    out = _in_edition(edition, "from autograder.checks import positional, core\n"
                               "try:\n    positional._ref_slopes(99)\n"
                               "except core.ReferenceWithheld as err:\n    print(err)\n")
    assert out.returncode == 0 and "runs in your instructor's grading only" in out.stdout, out.stdout + out.stderr
    out = _in_edition(edition, "import solutions.positional")
    assert out.returncode != 0 and "withheld in this student edition" in out.stderr


@pytest.mark.slow
def test_student_edition_checks_compute_no_withheld_answer(edition):
    """Every chapter withheld: no code of the edition's checks computes a withheld exercise's answer.

    Why a trace and not a rule on the source: an answer is computed inline in a judge as often as in a helper
    (``expected = j <= i + (seq_k - seq_q)``), or by a helper whose default arguments give the answer while the
    checks only call it with a mistake's (``_sinusoid_variant``). No rule on the source can tell a one-line
    answer from a one-line mistake or property, but its value can: tests/edition_leaks.py runs each visible
    case in the edition, judging the outputs of the reference and of every planted mistake (so the hint paths
    run), and calls each private function with the case's inputs, while it labels every tensor by where it
    came from. A tensor that the checks computed from the inputs (not replayed from a recording, not the
    learner's output, not PyTorch's own F.scaled_dot_product_attention, nn.MultiheadAttention, torchvision...)
    and that equals the reference's output is a leak, reported with the function that made it. Its own
    labelling is tested in test_edition_leak_labels_what_the_checks_compute_from_the_inputs below."""
    exercises = json.dumps([[c.checks, e.name, e.reference] for c in registry.CHAPTERS for e in c.exercises])
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "edition_leaks.py"), str(ROOT), exercises],
                         cwd=edition, env={**os.environ, "PYTHONPATH": str(edition)}, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout)
    assert found["cases"] == sum(len(check.visible) for c in registry.CHAPTERS for check in c.load_checks().values())
    assert not found["leaks"], "the edition's checks compute withheld answers:\n" + "\n".join(
        f"  {case}: {', '.join(where)}" for case, where in found["leaks"].items())


def test_edition_leak_labels_what_the_checks_compute_from_the_inputs(tmp_path):
    """The labelling behind the test above: an answer computed by the checks' code is found (inline, in place,
    through einops), one replayed from a recording, computed by PyTorch's own function, or judged from the
    learner's output is not."""
    import torch
    from einops import rearrange

    import edition_leaks

    checks = tmp_path / "fake_checks.py"
    checks.write_text(
        "import torch\nfrom einops import rearrange\n\n"
        "def inline(x):\n    return x.transpose(0, 1).reshape(2, 6)\n\n"
        "def in_place(x):\n    out = torch.zeros(2, 6)\n    out[:] = rearrange(x, 'a b -> b a').reshape(2, 6)\n"
        "    return out\n\n"
        "def replayed(recorded):\n    return recorded * 1.0\n\n"
        "def pytorch(x):\n    return torch.softmax(x, dim=-1)\n\n"
        "def judged(out):\n    copy = torch.zeros(2, 6)\n    copy[:] = out\n    return copy\n")
    namespace: dict = {}
    exec(compile(checks.read_text(), str(checks), "exec"), namespace)
    x = torch.randn(6, 2)
    layout, probs = rearrange(x, "a b -> b a").reshape(2, 6), torch.softmax(x, dim=-1)
    mode = edition_leaks.Provenance({str(checks)}, (str(Path(rearrange.__code__.co_filename).parent),))
    found = {}
    for name, arg, answer, label in (("inline", x, layout, None), ("in_place", x, layout, None),
                                     ("replayed", layout.clone(), layout, "R"), ("pytorch", x, probs, None),
                                     ("judged", layout.clone(), layout, "O")):
        mode.start([])
        if label:
            mode.tag(arg, label)
        with mode:
            result = namespace[name](arg)
        found[name] = mode.leaks([answer], result)
    assert found["inline"] == {"inline (line 5 in the edition)"}
    # the buffer filled in place (line 8), and the layout made through einops (line 9)
    assert found["in_place"] == {"in_place (line 8 in the edition)", "in_place (line 9 in the edition)"}
    assert found["replayed"] == found["pytorch"] == found["judged"] == set()


@pytest.mark.slow
def test_student_edition_self_check_scores_a_withheld_chapter(republished):
    """Chapter 1's answers released, chapter 2's withheld (as while learners work on chapter 2): the learner's
    finished chapter 2 notebook gets its full visible score from `python -m autograder check` in the edition."""
    second = registry.CHAPTERS[1]
    dest, published = republished
    assert published.returncode == 0, published.stderr
    assert "withheld in this student edition" in _in_edition(dest, f"import {second.answers[0]}").stderr
    nb = nbformat.read(dest / "course" / second.id / second.notebook, as_version=4)
    source = nbformat.read(second.source_path(), as_version=4)
    answers = {c.metadata["nbgrader"]["grade_id"]: SOLUTION_MARKERS.sub("", c.source)
               for c in source.cells if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = answers[cell.metadata["nbgrader"]["grade_id"]]
    (dest / "work").mkdir()
    nbformat.write(nb, dest / "work" / second.notebook)
    out = subprocess.run([sys.executable, "-m", "autograder", "check", f"work/{second.notebook}"], cwd=dest,
                         env={**os.environ, "PYTHONPATH": str(dest), "TDD_QUICK": "1"}, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"visible score: {second.points}/{second.points}" in out.stdout, out.stdout


# --- chapter dependencies (the registry's `needs`) and what the default edition holds -------------------


def test_registry_needs_are_the_chapters_whose_answers_a_chapter_imports():
    """A chapter's prerequisites are the chapters whose answer modules its release notebook or its own answer
    modules import (directly, or through another library module); each comes before it."""
    for chapter in registry.CHAPTERS:
        imported = publish._notebook_imports(chapter.release_path())
        for module in chapter.answers:
            imported |= publish.imported_modules((ROOT / Path(*module.split("."))).with_suffix(".py").read_text())
        derived = set().union(*(publish.module_chapters(m) for m in imported if m.startswith("solutions"))) - {chapter.id}
        assert set(registry.prerequisites(chapter.id)) == derived, chapter.id
        assert all(registry.get(n).number < chapter.number for n in chapter.needs), chapter.id


def test_publish_opens_a_chapter_once_its_prerequisites_answers_are_released():
    assert publish.open_chapters(set()) == [c.id for c in registry.CHAPTERS if not registry.prerequisites(c.id)]
    for chapter in registry.CHAPTERS:
        released = set(registry.prerequisites(chapter.id))
        assert chapter.id in publish.open_chapters(released)
        assert publish.open_chapters(released, [chapter.id]) == [c for c in registry.ids() if c in released | {chapter.id}]
    third = registry.CHAPTERS[2]
    with pytest.raises(publish.PublishError) as err:
        publish.open_chapters({FIRST.id}, [third.id])
    missing = [p for p in registry.prerequisites(third.id) if p != FIRST.id]
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"chapter {third.number} ({third.id}) needs the answers of")
    assert all(f"--answers {m}" in message for m in missing) and FIRST.id not in message.split("needs")[1], message


@pytest.mark.subprocess
def test_publish_refuses_in_one_line_a_chapter_whose_prerequisites_are_withheld(tmp_path):
    last = registry.CHAPTERS[-1]
    out = subprocess.run([sys.executable, "-m", "autograder", "publish", str(tmp_path / "student"), "--chapters", last.id],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and not (tmp_path / "student").exists()
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"error: chapter {last.number} ({last.id}) needs"), out.stderr
    assert all(p in out.stderr for p in registry.prerequisites(last.id)), out.stderr


def test_readme_due_date_order_follows_the_prerequisites():
    """The instructor guide's table of prerequisites is the registry's, and its due-date order puts every
    chapter after the chapters it needs."""
    text = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| (\d) \| `\d\d_\w+` \| ([^|]*) \|", text.split("**Chapter dependencies.**")[1], re.MULTILINE))
    for chapter in registry.CHAPTERS:
        numbers = [str(registry.get(p).number) for p in registry.prerequisites(chapter.id)]
        assert rows[str(chapter.number)].strip() == (", ".join(numbers) or "none"), chapter.id
    order = re.search(r"A due-date order that works: (.+?)\.", text).group(1)
    position = {int(n): i for i, step in enumerate(order.split(" → ")) for n in re.findall(r"\d", step)}
    assert sorted(position) == [c.number for c in registry.CHAPTERS], order
    for chapter in registry.CHAPTERS:
        assert all(position[registry.get(p).number] < position[chapter.number] for p in registry.prerequisites(chapter.id))


@pytest.mark.slow
def test_default_student_edition_opens_what_a_learner_can_run(edition):
    """No --answers: the edition opens start-here and the chapters that need no other chapter's answers, and
    nothing else; each open notebook imports no withheld module but its own chapter's."""
    marker = json.loads((edition / publish.MARKER).read_text())
    opened = [c.id for c in registry.CHAPTERS if not registry.prerequisites(c.id)]
    assert marker["chapters"] == opened
    notebooks = sorted(str(p.relative_to(edition / "course")) for p in (edition / "course").rglob("*.ipynb"))
    assert notebooks == sorted([publish.START_HERE] + [f"{c}/{c}.ipynb" for c in opened])
    for chapter in opened:
        imported = publish._notebook_imports(edition / "course" / chapter / f"{chapter}.ipynb")
        assert not {m for m in imported if m in marker["withheld"]} - set(registry.get(chapter).answers)


@pytest.mark.slow
def test_student_edition_withheld_command_says_so_in_one_line(edition):
    out = subprocess.run([sys.executable, "-m", "solutions.train", "--help"], cwd=edition, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(edition)})
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().count("\n") == 0 and "solutions.train is withheld in this student edition" in out.stderr


def _targets(makefile: str) -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))


@pytest.mark.slow
def test_student_edition_readme_and_makefile_keep_only_what_works_there(edition):
    """The edition's Makefile has the learners' targets only (no test, check, release, student-edition, bench:
    nothing there to run them on), each runs there (make -n), and its README names no other target and no
    guide it does not have."""
    makefile = (edition / "Makefile").read_text()
    assert _targets(makefile) == {"lab", "install", "clean-venv"}, _targets(makefile)
    assert _targets((ROOT / "Makefile").read_text()) > _targets(makefile)
    readme = (edition / "README.md").read_text()
    assert set(re.findall(r"\bmake ([a-z][\w-]*)", readme)) <= _targets(makefile), readme
    assert "Library guide" not in readme and "solutions.train" not in readme
    for target in sorted(_targets(makefile)):
        out = subprocess.run(["make", "-n", "--no-print-directory", target, "VENV=/nonexistent/venv"], cwd=edition,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, (target, out.stderr)
        assert "[test]" not in out.stdout


@pytest.mark.subprocess
def test_student_edition_make_lab_fills_the_work_folder_and_starts_jupyterlab(edition, tmp_path):
    """`make lab` in the edition (this environment as its .venv, JupyterLab replaced by a recorder): the work
    folder gets the edition's chapters and JupyterLab is started on it with the lab's configuration."""
    venv = Path(sys.prefix)
    if not (venv / ".installed").exists():
        pytest.skip(f"`make lab` needs the environment made by `make install` ({venv / '.installed'} is missing)")
    copy = tmp_path / "edition"
    shutil.copytree(edition, copy)
    record, work = tmp_path / "record.json", tmp_path / "work"
    recorder = ("python3 -c 'import json, os, sys; json.dump({\"env\": dict(os.environ), \"argv\": sys.argv[1:], "
                "\"cwd\": os.getcwd()}, open(os.environ[\"LAB_RECORD\"], \"w\"))'")
    out = subprocess.run(["make", "--no-print-directory", "-o", str(venv / ".installed"), "lab", f"VENV={venv}",
                          f"WORK={work}", f"LAB={recorder}"], cwd=copy, capture_output=True, text=True, timeout=120,
                         env={"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/local/bin:/usr/bin:/bin",
                              "LANG": "C.UTF-8", "LAB_RECORD": str(record), "PYTHONPATH": str(copy)})
    assert out.returncode == 0, out.stdout + out.stderr
    seen = json.loads(record.read_text())
    assert seen["env"]["JUPYTER_CONFIG_PATH"].split(":")[0] == str(copy / "binder" / "jupyter")
    assert Path(seen["cwd"]) == work and seen["env"]["TDD_WORK"] == str(work)
    assert sorted(p.name for p in work.iterdir()) == sorted(p.name for p in (copy / "course").iterdir())
