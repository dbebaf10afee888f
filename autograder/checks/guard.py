"""The no-delegation rule, enforced while the learner's code runs inside a check.

An exercise that asks you to write ``softmax`` is not solved by calling ``torch.softmax``,
nor by calling the library's own answer (``solutions.attention.softmax``). While a probe
calls the learner's object, :class:`Guard` watches

* every PyTorch call at the Python API level (a ``TorchFunctionMode``: ``torch.softmax``,
  ``F.softmax``, ``x.softmax``, ``nn.Softmax``, ``torch.ops.aten._softmax`` all arrive as
  a function named ``softmax``/``_softmax``, however they were reached or renamed), and
  at the operator level (a ``TorchDispatchMode``: ``aten::_softmax``), against the
  exercise's forbidden names (``fnmatch`` patterns, e.g. ``"*softmax*"``);
* every Python call (a profile hook): a call into the source files of the chapter's answer
  modules; a forbidden function of another library, named by its dotted name
  (``torchvision.models.vision_transformer.interpolate_embeddings``); a Python function of
  PyTorch's own package with a forbidden name (its pure-Python reference implementations and
  decompositions, ``torch._refs.softmax``, compute what the C function computes); a call of one of
  PyTorch's C functions with a forbidden name, which the modes would not see if they were switched
  off; a TorchScript function (it runs its operators where nothing can watch them);
* that it stays in place: its modes on PyTorch's mode stacks and PyTorch's function modes not
  disabled at every call of the learner's code while the check runs (the autograd engine runs a
  ``backward`` with the modes off: that is PyTorch's doing, not the learner's), and no call of the
  switches that turn it off, of what starts a thread or a process, or of ``signal.signal``.

A violation is recorded at once (so catching the exception does not hide it), handed to ``report``
when one is given, and raised as :class:`Forbidden` where the guard can raise (in its modes).

The same guard runs in the notebook, under ``nbgrader autograde`` and in the batch grader's kernel,
so all three give the same verdict on an honest answer. In the notebook it runs in the learner's own
interpreter, which the learner's code can change at will. The grader's kernel is locked down first
(:mod:`autograder.lockdown`): there the guard's state lives only in the default arguments of its own
functions, which the learner's code cannot read or replace, each violation is written at once to a
channel the verdict side reads, and what could switch the guard off or hide a call from it is refused.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

OFF = "switches off the checks' watch on what your code calls, which is not allowed while it is checked"
AWAY = "starts a thread or a process while it is checked, where the check cannot see what it calls"
TORCHSCRIPT = "runs TorchScript (torch.jit), whose calls the check cannot see; write it in Python"
SIGNAL = "installs a signal handler while it is checked, which could run code the check cannot see"


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


_SWITCHES = _c_functions("sys.setprofile", "sys.settrace", "torch._C._pop_torch_function_stack",
                         "torch._C._pop_torch_dispatch_stack", "torch._C._set_torch_function_state",
                         "torch._C._unset_dispatch_mode", "torch._C._dispatch_tls_set_dispatch_key_excluded",
                         "threading.settrace", "threading.setprofile")
_ELSEWHERE = _c_functions("_thread.start_new_thread", "posix.fork", "posix.forkpty", "posix.posix_spawn",
                          "posix.posix_spawnp", "posix.system", "_posixsubprocess.fork_exec")
_SIGNALS = _c_functions("_signal.signal", "_signal.setitimer", "_signal.set_wakeup_fd")
_SCRIPTED = tuple(t for t in (getattr(torch._C, "ScriptFunction", None), getattr(torch._C, "ScriptMethod", None))
                  if isinstance(t, type))
_PYTHON_KEY = torch._C.DispatchKey.Python
_TORCH_DIRS = tuple(dict.fromkeys(os.path.dirname(p) + os.sep for p in (torch.__file__, os.path.realpath(torch.__file__))))
# Python's own files, the installed libraries and this package (as written and as resolved): code the learner
# did not write.
_LIBRARY_DIRS = tuple(dict.fromkeys(f(p) + os.sep for p in (
    sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) for f in (os.path.abspath, os.path.realpath)))
_BACKWARD_APPLY = torch.autograd.function.BackwardCFunction.apply.__code__


class Forbidden(Exception):
    """The learner's code called what the exercise asks it to write."""


