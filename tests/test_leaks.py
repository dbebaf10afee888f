"""No graded answer within a learner's reach: what a learner can call passes no exercise's hidden checks.

The test looks at behaviour, not text: for every exercise, every callable a learner can reach while its
chapter is graded is judged by that exercise's hidden checks (every case, three fresh seeds, the no-delegation
guard on), and one that passes is a leak. tests/leak_search.py collects them — the given code of every
release notebook open then (top-level definitions outside the solution cells, run with the notebook's imports
in this process: no kernel), each bug hunt with the fix its folded answer gives, the chapter's given code on a
learner's other finished answers, and every module of a student edition as ``autograder publish`` writes it
(checks, probes, the recorded results they replay, the library's released modules).

A callable that passes every hidden case but those in which the reference itself raises an error (the checks
of bad input: "past max_len raises ValueError") is a near leak, and fails the test too: it is an answer but for
its ValueErrors (a bug hunt whose printed fix gives the exercise's function without its argument checks). A case
that checks a result and an error at once is left out whole, so a near leak may also lack what that case checks
besides the error.

A function of one argument of the edition's checks modules is also called as the checks call their helpers,
with a case's inputs (``{"args": …, "kwargs": …}``): one that returns the reference's output for every hidden
case and seed (three or more, with two different answers) is a leak, an answer computed by the checks' code.

What "fits" means: a callable is judged for an exercise when it can be called as the exercise's reference must
be — with the reference's required positional arguments, by position, and its required keyword-only ones, by
name — and needs no other argument. The checks call the object at least that way, so one that does not fit
would raise TypeError at their first call: leaving it out loses nothing.

What it cannot see:
* code one edit away from an answer other than the printed fixes of the bug hunts and the missing checks of
  bad input (a demo that is an answer without ``is_causal=True``, a cache class whose constructor takes a
  config instead of sizes, a function that lacks one argument, or calls PyTorch's version of an earlier
  exercise where the learner's own would do): it fails the hidden checks, so it is no leak here, though a
  learner can finish it in a minute;
* an answer in pieces a learner must assemble (a helper holding the core of a function, such as the sampling
  distribution of a sampler that draws from it, a formula in prose or in a hint);
* instance methods of classes that need arguments to be made, and functions nested in other functions;
* the grader's commands (``leak_search.COMMANDS``: they take folders and processes; checked below to define
  no exercise's name);
* given code that only works inside a running notebook (it reads a variable a demo cell computes): it is
  defined here but fails when called.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import nbformat
import pytest
import torch

import editions
import leak_search
from autograder import publish, registry

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def default_edition() -> Path:
    """SESSION FIXTURE (tests/editions.py): the default student edition, built once per test process."""
    return editions.default_edition()


@pytest.mark.slow  # builds the default edition (once per session) and judges about a thousand candidates per chapter
@pytest.mark.parametrize("chapter", registry.ids())
def test_leaks_nothing_a_learner_can_reach_passes_a_hidden_check(chapter, default_edition):
    found = leak_search.search(chapter, default_edition / "autograder" / "checks" / "recorded")
    assert found.tried > 10 * len(registry.get(chapter).exercises), f"only {found.tried} candidates judged"
    assert not found.cut, "candidates cut at the time limit (they may pass):\n" + "\n".join(found.cut)
    assert not found.leaks and not found.near, (
        "callables a learner can reach that pass an exercise's hidden checks:\n" + "\n".join(
            f"  {leak.exercise}: {leak.candidate}" for leak in found.leaks)
        + "\nand that pass them but for the checks of bad input (ValueErrors):\n" + "\n".join(
            f"  {leak.exercise}: {leak.candidate}" for leak in found.near))


@pytest.mark.slow  # builds the default edition (once per session)
def test_leak_search_loads_the_edition_publish_writes(default_edition):
    """The search's picture of a student edition is the one `autograder publish` writes: with every answer
    withheld (as while chapter 1 is graded) its checks modules are the edition's files, its library modules
    are the edition's unchanged copies, and the withheld ones are not there."""
    first = registry.CHAPTERS[0].id
    withheld = leak_search.withheld_modules(first)
    assert set(withheld) == set(publish.withheld_modules(set()))
    modules = leak_search.edition_modules(withheld)
    assert not set(modules) & set(withheld)
    for chapter in registry.CHAPTERS:
        edition_file = (default_edition / Path(*chapter.checks.split("."))).with_suffix(".py")
        assert leak_search._edition_source(chapter, True) == edition_file.read_text(), chapter.checks
    for name, module in modules.items():
        if name.startswith("solutions") or name in ("autograder.checks.core", "autograder.checks.probes"):
            path = Path(module.__file__)
            assert (default_edition / path.relative_to(ROOT)).read_bytes() == path.read_bytes(), name
    for name in withheld:
        path = default_edition / publish._library_modules(ROOT)[name].relative_to(ROOT)
        assert "withheld in this student edition" in path.read_text(), name


