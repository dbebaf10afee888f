"""The environment the course's processes run in, said once: the kernels' variables, and this Python's
scripts on PATH.

* :func:`kernel` — what a learner's kernel gets in the grader's sandbox (a bare PATH, one thread, figures
  off screen, notebooks' training runs short: :data:`solutions.notebook.QUICK_ENV`);
* :func:`put_scripts_on_path` — nbgrader runs ``alembic`` (its gradebook's migrations) by name, so the
  scripts of this interpreter's environment must be on PATH even where the virtualenv is not activated
  (``.venv/bin/python -m autograder ...``, ``.venv/bin/nbgrader ...``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from solutions.notebook import QUICK_ENV

SCRIPTS = str(Path(sys.executable).parent)


def kernel(home: str) -> dict[str, str]:
    """The whole environment of a kernel in the sandbox (nothing of the grader's own is passed on)."""
    return {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "HOME": home, "LANG": "C.UTF-8",
            QUICK_ENV: "1"}


def put_scripts_on_path(environ: dict | None = None) -> None:
    """Put this interpreter's scripts folder first on ``environ``'s PATH (os.environ by default), once."""
    environ = os.environ if environ is None else environ
    path = environ.get("PATH", "")
    if SCRIPTS not in path.split(os.pathsep):
        environ["PATH"] = SCRIPTS + (os.pathsep + path if path else "")
