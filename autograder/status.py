"""The status vocabulary of a graded exercise: the one list every part of the grader uses.

A row of ``grades.csv`` has exactly one of these statuses. Only ``passed`` earns points.
"""

from __future__ import annotations

PASSED = "passed"  # every check passed
FAILED = "failed"  # a check failed (wrong answer, or inputs changed in place); the reason is its hint
ERROR = "error"  # the learner's code raised, or a syntax error, or its outputs could not be read
TIMEOUT = "timeout"  # a cell or a check ran past its time limit; the kernel was stopped
MEMORY = "memory"  # the learner's code ran out of its memory limit
CRASHED = "crashed"  # the kernel died (os._exit, a segfault, a kernel that could not start)
MISSING = "missing"  # not attempted: the exercise is not defined, still raises NotImplementedError, or no notebook
INVALID = "invalid"  # the file cannot be graded: not a regular file, too large, not a notebook, unknown name
FLAGGED = "flagged"  # delegated: calls the library's answer or the PyTorch function the exercise asks for
DUPLICATE = "duplicate"  # another copy of the same chapter by the same student is the one graded
STALE = "stale"  # the submission changed after the grading plan was frozen

STATUSES = (PASSED, FAILED, ERROR, TIMEOUT, MEMORY, CRASHED, MISSING, INVALID, FLAGGED, DUPLICATE, STALE)

# What the learner reads in feedback, per status.
DESCRIPTIONS = {
    PASSED: "passed",
    FAILED: "a check failed",
    ERROR: "your code raised an error",
    TIMEOUT: "stopped: took too long",
    MEMORY: "stopped: used too much memory",
    CRASHED: "the kernel died",
    MISSING: "not done",
    INVALID: "the notebook could not be read",
    FLAGGED: "not accepted: delegated",
    DUPLICATE: "not graded: another copy was graded",
    STALE: "not graded: the file changed after the grading plan was made",
}