def test_leak_search_commands_define_no_exercise():
    """The grader's commands are left out of the search: none of them defines a function or class of an
    exercise's name that takes the reference's parameters."""
    references = {ex.target: ex.load_reference() for c in registry.CHAPTERS for ex in c.exercises}
    for name in leak_search.COMMANDS:
        path = (ROOT / Path(*name.split("."))).with_suffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in references:
                wanted = list(inspect.signature(references[node.name]).parameters)
                params = [a.arg for a in node.args.args] if isinstance(node, ast.FunctionDef) else []
                assert params[: len(wanted)] != wanted, f"{name}.{node.name} looks like the exercise's answer"


GIVEN = '''
def row_softmax(x, dim=-1):
    shifted = x - x.amax(dim=dim, keepdim=True).detach()
    return shifted.exp() / shifted.exp().sum(dim=dim, keepdim=True)


def softmax_by_the_library(x, dim=-1):
    import solutions.attention
    return solutions.attention.softmax(x, dim)
'''
NEAR = '''
def mask_without_checks(seq_q, seq_k=None):
    seq_k = seq_q if seq_k is None else seq_k
    return torch.ones(seq_q, seq_k, dtype=torch.bool).tril(diagonal=seq_k - seq_q)
'''
BUG_HUNT = '''
def buggy_normalise(x, dim=-1):
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)


verdict(True, "")
'''


def test_leak_search_finds_given_code_that_answers_an_exercise(tmp_path):
    """The search itself: an answer under another name in a given cell is found, and so is a bug hunt whose
    printed fix makes it one; calling the withheld library is refused by the guard (no leak), and the exercise's
    own stub is no candidate."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch\nverdict = print"), nbformat.v4.new_code_cell(GIVEN),
                nbformat.v4.new_code_cell("def softmax(x, dim=-1):\n    raise NotImplementedError()"),
                nbformat.v4.new_code_cell(BUG_HUNT)]
    nb.cells[2].metadata["nbgrader"] = {"solution": True, "grade_id": "softmax_solution"}
    path = tmp_path / "planted.ipynb"
    nbformat.write(nb, path)
    skipped: list[str] = []
    fixes = {"def buggy_normalise(": [("e = x.exp()", "e = (x - x.amax(dim=dim, keepdim=True)).exp()")]}
    candidates = leak_search.notebook_candidates(path, skipped, fixes)
    labels = [c.label for c in candidates]
    assert not skipped, skipped
    assert not [label for label in labels if ": softmax " in label], labels
    chapter = registry.CHAPTERS[0]
    check = leak_search._memoized(chapter.load_checks()["softmax"])
    files = tuple(str(p) for m, p in publish._library_modules(ROOT).items() if m in chapter.answers)
    passed = {c.label.split(": ", 1)[1].split(" (cell")[0] for c in candidates
              if leak_search.judge(check, c.obj, files).passed}
    assert passed == {"row_softmax", "buggy_normalise with the fix its folded answer gives"}, passed
    assert leak_search.fits(candidates[0].obj, chapter.exercise("softmax").load_reference())
    assert not leak_search.fits(lambda a, b, c: None, chapter.exercise("softmax").load_reference())


def test_leak_search_tells_a_near_leak_from_an_answer_and_a_mistake():
    """A causal mask without its ValueErrors is a near leak; the library's own function would be a leak; a mask
    aligned to the wrong corner is neither."""
    chapter = registry.CHAPTERS[0]
    namespace: dict = {}
    exec(compile("import torch\n" + NEAR, "<given>", "exec"), namespace)  # noqa: S102
    exercise = chapter.exercise("causal_mask")
    trial = leak_search.Trial(leak_search._memoized(chapter.load_checks()[exercise.name]), exercise.load_reference(), ())
    assert trial.errors and all("ValueError" in name or "raise" in name for name in trial.errors), trial.errors
    assert trial.outcome(namespace["mask_without_checks"]) == "near"
    assert trial.outcome(exercise.load_reference()) == "leak"
    assert trial.outcome(lambda seq_q, seq_k=None: torch.ones(seq_q, seq_k or seq_q, dtype=torch.bool).tril()) is None


def test_leak_search_finds_a_checks_helper_that_computes_the_answer_from_a_case():
    """A helper of the checks that computes what the reference returns from a case's inputs is found; one that
    computes something else, or that is not a function of the inputs, is not."""
    chapter = registry.CHAPTERS[0]
    exercise = chapter.exercise("padding_mask")
    trial = leak_search.Trial(leak_search._memoized(chapter.load_checks()[exercise.name]), exercise.load_reference(), ())

    def expected_keep(inputs):
        tokens, pad_id = inputs["args"]
        return (tokens != pad_id)[:, None, None, :]

    assert trial.computes_answer(expected_keep) is True
    assert trial.computes_answer(lambda inputs: ~expected_keep(inputs)) is False
    assert trial.computes_answer(lambda inputs: inputs["no such key"]) is False
