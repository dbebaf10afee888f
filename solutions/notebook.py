"""What the chapter notebooks share that is not a concept of its own: the training budget.

A notebook that trains takes its budget from :func:`budget`, so that the tests and the
batch grader run it short (``TDD_QUICK=1``) while a learner — and
``scripts/measure_notebooks.py``, which checks the full run against the 3-minute budget —
runs it in full.
"""

from __future__ import annotations

import os

QUICK_ENV = "TDD_QUICK"


def quick() -> bool:
    """Whether notebooks run short (``TDD_QUICK=1``: the tests and the grader set it)."""
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def budget(full: int, quick_value: int) -> int:
    """``full`` (steps, epochs, examples...) normally; ``quick_value`` when :func:`quick`."""
    if full < 1 or quick_value < 1:
        raise ValueError(f"budgets must be positive; got full={full}, quick_value={quick_value}")
    return quick_value if quick() else full
