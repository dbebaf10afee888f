"""The student-side runner: the only process in which a learner's code ever runs.

Started by :mod:`autograder.sandbox` as ``python -I -m autograder.runner CONFIG_JSON`` inside the sandbox.
It reads requests (:mod:`autograder.wire` messages, the ops of :mod:`autograder.protocol`) on stdin and
answers on a private copy of its original stdout; the learner's own prints go to stderr, which the grader
drains with a size cap.

* The first message it reads is the session's key (before anything else is loaded). Every answer is
  followed by an HMAC-SHA256 of the request's nonce and the answer, made with that key by code the
  learner's cannot reach: an answer the learner's code writes to the channel itself is refused.
* The first answer, sent before any learner code runs, is ``{"ok": true, "ready": true, "pid": <pid>}``,
  or ``{"ok": false, "ready": false, "kind": "memory" | "raised", "error": ...}`` when the kernel cannot work
  within its limits. The memory limit is set before PyTorch is loaded, so a limit too low for it fails
  within a fraction of a second, not after the whole import; a self-test then allocates a tensor and runs a
  cell.
* Before the first cell the interpreter is locked down (:mod:`autograder.lockdown`), and every violation
  the no-delegation guard sees is written at once to the violations channel (``CONFIG["violations_fd"]``),
  which the verdict side reads: nothing the learner's code does later can take it back.
* ``cell`` runs one cell with IPython (magics work); ``probe`` calls the probe directly (not through
  ``run_cell``, so input transformers and ``showtraceback`` overrides never see it), after putting back the
  builtins and the modules the runner uses, and only while no thread and no signal handler of the
  learner's is in place.

This process decides nothing: the verdict is computed by the grader from the outputs.
"""

from __future__ import annotations

import errno
import json
import os
import sys


def _open_answer_channel() -> int:
    """A private fd for answers; fd 1 becomes the learner's output stream (fd 2, capped by the grader)."""
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    os.set_inheritable(answer_fd, False)
    return answer_fd


def _limit_memory(config: dict) -> None:
    """RLIMIT_AS before anything large is loaded: a limit PyTorch cannot load within fails at once."""
    import resource

    value = config.get("rlimits", {}).get("RLIMIT_AS")
    if value:
        resource.setrlimit(resource.RLIMIT_AS, (value, value))


