"""The default student edition (no answers released), built once per test process.

SESSION FIXTURE: tests/test_publish.py and tests/test_leaks.py take it through their fixtures; it is built
with `autograder publish`'s builder in this process (about 30 s on a busy 2-core machine, most of it
recording the visible cases' reference results) into a temporary folder removed at exit.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
import time
from pathlib import Path

from autograder import publish


@functools.cache
def default_edition() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="tdd-default-edition-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    start = time.monotonic()
    notes = publish.build(folder, [])
    default_edition.seconds = time.monotonic() - start
    default_edition.notes = notes
    return folder