def _is_torch(function, _getattr=getattr, _type=type, _issubclass=issubclass, _isinstance=isinstance, _str=str,
              _Tensor=torch.Tensor, _TensorBase=torch._C.TensorBase) -> bool:
    """Whether a C function (``torch.softmax``, ``Tensor.softmax`` bound or not) is PyTorch's (by types and C
    attributes only: nothing here can run code of the learner's)."""
    owner = _getattr(function, "__self__", None)
    if _issubclass(_type(owner), _Tensor) or _getattr(function, "__objclass__", None) is _TensorBase:
        return True
    module = _getattr(function, "__module__", None)
    if not _isinstance(module, _str) and _type(owner).__name__ == "module":
        module = _getattr(owner, "__name__", None)
    return _isinstance(module, _str) and (module == "torch" or module.startswith("torch."))


def glob_match(name: str, pattern: str, _len=len, _range=range, _all=all, _zip=zip) -> bool:
    """``fnmatch.fnmatchcase`` for the patterns of ``forbidden`` (``*`` and ``?``; no brackets), made of str
    methods only."""
    parts = pattern.split("*")
    if _len(parts) == 1:
        return _len(name) == _len(pattern) and _all(p == "?" or p == c for p, c in _zip(pattern, name))

    def at(text, piece, start):
        """The first index >= start where ``piece`` (with ``?``) matches ``text``, or -1."""
        for i in _range(start, _len(text) - _len(piece) + 1):
            if _all(p == "?" or p == c for p, c in _zip(piece, text[i:i + _len(piece)])):
                return i
        return -1

    first, last = parts[0], parts[-1]
    if _len(name) < _len(first) + _len(last) or at(name[: _len(first)], first, 0) != 0:
        return False
    if last and at(name[_len(name) - _len(last):], last, 0) != 0:
        return False
    position, end = _len(first), _len(name) - _len(last)
    for piece in parts[1:-1]:
        found = at(name[:end], piece, position)
        if found < 0:
            return False
        position = found + _len(piece)
    return True


# The watch now running (one at a time): (its state, its check of a PyTorch name). The modes read it from their
# default arguments, which the learner's code cannot reach in the locked-down kernel.
_CURRENT: list = [None]


class _FunctionLevel(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None, *, _current=_CURRENT, _getattr=getattr):
        state, check = _current[0]
        state["inside_functions"] += 1  # PyTorch takes this mode off its stack while it handles a call
        try:
            check(_getattr(func, "__name__", ""))
            return func(*args, **(kwargs or {}))
        finally:
            state["inside_functions"] -= 1


class _OperatorLevel(TorchDispatchMode):
    # PyTorch wraps a dispatch mode's ``__torch_dispatch__`` in ``torch._disable_dynamo`` unless the mode says
    # otherwise here; the wrapper's first call imports ``torch._dynamo`` (with ``torch._inductor`` and sympy,
    # about 900 modules, 2 s idle and 6 s busy in every kernel). Made under the watch's profile hook, that
    # import ran every line of those module bodies through the hook (the first check took 7 s idle, 30 s busy).
    # Nothing is compiled while the guard watches (importing the compiler under the watch is refused), so there
    # is nothing for that wrapper to disable: no kernel imports the compiler at all.
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None, *, _current=_CURRENT):
        state, check = _current[0]
        state["inside_operators"] += 1
        try:
            check(func._overloadpacket.__name__)
            return func(*args, **(kwargs or {}))
        finally:
            state["inside_operators"] -= 1


_CLASSES = (_FunctionLevel, _OperatorLevel)
_HANDLER_FUNCTIONS = (_FunctionLevel.__dict__["__torch_function__"], _OperatorLevel.__dict__["__torch_dispatch__"])
_HANDLERS = frozenset(h.__code__ for h in _HANDLER_FUNCTIONS)
_C_FUNCTIONS = (torch._C._is_torch_function_all_disabled, torch._C._len_torch_function_stack,
                torch._C._get_function_stack_at, torch._C._len_torch_dispatch_stack, torch._C._get_dispatch_stack_at,
                torch._C._dispatch_tls_is_dispatch_key_excluded)