def _import_trusted():
    """Everything the runner needs, imported and bound before any learner code."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from IPython.core.interactiveshell import InteractiveShell

    from autograder.checks import probes

    return InteractiveShell, probes.execute


def _enter_sandbox(config: dict) -> None:
    """cwd, rlimits, then (as root) an unprivileged uid, and death with the grader."""
    import ctypes
    import resource
    import signal

    os.chdir(config.get("cwd", os.getcwd()))
    for name, value in config.get("rlimits", {}).items():
        resource.setrlimit(getattr(resource, name), (value, value))
    uid = config.get("uid")
    if os.geteuid() == 0 and uid:
        # Root ignores RLIMIT_NPROC and could undo the sandbox's mounts: drop to an unprivileged uid.
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    parent = config.get("parent")
    try:  # set after the uid change, which clears it: die when the grader dies
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if parent and os.getppid() != parent:
        os._exit(0)  # the grader is already gone


def _read_exact(fd: int, n: int, _read=os.read, _join=b"".join, _min=min) -> bytes:
    chunks = []
    while n:
        chunk = _read(fd, _min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return _join(chunks)


def signer(key: bytes):
    """``sign(nonce, data)``: HMAC-SHA256 of the nonce and the data, made only of C functions bound now."""
    import hashlib

    block = 64
    key = key.ljust(block, b"\0")
    inner = bytes(b ^ 0x36 for b in key)
    outer = bytes(b ^ 0x5C for b in key)

    def sign(nonce: int, data: bytes, _sha256=hashlib.sha256, _inner=inner, _outer=outer, _str=str) -> bytes:
        return _sha256(_outer + _sha256(_inner + _str(nonce).encode() + b"\0" + data).digest()).digest()

    return sign


def _send(fd: int, wire, message: dict, nonce: int, sign, _write=os.write, _memoryview=memoryview) -> None:
    try:
        payload = wire.pack(message)
    except (wire.ProtocolError, TypeError, ValueError):
        payload = wire.pack({"ok": False, "kind": "unsendable", "error": "the answer is larger than the protocol allows"})
    view = _memoryview(payload + sign(nonce, payload))
    while view:
        view = view[_write(fd, view):]


def _start_failure(err: BaseException) -> dict:
    """The "not ready" answer for ``err``, raised before any learner code ran (so its text is ours)."""
    kind, cause = "raised", err
    for _ in range(16):  # the chain: e.g. numpy's ImportError, caused by a library that could not be mapped
        if cause is None:
            break
        text = str(cause).lower()
        if _error_kind(cause) == "memory" or "failed to map segment" in text or "cannot allocate memory" in text:
            kind = "memory"
            break
        cause = cause.__cause__ or cause.__context__
    return {"ok": False, "ready": False, "kind": kind, "error": f"{type(err).__name__}: {str(err).strip()[:200]}"}


def _error_kind(err: BaseException, _isinstance=isinstance, _MemoryError=MemoryError, _RuntimeError=RuntimeError,
                _OSError=OSError, _str=str, _enomem=errno.ENOMEM) -> str:
    """``memory`` or ``raised``, by identity with the real classes (never by a name the learner chose)."""
    if _isinstance(err, _MemoryError):
        return "memory"
    if _isinstance(err, _RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in _str(err):
        return "memory"
    if _isinstance(err, _OSError) and err.errno == _enomem:  # e.g. an import that cannot map its files
        return "memory"
    return "raised"


def _message(err: BaseException, _str=str, _type=type) -> str:
    try:
        return f"{_type(err).__name__}: {_str(err)[:300]}"
    except BaseException:  # noqa: BLE001 — a hostile __str__
        return f"{_type(err).__name__}: (no message)"


def _run_cell(shell, source: str, _error_kind=_error_kind, _message=_message) -> dict:
    try:
        result = shell.run_cell(source, store_history=False, silent=False)
        err = result.error_before_exec or result.error_in_exec
        answer = {"ok": err is None, "kind": None if err is None else _error_kind(err),
                  "error": None if err is None else _message(err)}
    except BaseException as err:  # noqa: BLE001 — a SystemExit from the cell must not end the runner
        answer = {"ok": False, "kind": _error_kind(err), "error": _message(err)}
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass
    return answer


def _self_test(shell) -> dict | None:
    """Why this kernel cannot run a notebook within its limits (None when it can), before any learner code."""
    try:
        import torch

        torch.ones(4096, 4096).sum().item()  # 64 MB: the least any chapter's cells allocate
        result = shell.run_cell("import einops, numpy\n_tdd_probe = [0] * 1000\ndel _tdd_probe", store_history=False,
                                silent=True)
        err = result.error_before_exec or result.error_in_exec
        if err is not None:
            return _start_failure(err)
    except BaseException as err:  # noqa: BLE001 — reported as a kernel that cannot start
        return _start_failure(err)
    return None


def _reporter(fd: int | None):
    """``report(violation)``: written at once to the violations channel (nothing when there is none)."""
    if fd is None:
        return None

    def report(message: str, _write=os.write, _fd=fd, _Exception=Exception) -> None:
        try:
            _write(_fd, message.encode("utf-8", "replace")[:2000] + b"\n")
        except _Exception:  # noqa: BLE001 — a closed channel: the verdict side sees it closed
            pass

    return report


class _Locked:
    """What the locked-down loop holds: the state before the learner's code, and the checks run before a probe."""

    def __init__(self, lockdown, guard):
        self.snapshot = lockdown.Snapshot()
        self.restore = lockdown.restore
        self.threads = guard.other_threads()
        self.signals = guard.signal_handlers()
        self.other_threads, self.signal_handlers = guard.other_threads, guard.signal_handlers


def _refusal(locked: _Locked) -> str | None:
    """Why a check may not start now: something of the learner's runs beside it, out of its sight."""
    if locked.other_threads() > locked.threads:
        return ("left a thread running (started before the check); checks do not run beside it, where it could "
                "call what the check must not see: stop your threads before the check")
    if locked.signal_handlers() != locked.signals:
        return "installed a signal handler, which could run code beside the check: remove it"
    return None


