"""Every check catches its planted bugs, and the reference library passes every check.

Generic over the registry's chapters: the mutants of a chapter whose checks module is
``autograder.checks.<short>`` are ``tests/mutants/<short>_mutants.py``; each exercise's
reference is the registry's ``module:attribute``.
"""

from __future__ import annotations

import pytest
import torch

from autograder import registry
from autograder.checks import core
from mutants import chapter_of, load_all

MUTANTS = [(module, m) for module, found in load_all().items() for m in found]
EXERCISES = [(c, ex) for c in registry.CHAPTERS for ex in c.exercises]
# The batch grader draws fresh random seeds, so a check must never fail the
# reference and must catch every mutant whatever the seed: try a spread of them.
SEEDS = (0, 7, 1234) + tuple(range(10_000, 10_000 + 17 * 6151, 6151))
MUTANT_SEEDS = (0, 424_242, 9_999_991)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The checks use tiny tensors: one thread avoids OpenMP overhead on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_mutants_every_chapter_has_them():
    found = load_all()
    for chapter in registry.CHAPTERS:
        short = chapter.checks.rsplit(".", 1)[1]
        mutants = found.get(f"{short}_mutants", [])
        floor = 2 * len(chapter.exercises)  # at least two realistic mistakes per exercise
        assert len(mutants) >= floor, (f"{chapter.id} has {len(mutants)} mutants in tests/mutants/{short}_mutants.py; "
                                       f"at least {floor}")
        names = [m.name for m in mutants]
        assert len(set(names)) == len(names), f"{chapter.id}: duplicate mutant names"


@pytest.mark.parametrize("module,mutant", MUTANTS, ids=[f"{mod}:{m.name}" for mod, m in MUTANTS])
def test_mutant_fails_hidden_checks(module, mutant):
    chapter = chapter_of(module)
    assert mutant.exercise in chapter.load_checks(), f"{mutant.name}: no exercise {mutant.exercise!r} in {chapter.checks}"
    assert mutant.description.strip(), f"{mutant.name}: describe the failure mode"
    for seed in MUTANT_SEEDS:
        with pytest.raises(core.CheckFailed) as err:
            core.run(chapter.checks, mutant.exercise, mutant.obj, level="hidden", seed=seed, quiet=True)
        assert str(err.value).startswith(f"{mutant.exercise}: "), str(err.value)
        # A mutant is an honest mistake: it must be caught by the judge, not refused as delegation (a mutant
        # that calls the library's answer would "fail" whatever the check does) — unless delegating is the
        # mistake it plants.
        refused = "not accepted:" in str(err.value)
        assert refused == mutant.delegates, f"{mutant.name}: {err.value}"


@pytest.mark.parametrize("module,mutant", [(mod, m) for mod, m in MUTANTS if m.delegates],
                         ids=[f"{mod}:{m.name}" for mod, m in MUTANTS if m.delegates])
def test_delegating_mutant_is_refused_by_the_visible_checks_and_by_the_guard_alone(module, mutant):
    """A mutant that calls what its exercise asks to write: the notebook's own test cell refuses it (static
    pass, then the run-time guard), and so does the run-time guard alone (the grader's kernel, whatever
    the static pass saw)."""
    chapter = chapter_of(module)
    with pytest.raises(core.CheckFailed, match="not accepted: your code"):
        core.run(chapter.checks, mutant.exercise, mutant.obj, level="visible", seed=0, quiet=True)
    check = chapter.load_checks()[mutant.exercise]
    verdict = core.judge_check(check, core.local_probe(mutant.obj, check.forbidden), lambda case: [0], level="visible")
    assert verdict.status == "flagged", verdict
    assert "which this exercise asks you to write yourself" in verdict.reason, verdict


@pytest.mark.parametrize("chapter", registry.CHAPTERS, ids=registry.ids())
def test_mutants_mostly_caught_by_visible_checks(chapter):
    """The notebook's own test cells (visible checks, seed 0) catch at least 90% of the chapter's mutants,
    so the learner hears about the instructive mistakes before submitting, not as a lost point."""
    short = chapter.checks.rsplit(".", 1)[1]
    mutants = load_all().get(f"{short}_mutants", [])
    missed = []
    for mutant in mutants:
        try:
            core.run(chapter.checks, mutant.exercise, mutant.obj, level="visible", seed=0, quiet=True)
        except core.CheckFailed:
            continue
        missed.append(mutant.name)
    caught = len(mutants) - len(missed)
    assert mutants and caught >= 0.9 * len(mutants), (
        f"{chapter.id}: the visible checks catch {caught} of {len(mutants)} mutants (< 90%); not caught: {missed}")


def _reference_verdict(exercise, check, seeds: tuple[int, ...], single: tuple[int, ...]):
    # The reference is the library's answer, so only the PyTorch rule applies to it, not "do not call the library".
    # A case drawn with one seed (a memory bound on a large input: its property does not depend on the values)
    # is tried on ``single``, the others on ``seeds``.
    return core.judge_check(check, core.local_probe(exercise.load_reference(), check.forbidden),
                            lambda case: seeds if case.seeds > 1 else single, level="hidden")


@pytest.mark.parametrize("chapter,exercise", EXERCISES, ids=[f"{c.id}:{e.name}" for c, e in EXERCISES])
def test_reference_passes_hidden_checks(chapter, exercise):
    """The inner loop's share of SEEDS: a case on the first three, one drawn with one seed on the first;
    ``..._on_every_seed`` (make test) tries the rest."""
    verdict = _reference_verdict(exercise, chapter.load_checks()[exercise.name], SEEDS[:3], SEEDS[:1])
    assert verdict.passed, f"{exercise.reference}: {verdict.reason}"


@pytest.mark.slow
@pytest.mark.parametrize("chapter,exercise", EXERCISES, ids=[f"{c.id}:{e.name}" for c, e in EXERCISES])
def test_reference_passes_hidden_checks_on_every_seed(chapter, exercise):
    """The other 17 of SEEDS (a case drawn with one seed: the second and third): a reference that fails on one
    seed in twenty would fail a learner's correct answer about once in twenty gradings."""
    verdict = _reference_verdict(exercise, chapter.load_checks()[exercise.name], SEEDS[3:], SEEDS[1:3])
    assert verdict.passed, f"{exercise.reference}: {verdict.reason}"