def _watch(forbidden: tuple[str, ...], answer_files: tuple[str, ...], report, _tuple=tuple, _frozenset=frozenset,
           _dict=dict, _match=glob_match):
    """The guard's functions for one check: its state, its profile hook and its check of a PyTorch name.

    Everything they use is bound in their default arguments when they are made (the C functions and the builtins
    they call), never looked up in a module or an object the learner's code could change, and they call no
    Python function but their own: a profile hook's own calls are not watched, so none may reach the learner's
    code. The verdict (the first violation) is in ``state``, which only they write.
    """
    patterns = _tuple(p for p in forbidden if "." not in p)
    dotted: dict[str, tuple[str, ...]] = {}
    for name in (p for p in forbidden if "." in p):
        module, _, function = name.rpartition(".")
        dotted[function] = dotted.get(function, ()) + (module,)
    answers = _frozenset(answer_files)  # as the registry gives them: real paths
    state = _dict(violation=None, inside_functions=0, inside_operators=0, depths=(0, 0), modes=(), backward=0,
                  watching=False, c_calls=[])  # c_calls: the frames now inside a C function they called
    names: dict[str, bool] = {}  # function name -> forbidden?
    learner_files: dict[str, bool] = {}

    def note(message, _state=state, _report=report):
        if _state["violation"] is None:
            _state["violation"] = message
            if _report is not None:
                _report(message)

    def forbidden_name(name, _names=names, _patterns=patterns, _match=_match, _isinstance=isinstance, _str=str):
        hit = _names.get(name)
        if hit is None:
            hit = False
            if _isinstance(name, _str):
                for pattern in _patterns:
                    if _match(name, pattern):
                        hit = True
                        break
            _names[name] = hit
        return hit

    def check_torch(name, _forbidden=forbidden_name, _note=note, _Forbidden=Forbidden):
        if _forbidden(name):
            message = f"calls torch's `{name}`, which this exercise asks you to write yourself"
            _note(message)
            raise _Forbidden(message)

    def in_place(_state=state, _functions=_C_FUNCTIONS, _key=_PYTHON_KEY, _classes=_CLASSES,
                 _handlers=_HANDLER_FUNCTIONS, _type=type):
        """Whether the modes are still on PyTorch's stacks, unchanged, and PyTorch lets them see the calls (each is
        off its stack while it handles a call: then only the other one is looked at)."""
        modes = _state["modes"]
        if not modes:
            return True
        if (_classes[0].__dict__.get("__torch_function__") is not _handlers[0]
                or _classes[1].__dict__.get("__torch_dispatch__") is not _handlers[1]
                or _type(modes[0]) is not _classes[0] or _type(modes[1]) is not _classes[1]):
            return False  # a handler replaced
        all_disabled, function_depth, function_at, dispatch_depth, dispatch_at, excluded = _functions
        functions, operators = _state["depths"]
        if _state["inside_functions"] == 0 and (all_disabled() or function_depth() < functions
                                                or function_at(functions - 1) is not modes[0]):
            return False
        return _state["inside_operators"] > 0 or (dispatch_depth() >= operators
                                                  and dispatch_at(operators - 1) is modes[1] and not excluded(_key))

    def scripted(frame, _scripted=_SCRIPTED, _isinstance=isinstance, _get=dict.get, _dict=dict, _type=type):
        """Whether ``frame`` names a TorchScript function among its globals or locals: a call to one is no
        ``c_call`` (it is an object's call), so PyTorch's own Python code, which it runs with the modes off
        their stacks, is the first thing the hook sees of it."""
        if frame is None or not _scripted:
            return False
        code, found = frame.f_code, frame.f_globals
        local = frame.f_locals
        for name in code.co_names + code.co_varnames:
            if _isinstance(_get(found, name), _scripted) or (_type(local) is _dict
                                                              and _isinstance(_get(local, name), _scripted)):
                return True
        return False

    def learners(frame, _cache=learner_files, _dirs=_LIBRARY_DIRS, _range=range):
        """Whether ``frame`` runs the learner's code: not Python's, an installed library's or ours (by its file,
        as written: a path that climbs out of a folder is the learner's). Code made from a string (``exec``,
        ``<string>``) is the learner's when the code that made it is."""
        for _ in _range(64):
            filename = frame.f_code.co_filename
            if not filename.startswith("<") or filename.startswith("<ipython-input-"):
                break
            if filename.startswith("<frozen ") or frame.f_back is None:
                return False
            frame = frame.f_back
        known = _cache.get(filename)
        if known is None:
            known = _cache[filename] = not filename.startswith(_dirs) or "/../" in filename or "/./" in filename
        return known

    def profile(frame, event, arg, _state=state, _note=note, _learners=learners, _in_place=in_place,
                _scripted_in=scripted,
                _forbidden=forbidden_name, _is_torch=_is_torch, _dotted=dotted, _answers=answers,
                _dict_get=dict.get, _sep=os.sep, _switches=_SWITCHES, _elsewhere=_ELSEWHERE, _signals=_SIGNALS,
                _scripted=_SCRIPTED, _isinstance=isinstance, _getattr=getattr, _str=str, _Exception=Exception,
                _torch_dir=_TORCH_DIRS, _backward=_BACKWARD_APPLY, _handlers=_HANDLERS):
        if not _state["watching"]:
            return
        try:
            if event == "c_return" or event == "c_exception":
                c_calls = _state["c_calls"]
                if c_calls and c_calls[-1] is frame:
                    c_calls.pop()
                return
            if event == "return":
                if frame.f_code is _backward:
                    _state["backward"] -= 1
                return
            if event == "c_call":
                _state["c_calls"].append(frame)
                if _scripted and _isinstance(arg, _scripted):
                    _note(TORCHSCRIPT)  # named for what it is, before anything it does inside is seen
                    return
                if _learners(frame) and (arg in _switches or not (_state["backward"] or _in_place())):
                    _note(OFF)
                if arg in _elsewhere:
                    _note(AWAY)
                elif arg in _signals:
                    _note(SIGNAL)
                else:
                    name = _getattr(arg, "__name__", "")
                    if _isinstance(name, _str) and _forbidden(name) and _is_torch(arg):
                        _note(f"calls torch's `{name}`, which this exercise asks you to write yourself")
                return
            if event != "call":
                return
            code = frame.f_code
            if code is _backward:
                _state["backward"] += 1  # the autograd engine runs a backward with PyTorch's modes off
                return
            caller = frame.f_back
            c_calls = _state["c_calls"]
            called_from_c = c_calls and c_calls[-1] is caller  # PyTorch calling back into Python while it dispatches
            if (not _state["backward"] and code not in _handlers and not _in_place()
                    and (_learners(frame) or (caller is not None and not called_from_c and _learners(caller)))):
                # the learner's code runs, or calls a library's, with the guard off; or it called TorchScript
                _note(TORCHSCRIPT if _scripted_in(caller) or _scripted_in(frame) else OFF)
            filename = code.co_filename
            for module in _dotted.get(code.co_name, ()):
                # its module's function, or a copy of its code (same file) under other globals
                if (_dict_get(frame.f_globals, "__name__") == module
                        or filename.endswith(_sep + module.replace(".", _sep) + ".py")):
                    _note(f"calls {module}.{code.co_name}, which this exercise asks you to write yourself")
            if filename.startswith(_torch_dir) and _forbidden(code.co_name):
                # PyTorch's pure-Python implementations (torch._refs, torch._decomp) compute what its C functions do
                _note(f"calls torch's `{code.co_name}` ({filename.rpartition(_sep + 'torch' + _sep)[2]}), which this "
                      "exercise asks you to write yourself")
            if filename in _answers:
                module = filename.rpartition(_sep)[2].rpartition(".")[0]
                _note(f"calls the library's answer (solutions.{module}.{code.co_name}) instead of solving the "
                      "exercise")
        except _Exception:  # noqa: BLE001 — an error here would unset the hook: the watch would be off
            _note(OFF)

    return state, profile, check_torch