# Packages that load native libraries through ctypes when imported, which the lockdown refuses: they are imported
# before it, when the notebook's code or the chapter's checks name them (sandbox.Runner.preload). torchvision
# loads its C++ operators so (chapter 5's first cell failed with "torchvision::nms does not exist"); importing
# it costs as much as importing PyTorch, so a notebook that never names it does not pay for it.
NATIVE_LIBRARIES = ("torchvision",)


def _load_native_libraries(names) -> None:
    import importlib

    for name in names if isinstance(names, list) else ():
        if name in NATIVE_LIBRARIES:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 — not installed: the chapters that need it say so in their own cells
                pass


def _serve(answer_fd: int, shell, wire, execute, sign, report, locked_factory) -> int:
    main_pid, getpid, exit_now = os.getpid(), os.getpid, os._exit
    send, read_exact, run_cell = _send, _read_exact, _run_cell
    user_ns = shell.user_ns
    problem = _self_test(shell)
    if problem:
        send(answer_fd, wire, problem, 0, sign)
        return 1
    shell.showtraceback = lambda *args, **kwargs: None  # the verdict side reads the error, never a traceback
    locked = locked_factory()  # from here on, no learner code can switch the guard off or reach its state
    str_, int_, isinstance_, dict_ = str, int, isinstance, dict
    send(answer_fd, wire, {"ok": True, "ready": True, "pid": main_pid}, 0, sign)
    while True:
        try:
            request = wire.parse(read_exact(0, wire.body_size(read_exact(0, 8))))
        except EOFError:
            return 0
        locked.restore(locked.snapshot)  # the builtins and the modules this loop uses, as before any learner code
        op = request.get("op")
        nonce = request.get("nonce")
        nonce = nonce if isinstance_(nonce, int_) else -1
        if op == "exit":
            return 0
        if op == "cell":
            answer = run_cell(shell, str_(request.get("source", "")))
        elif op == "probe":
            target = request.get("target")
            refused = _refusal(locked)
            if refused:
                answer = {"ok": False, "kind": "raised", "error": "", "violation": refused}
            elif not isinstance_(target, str_) or target not in user_ns:
                answer = {"ok": False, "kind": "missing", "error": f"{target} is not defined: run the cell that "
                          "defines it", "violation": None}
            else:
                answer = execute(user_ns[target], request.get("probe"), request.get("inputs"),
                                 tuple(request.get("forbidden", ())), tuple(request.get("answer_files", ())), report)
        else:
            answer = {"ok": False, "kind": "raised", "error": f"unknown op {op!r}"}
        if getpid() != main_pid:  # a fork of the learner's code came back here: it must not answer
            exit_now(0)
        locked.restore(locked.snapshot)  # the answer is framed by the runner's json, not a patched one
        send(answer_fd, wire, answer if isinstance_(answer, dict_) else {"ok": False}, nonce, sign)


def main() -> int:
    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    answer_fd = _open_answer_channel()
    from autograder import wire  # the framing alone: the standard library

    try:
        first = wire.parse(_read_exact(0, wire.body_size(_read_exact(0, 8))))
        key = bytes.fromhex(first["key"])
    except (EOFError, KeyError, TypeError, ValueError, wire.ProtocolError):
        return 2
    sign = signer(key)
    del first, key
    _limit_memory(config)
    try:
        shell_class, execute = _import_trusted()
        _enter_sandbox(config)
        shell = shell_class.instance()
        from autograder import lockdown
        from autograder.checks import guard
    except BaseException as err:  # noqa: BLE001 — e.g. a memory limit too low to load PyTorch or build the shell
        _send(answer_fd, wire, _start_failure(err), 0, sign)
        return 1
    report = _reporter(config.get("violations_fd"))

    def locked_factory():
        _load_native_libraries(config.get("preload"))
        locked = _Locked(lockdown, guard)
        lockdown.install(frozenset({guard.watched.__code__}))
        for name in [m for m in sys.modules if m == "autograder" or m.startswith("autograder.")]:
            del sys.modules[name]  # importing them again is refused (the runner keeps its own references)
        return locked

    return _serve(answer_fd, shell, wire, execute, sign, report, locked_factory)


if __name__ == "__main__":
    sys.exit(main())
