"""Every check catches its planted bugs, and the reference library passes every check.

Generic over chapters: the mutants are every ``tests/mutants/*_mutants.py``; the
reference checks are every ``autograder/checks/<module>.py`` that defines
``EXERCISES``, run against ``solutions.<module>``.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch

import autograder.checks
from autograder.checks.core import CheckFailed, run_exercise
from mutants import checks_module_of, load_all

MUTANTS = [(module, m) for module, found in load_all().items() for m in found]
CHECK_MODULES = sorted(
    info.name for info in pkgutil.iter_modules(autograder.checks.__path__)
    if hasattr(importlib.import_module(f"autograder.checks.{info.name}"), "EXERCISES")
)
EXERCISES = [
    (module, name) for module in CHECK_MODULES
    for name in importlib.import_module(f"autograder.checks.{module}").EXERCISES
]
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


def test_mutants_at_least_eight_per_chapter():
    for module, found in load_all().items():
        assert len(found) >= 8, f"{module} has {len(found)} mutants; at least 8 per chapter"
        names = [m.name for m in found]
        assert len(set(names)) == len(names), f"{module}: duplicate mutant names"


@pytest.mark.parametrize("module,mutant", MUTANTS, ids=[f"{mod}:{m.name}" for mod, m in MUTANTS])
def test_mutant_fails_hidden_checks(module, mutant):
    checks = importlib.import_module(checks_module_of(module))
    assert mutant.exercise in checks.EXERCISES, f"{mutant.name}: no exercise {mutant.exercise!r} in {checks.__name__}"
    assert mutant.description.strip(), f"{mutant.name}: describe the failure mode"
    for seed in MUTANT_SEEDS:
        with pytest.raises(CheckFailed) as err:
            run_exercise(checks.EXERCISES[mutant.exercise], mutant.obj, level="hidden", seed=seed, quiet=True)
        assert str(err.value).startswith(f"{mutant.exercise}: "), str(err.value)


@pytest.mark.parametrize("module,name", EXERCISES, ids=[f"{mod}:{n}" for mod, n in EXERCISES])
def test_reference_passes_hidden_checks(module, name):
    checks = importlib.import_module(f"autograder.checks.{module}")
    exercise = checks.EXERCISES[name]
    reference = getattr(importlib.import_module(f"solutions.{module}"), exercise.target)
    for seed in SEEDS:
        run_exercise(exercise, reference, level="hidden", seed=seed, quiet=True)


@pytest.mark.parametrize("module", CHECK_MODULES)
def test_checks_module_protocol(module):
    checks = importlib.import_module(f"autograder.checks.{module}")
    assert callable(checks.run)
    for name, exercise in checks.EXERCISES.items():
        assert exercise.name == name
        assert 1 <= exercise.points <= 3, f"{name}: points must be 1-3"
        assert exercise.visible and exercise.hidden, f"{name}: needs visible and hidden cases"
