"""Planted bugs ("mutants"): each is a copy of a reference solution with one real mistake.

Every ``tests/mutants/<module>_mutants.py`` defines ``MUTANTS: list[Mutant]``;
tests/test_mutants.py checks that the hidden checks of the mutant's exercise
catch every one of them, so a check that lets a known mistake through fails.
Under pytest ``tests/`` is on ``sys.path`` (no ``__init__.py`` there), so a mutants
file imports the dataclass with ``from mutants import Mutant``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Mutant:
    name: str  # short id, unique within its file ("softmax_no_max_subtraction")
    exercise: str  # the Exercise.name it targets ("softmax")
    description: str  # the real failure mode it models, with its source if a public implementation had it
    obj: Any  # the buggy function or class, handed to the check in place of the learner's
    delegates: bool = False  # the mistake is calling what the exercise asks to write: refused as delegation


def chapter_of(mutants_module: str):
    """``attention_mutants`` -> the registry chapter whose checks module is ``autograder.checks.attention``."""
    from autograder import registry

    return registry.chapter_of_checks("autograder.checks." + mutants_module.removesuffix("_mutants"))


def load_all() -> dict[str, list[Mutant]]:
    """Every ``tests/mutants/*_mutants.py``: ``{module name: MUTANTS}``."""
    found = {}
    for path in sorted(Path(__file__).parent.glob("*_mutants.py")):
        module = importlib.import_module(f"{__name__}.{path.stem}")
        found[path.stem] = list(module.MUTANTS)
    return found
