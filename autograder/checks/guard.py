"""The no-delegation rule, enforced while the learner's code runs inside a check.

An exercise that asks you to write ``softmax`` is not solved by calling ``torch.softmax``,
nor by calling the library's own answer (``solutions.attention.softmax``). While a probe
calls the learner's object, :class:`Guard` watches

* every PyTorch call at the Python API level (a ``TorchFunctionMode``: ``torch.softmax``,
  ``F.softmax``, ``x.softmax``, ``nn.Softmax``, ``torch.ops.aten._softmax`` all arrive as
  a function named ``softmax``/``_softmax``, however they were reached or renamed), and
  at the operator level (a ``TorchDispatchMode``: ``aten::_softmax``), against the
  exercise's forbidden names (``fnmatch`` patterns, e.g. ``"*softmax*"``);
* every Python call (a profile hook, ``sys.setprofile``): a call into the source files of the
  chapter's answer modules; a forbidden function of another library, named by its dotted
  name (``torchvision.models.vision_transformer.interpolate_embeddings``); a call of one of
  PyTorch's C functions with a forbidden name, which the modes would not see if they were
  switched off;
* that it stays in place: its modes on PyTorch's mode stacks and PyTorch's function modes not
  disabled (``torch._C.DisableTorchFunction``, ``_disable_current_modes()``, popping a mode)
  at every Python call while the check runs, and no call of the switches that turn it off
  (``sys.setprofile``, popping a mode stack) or of what starts a thread or a process, where
  it cannot see.

A violation is recorded (so catching the exception does not hide it) and raised as
:class:`Forbidden` where the guard can raise (in its modes). The same guard runs in the
notebook, under ``nbgrader autograde`` and in the batch grader's kernel, so all three give the
same verdict. It runs in the learner's own process: code that digs into that process (its
memory, the interpreter's objects) could still get around it, which is why the static pass
(:mod:`autograder.checks.honesty`) also forbids these switches by name.
"""

from __future__ import annotations

import fnmatch
import os
import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

OFF = "switches off the checks' watch on what your code calls, which is not allowed while it is checked"
AWAY = "starts a thread or a process while it is checked, where the check cannot see what it calls"


def _c_functions(*dotted: str) -> frozenset:
    """The C functions named (those this Python and PyTorch have)."""
    found = set()
    for name in dotted:
        module_name, _, attr = name.rpartition(".")
        module = sys.modules.get(module_name)
        if module is None:
            try:
                module = __import__(module_name, fromlist=["_"])
            except ImportError:
                continue
        if hasattr(module, attr):
            found.add(getattr(module, attr))
    return frozenset(found)


_SWITCHES = _c_functions("sys.setprofile", "torch._C._pop_torch_function_stack", "torch._C._pop_torch_dispatch_stack",
                         "torch._C._set_torch_function_state", "torch._C._unset_dispatch_mode",
                         "torch._C._dispatch_tls_set_dispatch_key_excluded")
_ELSEWHERE = _c_functions("_thread.start_new_thread", "posix.fork", "posix.forkpty", "posix.posix_spawn",
                          "posix.posix_spawnp", "posix.system", "_posixsubprocess.fork_exec")