def watched(function, args, forbidden: tuple[str, ...] = (), answer_files: tuple[str, ...] = (), report=None,
            _current=_CURRENT, _watch=_watch, _getprofile=sys.getprofile, _setprofile=sys.setprofile,
            _functions=_C_FUNCTIONS, _classes=_CLASSES, _Forbidden=Forbidden, _BaseException=BaseException,
            _Exception=Exception, _reversed=reversed):
    """``function(*args)`` under the guard: ``(its result, None, violation)``, or ``(None, the exception it raised,
    violation)``; the violation is None when clean. ``report`` gets each violation as soon as it is seen.

    One watch at a time: a call made while one runs (by the learner's code) is refused.
    """
    if _current[0] is not None:
        raise _Forbidden(OFF)
    state, profile, check = _watch(forbidden, answer_files, report)
    modes = ()
    if any("." not in p for p in forbidden):
        modes = (_classes[0](), _classes[1]())
    previous = _getprofile()
    result, error = None, None
    _current[0] = (state, check)
    try:
        for mode in modes:
            mode.__enter__()
        state["modes"] = modes
        if modes:
            state["depths"] = (_functions[1](), _functions[3]())
        if forbidden or answer_files:
            state["watching"] = True
            _setprofile(profile)
        try:
            result = function(*args)
        except _BaseException as err:  # noqa: BLE001 — handed to the caller, which sorts it
            error = err
        finally:
            state["watching"] = False
            _setprofile(previous)
    finally:
        for mode in _reversed(modes):
            try:
                mode.__exit__(None, None, None)
            except _Exception:  # noqa: BLE001 — the learner's code may have popped the mode already
                pass
        _current[0] = None
    return result, error, state["violation"]


def other_threads() -> int:
    """How many threads of this process run besides this one (the interpreter's and the operating system's view)."""
    try:
        tasks = len(os.listdir("/proc/self/task"))
    except OSError:
        tasks = 1
    return max(threading.active_count(), tasks) - 1


def signal_handlers() -> dict:
    """The Python-level handler of every signal (for comparing before and after the learner's code)."""
    return {s: signal.getsignal(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)}
