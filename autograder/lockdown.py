"""The grader's kernel, locked down before any learner code runs, so that the no-delegation verdict depends on
nothing the learner's code can reach.

:func:`install` is called by :mod:`autograder.runner` once, after PyTorch and the grader's own modules are
loaded and before the first cell. From then on, for the life of the process:

* **an audit hook** (``sys.addaudithook``; Python offers no way to remove one) refuses — the call raises
  ``PermissionError`` in the learner's code — what could switch the guard off or hide a call from it:
  ``sys.settrace`` (a trace function silences every profile hook), ``sys.setprofile`` from anywhere but the
  guard itself, a second audit hook, ``gc``'s object walks (they would find the guard's state), reading or
  changing the default arguments of the grader's functions (where that state lives), code compiled or made
  under a library's file name or from the grader's own code (the guard trusts library frames by their file),
  unmarshalled code, ``ctypes`` (raw memory), opening ``/proc/*/mem`` or ``clear_refs`` (memory, and the peak
  the verdict side measures), and importing the grader's modules again;
* ``sys.getprofile`` and ``sys.gettrace`` return None (the guard's hook is never handed out);
* :func:`restore` puts back, before every request and before every answer is framed, the builtins and every
  module the runner's own code uses (``json``, ``base64``, ``struct``, the grader's modules), as they were
  here: a learner's patch of them cannot run code in the runner's place;
* the runner refuses to start a check while a thread the learner's code started still runs, or while a
  signal handler it installed is in place (both could run code beside the check, out of its sight).

What it cannot stop is code that corrupts the interpreter's own memory through a bug or an unchecked
primitive of a library (e.g. numpy's ``as_strided`` with strides past an array's end): see
docs/grading.md, "What the no-delegation rule guarantees".
"""

from __future__ import annotations

import builtins
import os
import sys
import types

import autograder
from autograder.checks import guard

PACKAGE_DIR = os.path.dirname(os.path.realpath(autograder.__file__)) + os.sep
LIBRARY_DIRS = guard._LIBRARY_DIRS
# The modules whose state the runner's own code reads after learner code has run (framing the answers,
# decoding requests, the probes and the guard).
TRUSTED_MODULES = ("json", "json.encoder", "json.decoder", "json.scanner", "base64", "binascii", "struct", "math",
                   "functools", "hashlib", "collections", "torch", "torch._C", "torch.overrides",
                   "torch.utils._python_dispatch", "autograder.wire", "autograder.limits", "autograder.protocol",
                   "autograder.checks.probes", "autograder.checks.guard", "autograder.runner")
REFUSED = ("sys.settrace", "sys.addaudithook", "gc.get_objects", "gc.get_referrers", "gc.get_referents")


# Py_TPFLAGS_IMMUTABLETYPE (Python 3.10+): a class whose attributes cannot be set or deleted, by the learner's code
# or by :func:`restore`.
_IMMUTABLE_TYPE = 1 << 8


class Snapshot:
    """The builtins and the trusted modules (and the classes defined in them), as they are now.

    Immutable classes are left out: nothing can change them, and :func:`restore` could not put one back. They are
    most of PyTorch's (the legacy tensor types, torch._C's function tables: about 10,100 of 12,700 names), which
    restore, twice a request, went through one by one (about 2.5 ms each time)."""

    def __init__(self, modules: tuple[str, ...] = TRUSTED_MODULES):
        self.builtins = dict(builtins.__dict__)
        self.modules = {}
        for name in modules:
            module = sys.modules.get(name)
            if module is None:
                continue
            classes = {key: (value, dict(value.__dict__)) for key, value in vars(module).items()
                       if isinstance(value, type) and value.__module__ == name
                       and not value.__flags__ & _IMMUTABLE_TYPE}
            self.modules[name] = (module, dict(vars(module)), classes)


def restore(snapshot: Snapshot, _setattr=setattr, _delattr=delattr, _list=list, _getattr=getattr,
            _vars=vars) -> None:
    """Put back what :class:`Snapshot` saw: changed names to their old values, new names removed."""
    b = builtins.__dict__
    for key in _list(b):
        if key not in snapshot.builtins:
            del b[key]
    b.update(snapshot.builtins)
    for module, saved, classes in snapshot.modules.values():
        current = _vars(module)
        for key in _list(current):
            if key not in saved:
                del current[key]
        current.update(saved)
        for cls, attrs in classes.values():
            for key in _list(cls.__dict__):
                if key not in attrs:
                    try:
                        _delattr(cls, key)
                    except (AttributeError, TypeError):
                        pass
            for key, value in attrs.items():
                if cls.__dict__.get(key, attrs) is not value:
                    try:
                        _setattr(cls, key, value)
                    except (AttributeError, TypeError):
                        pass


