"""The status vocabulary of a graded exercise: the one list every part of the grader uses.

A row of ``grades.csv`` has exactly one of these statuses. Only ``passed`` earns points. Each status
has what the learner reads in feedback and a tone (how feedback colours it: ``good``, ``bad`` or
``neutral``). A new status is one line of :data:`TABLE` (and a test that some notebook gets it);
feedback's styles, descriptions and the documentation's list follow from it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Status:
    name: str  # the value in grades.csv
    description: str  # what the learner reads in feedback
    tone: str  # "good", "bad" or "neutral": feedback's colour
    meaning: str  # when the grader gives it (for instructors: docs/grading.md)


TABLE: tuple[Status, ...] = (
    Status("passed", "passed", "good", "every check passed"),
    Status("failed", "a check failed", "bad",
           "a check failed (wrong answer, or inputs changed in place); the reason is its hint"),
    Status("error", "your code raised an error", "bad",
           "the learner's code raised, or a syntax error, or its outputs could not be read"),
    Status("timeout", "stopped: took too long", "bad", "a cell or a check ran past its time limit; the kernel was stopped"),
    Status("memory", "stopped: used too much memory", "bad", "the learner's code ran out of its memory limit"),
    Status("crashed", "the kernel died", "bad", "the kernel died (os._exit, a segfault, a kernel that could not start)"),
    Status("missing", "not done", "bad",
           "not attempted: the exercise is not defined, still raises NotImplementedError, or no notebook"),
    Status("invalid", "the notebook could not be read", "bad",
           "the file cannot be graded: not a regular file, too large, not a notebook, unknown name, wrong folder"),
    Status("flagged", "not accepted: delegated", "bad",
           "delegated: calls the library's answer or the function the exercise asks for, or switches the checks off"),
    Status("duplicate", "not graded: another copy was graded", "neutral",
           "another copy of the same chapter by the same student is the one graded"),
    Status("stale", "not graded: the file changed after the grading plan was made", "neutral",
           "the submission changed after the grading plan was frozen"),
)

PASSED, FAILED, ERROR, TIMEOUT, MEMORY, CRASHED, MISSING, INVALID, FLAGGED, DUPLICATE, STALE = (s.name for s in TABLE)
STATUSES = tuple(s.name for s in TABLE)
DESCRIPTIONS = {s.name: s.description for s in TABLE}
TONES = {s.name: s.tone for s in TABLE}
