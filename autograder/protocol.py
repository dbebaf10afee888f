"""The kernel protocol, declared once: what the verdict side asks the learner's kernel, what it answers, and
what each kind of answer or failure means for the grade.

Messages travel framed by :mod:`autograder.wire`. The verdict side (:mod:`autograder.sandbox`,
:mod:`autograder.verdict`, :mod:`autograder.checks.core`) sends requests; the runner
(:mod:`autograder.runner`) and the probes (:mod:`autograder.checks.probes`) answer. Nothing the kernel
says is trusted: :func:`autograder.checks.core.result_from_answer` reads every answer strictly.

Requests (``op``):

* ``cell`` — ``{"op": "cell", "source": str}``: run one cell; answer ``{"ok", "kind", "error"}``;
* ``probe`` — ``{"op": "probe", "target", "probe", "inputs", "forbidden", "answer_files", "memory_case"}``: call
  probe ``probe`` on the notebook global ``target``; answer ``{"ok", "outputs", "inputs_after", "violation"}``
  or ``{"ok": False, "kind", "error", "violation"}``;
* ``exit``.

The first answer, before any learner code runs, is ``{"ok", "ready", "pid"}`` (or not ready, with a kind and an
error). Three vocabularies of "kind", each mapped to a grade status below: how the runner *died* (decided by the
verdict side, :class:`Died`), why a cell or a probe *failed* (said by the kernel, :class:`Failed`), and the kind
of a *result* (:data:`autograder.results.KINDS`).
"""

from __future__ import annotations

from enum import Enum

from autograder import status

# --- requests -------------------------------------------------------------------------------------------


class Op(str, Enum):
    CELL = "cell"
    PROBE = "probe"
    EXIT = "exit"


# --- answer fields --------------------------------------------------------------------------------------

OK = "ok"  # bool: the cell ran / the probe gave outputs
KIND = "kind"  # a Failed value when not ok
ERROR = "error"  # the exception, "Type: message" (the learner's text: never shown for hidden cases)
VIOLATION = "violation"  # str: what the no-delegation guard saw the learner's code call (None when clean)
READY = "ready"  # bool, first answer only: the kernel can run a notebook within its limits
PID = "pid"  # int, first answer only: the runner's pid as it sees itself
OUTPUTS = "outputs"  # the probe's outputs (wire-encoded)
INPUTS_AFTER = "inputs_after"  # the inputs as they were after the call (wire-encoded)


class Failed(str, Enum):
    """Why a cell or a probe gave no outputs, as the kernel reports it (decided there by exception identity)."""

    NOT_IMPLEMENTED = "not_implemented"  # the stub still raises NotImplementedError
    MEMORY = "memory"  # MemoryError, or PyTorch's allocator out of memory
    RAISED = "raised"  # any other exception
    UNSENDABLE = "unsendable"  # outputs that cannot be encoded
    MISSING = "missing"  # the exercise's name is not defined in the notebook


class Died(str, Enum):
    """How the kernel stopped, as the verdict side saw it (never from the kernel's own words)."""

    TIMEOUT = "timeout"  # a request ran past its deadline (or the CPU limit); we killed it
    MEMORY = "memory"  # killed by SIGKILL: most likely the memory limit
    CRASHED = "crashed"  # exited by itself (os._exit, a segfault), or sent a malformed answer
    OUTPUT = "output"  # printed more than the output limit; we killed it
    START = "start"  # could not start within its limits
    TAMPERED = "tampered"  # an answer not signed by the runner's own code, or the violations channel closed


FAILED_STATUS = {Failed.NOT_IMPLEMENTED: status.MISSING, Failed.MEMORY: status.MEMORY, Failed.RAISED: status.ERROR,
                 Failed.UNSENDABLE: status.ERROR, Failed.MISSING: status.MISSING}
DIED_STATUS = {Died.TIMEOUT: status.TIMEOUT, Died.MEMORY: status.MEMORY, Died.CRASHED: status.CRASHED,
               Died.OUTPUT: status.ERROR, Died.START: status.CRASHED, Died.TAMPERED: status.FLAGGED}


def failed(value) -> Failed | None:
    """``value`` as a :class:`Failed`, or None when the kernel sent something else."""
    try:
        return Failed(value)
    except ValueError:
        return None


def status_of_death(kind) -> str:
    try:
        return DIED_STATUS[Died(kind)]
    except ValueError:
        return status.CRASHED
