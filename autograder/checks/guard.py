"""The no-delegation rule, enforced while the learner's code runs inside a check.

An exercise that asks you to write ``softmax`` is not solved by calling ``torch.softmax``,
nor by calling the library's own answer (``solutions.attention.softmax``). While a probe
calls the learner's object, :class:`Guard` watches

* every PyTorch call at the Python API level (a ``TorchFunctionMode``: ``torch.softmax``,
  ``F.softmax``, ``x.softmax``, ``nn.Softmax``, ``torch.ops.aten._softmax`` all arrive as
  a function named ``softmax``/``_softmax``, however they were reached or renamed), and
  at the operator level (a ``TorchDispatchMode``: ``aten::_softmax``), against the
  exercise's forbidden names (``fnmatch`` patterns, e.g. ``"*softmax*"``);
* every Python call (``sys.setprofile``) against the source files of the chapter's answer
  modules.

A violation is recorded (so catching the exception does not hide it) and raised as
:class:`Forbidden`. The same guard runs in the notebook, under ``nbgrader autograde`` and
in the batch grader's kernel, so all three give the same verdict.
"""

from __future__ import annotations

import fnmatch
import os
import sys

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


class Forbidden(Exception):
    """The learner's code called what the exercise asks it to write."""


class _FunctionLevel(TorchFunctionMode):
    def __init__(self, guard: "Guard") -> None:
        super().__init__()
        self.guard = guard

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.guard.check_torch(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


class _OperatorLevel(TorchDispatchMode):
    def __init__(self, guard: "Guard") -> None:
        super().__init__()
        self.guard = guard

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.guard.check_torch(func._overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class Guard:
    """``with Guard(forbidden, answer_files) as guard: ...``; then ``guard.violation`` (None if clean)."""

    def __init__(self, forbidden: tuple[str, ...] = (), answer_files: tuple[str, ...] = ()) -> None:
        self.forbidden = tuple(forbidden)
        self.answer_files = frozenset(os.path.realpath(f) for f in answer_files)
        self.violation: str | None = None
        self._seen_files: dict[str, bool] = {}
        self._modes: list = []
        self._previous_profile = None

    def check_torch(self, name: str) -> None:
        for pattern in self.forbidden:
            if fnmatch.fnmatchcase(name, pattern):
                self._record(f"calls torch's `{name}`, which this exercise asks you to write yourself")

    def _profile(self, frame, event, arg) -> None:
        if event != "call" or not self.answer_files:
            return
        filename = frame.f_code.co_filename
        hit = self._seen_files.get(filename)
        if hit is None:
            hit = self._seen_files[filename] = os.path.realpath(filename) in self.answer_files
        if hit and self.violation is None:
            module = os.path.splitext(os.path.basename(filename))[0]
            self.violation = (f"calls the library's answer (solutions.{module}.{frame.f_code.co_name}) "
                              "instead of solving the exercise")

    def _record(self, message: str) -> None:
        if self.violation is None:
            self.violation = message
        raise Forbidden(message)

    def __enter__(self) -> "Guard":
        if self.forbidden:
            self._modes = [_FunctionLevel(self), _OperatorLevel(self)]
            for mode in self._modes:
                mode.__enter__()
        if self.answer_files:
            self._previous_profile = sys.getprofile()
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        if self.answer_files:
            sys.setprofile(self._previous_profile)
        for mode in reversed(self._modes):
            try:
                mode.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 — the learner's code may have popped the mode already
                pass
        self._modes = []