def _none() -> None:
    return None


def _is_library(filename: str, _dirs=LIBRARY_DIRS, _isinstance=isinstance, _str=str) -> bool:
    """Whether code of ``filename`` is Python's, an installed library's or the grader's (importlib's frozen
    modules included), by the name as written (a path that climbs out of a folder is not)."""
    if not _isinstance(filename, _str):
        return False
    if filename.startswith("<"):
        return filename.startswith("<frozen ")
    return filename.startswith(_dirs) and "/../" not in filename and "/./" not in filename


def install(allowed_setprofile: frozenset) -> None:
    """Lock this interpreter down (see the module docstring). ``allowed_setprofile``: the code objects that may
    call ``sys.setprofile`` (the guard's own). Anything else is refused before anything is installed: an audit hook
    cannot be taken back."""
    if not isinstance(allowed_setprofile, frozenset) or not allowed_setprofile or not all(
            isinstance(code, types.CodeType) for code in allowed_setprofile):
        raise TypeError("allowed_setprofile must be a non-empty frozenset of code objects (the guard's own)")
    inside = [False]

    def caller(depth, _getframe=sys._getframe):
        return _getframe(depth + 1)

    def hook(event, args, _inside=inside, _refused=frozenset(REFUSED), _caller=caller, _allowed=allowed_setprofile,
             _package=PACKAGE_DIR, _is_library=_is_library, _isinstance=isinstance, _FunctionType=types.FunctionType,
             _CodeType=types.CodeType, _PermissionError=PermissionError, _startswith=str.startswith, _str=str,
             _fspath=os.fspath, _Exception=Exception):
        if _inside[0]:
            return
        if event == "object.__getattr__" or event == "object.__setattr__":
            obj, name = args[0], args[1]
            if not _isinstance(obj, _FunctionType):
                return
            if event == "object.__getattr__" and name not in ("__defaults__", "__kwdefaults__"):
                return
            _inside[0] = True
            try:
                grader = _startswith(obj.__code__.co_filename, _package)
            finally:
                _inside[0] = False
            if grader:
                raise _PermissionError("the grader's functions cannot be read or changed while a notebook is graded")
            return
        if event in _refused or event.startswith("ctypes."):
            raise _PermissionError(f"{event} is not allowed while a notebook is graded")
        if event == "sys.setprofile":
            _inside[0] = True
            try:
                ok = _caller(1).f_code in _allowed
            finally:
                _inside[0] = False
            if not ok:
                raise _PermissionError("sys.setprofile is not allowed while a notebook is graded")
            return
        if event == "import":
            name = args[0]
            if _isinstance(name, _str) and (name == "autograder" or name.startswith("autograder.")):
                raise _PermissionError("the grader's modules cannot be imported while a notebook is graded")
            return
        if event == "open":
            path = args[0]
            try:
                path = _fspath(path) if not _isinstance(path, int) else ""
            except _Exception:  # noqa: BLE001
                return
            if _isinstance(path, bytes):
                path = path.decode(errors="replace")
            if _startswith(path, "/proc/") and (path.endswith("/mem") or path.endswith("/clear_refs")):
                raise _PermissionError(f"opening {path} is not allowed while a notebook is graded")
            return
        if event == "marshal.loads" or event == "marshal.load":
            _inside[0] = True
            try:
                refused = not _is_library(_caller(1).f_code.co_filename)
            finally:
                _inside[0] = False
            if refused:
                raise _PermissionError("unmarshalling code is not allowed while a notebook is graded")
            return
        if event in ("exec", "function.__new__"):
            code = args[0]
            if _isinstance(code, _CodeType):
                _inside[0] = True
                try:
                    filename = code.co_filename
                    refused = _startswith(filename, _package) or (
                        _is_library(filename) and not _is_library(_caller(1).f_code.co_filename))
                finally:
                    _inside[0] = False
                if refused:
                    raise _PermissionError("running the code of the grader or of a library under other names is "
                                           "not allowed while a notebook is graded")
            return
        if event in ("compile", "code.__new__"):
            filename = args[1]
            if _isinstance(filename, bytes):
                filename = filename.decode(errors="replace")
            if not _isinstance(filename, _str):
                return
            _inside[0] = True
            try:
                refused = (_startswith(filename, _package) or
                           (_is_library(filename) and not filename.startswith("<"))) and \
                    not _is_library(_caller(1).f_code.co_filename)
            finally:
                _inside[0] = False
            if refused:
                raise _PermissionError(f"making code under the file name {filename} is not allowed while a notebook "
                                       "is graded")

    sys.addaudithook(hook)
    sys.getprofile = _none
    sys.gettrace = _none
