"""The environment the course's processes run in, said once: the kernels' variables, and this Python's
scripts on PATH.

* :func:`kernel` — what a learner's kernel gets in the grader's sandbox (a bare PATH, one thread, figures
  off screen, notebooks' training runs short: :data:`solutions.notebook.QUICK_ENV`);
* :func:`put_scripts_on_path` — nbgrader runs ``alembic`` (its gradebook's migrations) by name, so the
  scripts of this interpreter's environment must be on PATH even where the virtualenv is not activated
  (``.venv/bin/python -m autograder ...``, ``.venv/bin/nbgrader ...``);
* :func:`for_nbgrader` — that, and a new gradebook stamped with its schema's revision read in this process
  (:func:`gradebook_revision`) instead of by a second Python running ``alembic heads``.
"""

from __future__ import annotations

import functools
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


def for_nbgrader() -> None:
    """Ready this process for nbgrader's gradebook: this Python's scripts first on PATH, and the revision a new
    gradebook is stamped with read here, once (:func:`gradebook_revision`).

    nbgrader (0.9) stamps every gradebook it creates with ``get_alembic_version()``, which runs ``alembic heads``:
    a second Python that loads nbgrader again, about 3.5 s of CPU each time a gradebook is made.
    The same revision is read from the same migration scripts in this process, in about 0.1 s."""
    put_scripts_on_path()
    stamp_gradebooks_in_process()


def stamp_gradebooks_in_process() -> None:
    """The part of :func:`for_nbgrader` that leaves PATH alone."""
    import nbgrader.api

    if callable(getattr(nbgrader.api, "get_alembic_version", None)) and gradebook_revision() is not None:
        nbgrader.api.get_alembic_version = gradebook_revision


@functools.cache
def gradebook_revision() -> str | None:
    """The head revision of nbgrader's gradebook migrations (what ``alembic heads`` prints first), or None
    when they have no single head (nbgrader's own lookup is then left in place)."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError
    from nbgrader.dbutil import ALEMBIC_DIR

    try:
        return ScriptDirectory(ALEMBIC_DIR).get_current_head()
    except CommandError:
        return None