_PYTHON_KEY = torch._C.DispatchKey.Python
# Python's own files, the installed libraries and this package: code the learner did not write.
_LIBRARY_DIRS = tuple(dict.fromkeys(os.path.realpath(p) + os.sep for p in (
    sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


class Forbidden(Exception):
    """The learner's code called what the exercise asks it to write."""


class _FunctionLevel(TorchFunctionMode):
    def __init__(self, guard: "Guard") -> None:
        super().__init__()
        self.guard = guard

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.guard.inside_functions += 1  # PyTorch takes this mode off its stack while it handles a call
        try:
            self.guard.check_torch(getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))
        finally:
            self.guard.inside_functions -= 1


class _OperatorLevel(TorchDispatchMode):
    def __init__(self, guard: "Guard") -> None:
        super().__init__()
        self.guard = guard

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.guard.inside_operators += 1
        try:
            self.guard.check_torch(func._overloadpacket.__name__)
            return func(*args, **(kwargs or {}))
        finally:
            self.guard.inside_operators -= 1


_HANDLERS = frozenset((_FunctionLevel.__torch_function__.__code__, _OperatorLevel.__torch_dispatch__.__code__))


def _is_torch(function) -> bool:
    """Whether a C function (``torch.softmax``, ``Tensor.softmax`` bound or not) is PyTorch's."""
    owner = getattr(function, "__self__", None)
    if isinstance(owner, torch.Tensor) or getattr(function, "__objclass__", None) is torch._C.TensorBase:
        return True
    module = getattr(function, "__module__", None) or getattr(owner, "__name__", None) or ""
    return isinstance(module, str) and (module == "torch" or module.startswith("torch."))


class Guard:
    """``with Guard(forbidden, answer_files) as guard: ...``; then ``guard.violation`` (None if clean).

    ``forbidden``: fnmatch patterns of PyTorch functions, and dotted names of other libraries'
    functions (``torchvision.models.vision_transformer.interpolate_embeddings``).
    """

    def __init__(self, forbidden: tuple[str, ...] = (), answer_files: tuple[str, ...] = ()) -> None:
        self.forbidden = tuple(p for p in forbidden if "." not in p)
        self.functions: dict[str, list[str]] = {}  # function name -> the modules it is forbidden from
        for dotted in (p for p in forbidden if "." in p):
            module, _, name = dotted.rpartition(".")
            self.functions.setdefault(name, []).append(module)
        self.answer_files = frozenset(os.path.realpath(f) for f in answer_files)
        self.violation: str | None = None
        self.inside_functions = 0  # > 0 while the function-level mode handles a call (it is then off its stack)
        self.inside_operators = 0  # the same for the operator-level mode
        self._seen_files: dict[str, bool] = {}
        self._learner_files: dict[str, bool] = {}
        self._c_names: dict[str, bool] = {}
        self._modes: list = []
        self._depths: tuple[int, int] = (0, 0)
        self._watching = False
        self._previous_profile = None

    def check_torch(self, name: str) -> None:
        if self._forbidden_name(name):
            self._record(f"calls torch's `{name}`, which this exercise asks you to write yourself")

    def _forbidden_name(self, name: str) -> bool:
        hit = self._c_names.get(name)
        if hit is None:
            hit = self._c_names[name] = any(fnmatch.fnmatchcase(name, p) for p in self.forbidden)
        return hit

    def _note(self, message: str) -> None:
        if self.violation is None:
            self.violation = message

    def _record(self, message: str) -> None:
        self._note(message)
        raise Forbidden(message)

    def _in_place(self) -> bool:
        """Whether the guard's modes are still on PyTorch's stacks and PyTorch lets them see the calls
        (each is off its stack while it handles a call: then only the other one is looked at)."""
        if not self._modes:
            return True
        functions, operators = self._depths
        if self.inside_functions == 0 and (torch._C._is_torch_function_all_disabled()
                                           or torch._C._len_torch_function_stack() < functions
                                           or torch._C._get_function_stack_at(functions - 1) is not self._modes[0]):
            return False
        return self.inside_operators > 0 or (torch._C._len_torch_dispatch_stack() >= operators
                                             and torch._C._get_dispatch_stack_at(operators - 1) is self._modes[1]
                                             and not torch._C._dispatch_tls_is_dispatch_key_excluded(_PYTHON_KEY))

    def _learners(self, frame) -> bool:
        """Whether ``frame`` runs the learner's code: not Python's, an installed library's (PyTorch takes its
        modes off their stacks for a moment in places, e.g. to call a mode's handler) or ours. Code made
        from a string (``exec``, ``<string>``) is the learner's when the code that made it is."""
        for _ in range(64):
            filename = frame.f_code.co_filename
            if not filename.startswith("<") or filename.startswith("<ipython-input-"):
                break
            if filename.startswith("<frozen ") or frame.f_back is None:
                return False
            frame = frame.f_back
        known = self._learner_files.get(filename)
        if known is None:
            known = self._learner_files[filename] = not os.path.realpath(filename).startswith(_LIBRARY_DIRS)
        return known

    def _profile(self, frame, event, arg) -> None:
        if (event != "c_call" and event != "call") or not self._watching:
            return  # a call is where the guard could be found off, and where a forbidden function starts
        try:
            if event == "c_call":
                if self._learners(frame) and (arg in _SWITCHES or not self._in_place()):
                    self._note(OFF)
                self._c_call(arg)
                return
            if (frame.f_code not in _HANDLERS and not self._in_place()
                    and (self._learners(frame) or (frame.f_back is not None and self._learners(frame.f_back)))):
                self._note(OFF)  # the learner's code runs, or calls, with the guard off
            self._python_call(frame)
        except Exception:  # noqa: BLE001 — an error here would unset the hook: the watch would be off
            self._note(OFF)

    def _c_call(self, function) -> None:
        if function in _ELSEWHERE:
            self._note(AWAY)
        elif self.forbidden:
            name = getattr(function, "__name__", "")
            if isinstance(name, str) and self._forbidden_name(name) and _is_torch(function):
                self._note(f"calls torch's `{name}`, which this exercise asks you to write yourself")

    def _python_call(self, frame) -> None:
        code = frame.f_code
        for module in self.functions.get(code.co_name, ()):
            # its module's function, or a copy of its code (same file) under other globals
            if (dict.get(frame.f_globals, "__name__") == module
                    or code.co_filename.endswith(os.sep + module.replace(".", os.sep) + ".py")):
                self._note(f"calls {module}.{code.co_name}, which this exercise asks you to write yourself")
        if not self.answer_files:
            return
        filename = code.co_filename
        hit = self._seen_files.get(filename)
        if hit is None:
            hit = self._seen_files[filename] = os.path.realpath(filename) in self.answer_files
        if hit:
            module = os.path.splitext(os.path.basename(filename))[0]
            self._note(f"calls the library's answer (solutions.{module}.{code.co_name}) "
                       "instead of solving the exercise")

    def __enter__(self) -> "Guard":
        if self.forbidden:
            self._modes = [_FunctionLevel(self), _OperatorLevel(self)]
            for mode in self._modes:
                mode.__enter__()
            self._depths = (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack())
        if self.forbidden or self.functions or self.answer_files:
            self._previous_profile = sys.getprofile()
            self._watching = True
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        if self._watching:
            self._watching = False
            sys.setprofile(self._previous_profile)
        for mode in reversed(self._modes):
            try:
                mode.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 — the learner's code may have popped the mode already
                pass
        self._modes = []
