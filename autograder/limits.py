"""Every limit and timeout of the grader, in one table, with the reason for each value.

Commands take their defaults from here (``grade --cell-timeout``, ``check --timeout``, ``plan
--max-notebook-mb``), and so do the sandbox (:class:`autograder.sandbox.Limits`), the runner, the
verdict process and nbgrader's own execution (``autograder/nbgrader_config.py``).
"""

from __future__ import annotations

# --- time ------------------------------------------------------------------------------------------------

# One cell or one check in the batch grader. The slowest honest check (a chapter-6 generation on a hidden
# case) takes a few seconds on one busy core; a minute leaves room for a slow machine, and stops a loop.
CELL_SECONDS = 60.0
# Everything run for one notebook in the batch grader: its cells and every check of every exercise.
NOTEBOOK_SECONDS = 600.0
# Starting the kernel: `import torch` takes 2-10 s; on a loaded machine much more.
START_SECONDS = 60.0
# RLIMIT_CPU of a kernel: a backstop behind the wall-time limits (a kernel the wall clock missed).
CPU_SECONDS = 1200
# One cell or one check in the learner's self-check (`python -m autograder check`): a learner's laptop may be
# slow and their notebook may train for real (no TDD_QUICK there), so longer than the grader's.
SELFCHECK_CELL_SECONDS = 120.0
# One cell under `nbgrader autograde` / `validate` (nbgrader_config.py): the instructor notebook trains in
# full there, and nbgrader cannot skip a cell.
NBGRADER_CELL_SECONDS = 300

# --- memory and size -------------------------------------------------------------------------------------

# RLIMIT_AS of a kernel: `import torch` alone maps about 3.3 GB of address space.
MEMORY_BYTES = 6 * 2**30
# RLIMIT_AS of a verdict worker (the grader's own process that reads notebooks and judges outputs): it holds
# one notebook and the reference's tensors; a hostile notebook must not take the machine's memory there.
VERDICT_MEMORY_BYTES = 8 * 2**30
# RLIMIT_NPROC of a kernel's uid (threads count too): PyTorch's pools stay well under it.
PROCESSES = 64
# RLIMIT_FSIZE: the largest file a kernel may write.
FILE_BYTES = 64 * 2**20
# What a kernel may write in total, /sandbox and /tmp together (bubblewrap's size-capped tmpfs).
DISK_BYTES = 256 * 2**20
# A kernel's prints: it is stopped past this (a learner's print loop must not fill the grader's memory).
OUTPUT_BYTES = 1 * 2**20
# A submitted file larger than this is not read, and graded invalid (grade and plan: --max-notebook-mb).
MAX_NOTEBOOK_MB = 64.0
# What the self-check reads of a learner's notebook (their own file, their own machine).
SELFCHECK_MAX_BYTES = 256 * 2**20
# Code the static pass reads, in all of a notebook's cells: ten times the largest chapter's code.
MAX_CODE_BYTES = 2**20
# A notebook's shape, checked on its raw bytes before it is parsed: cells, and JSON containers (objects and
# arrays). The largest chapter has under 100 cells and a few thousand containers.
MAX_CELLS = 2000
MAX_JSON_CONTAINERS = 200_000
# A tensor the kernel sends back: elements, and dimensions (a judge would otherwise allocate what it says).
MAX_TENSOR_ELEMENTS = 2**26
MAX_TENSOR_DIMS = 16

# --- text ------------------------------------------------------------------------------------------------

# An error message as the kernel reports it (the verdict side cuts it again: it is the learner's text).
ERROR_CHARS = 300
# A reason in grades.csv and in feedback: a hint is one or two sentences.
REASON_CHARS = 600
