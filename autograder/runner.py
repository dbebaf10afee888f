"""The student-side runner: the only process in which a learner's code ever runs.

Started by :mod:`autograder.sandbox` as ``python -I -m autograder.runner LIMITS_JSON``
inside the sandbox. It reads requests (:mod:`autograder.wire` messages) on stdin
and answers on a private copy of its original stdout; the learner's own prints go
to stderr, which the grader drains with a size cap. Requests:

* ``{"op": "cell", "source": str}`` — run one cell with IPython (magics work);
  answer ``{"ok": bool, "error": str | None, "kind": "memory" | "raised" | None}``. An
  error does not stop later cells.
* ``{"op": "probe", "target": str, "probe": str, "inputs": str, "forbidden": [str],
  "answer_files": [str]}`` — call :func:`autograder.checks.probes.execute` *directly*
  (not through ``run_cell``, so input transformers and ``showtraceback`` overrides never
  see it) on the notebook global ``target``.
* ``{"op": "exit"}``.

The first answer, sent before any learner code runs, is ``{"ok": true, "ready": true,
"pid": <pid>}``, or ``{"ok": false, "ready": false, "kind": "memory" | "raised", "error": ...}``
when the kernel cannot work within its limits. The memory limit is set before PyTorch is
loaded, so a limit too low for it fails within a fraction of a second, not after the whole
import; a self-test then allocates a tensor and runs a cell. This process decides nothing:
the verdict is computed by the grader from the outputs, so whatever the learner's code does
to this process (patching ``torch``, ``builtins``, IPython) can only change its own outputs.
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


def _limit_memory(limits: dict) -> None:
    """RLIMIT_AS before anything large is loaded: a limit PyTorch cannot load within fails at once."""
    import resource

    value = limits.get("rlimits", {}).get("RLIMIT_AS")
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


def _enter_sandbox(limits: dict) -> None:
    """cwd, rlimits, then (as root) an unprivileged uid, and death with the grader."""
    import ctypes
    import resource
    import signal

    os.chdir(limits.get("cwd", os.getcwd()))
    for name, value in limits.get("rlimits", {}).items():
        resource.setrlimit(getattr(resource, name), (value, value))
    uid = limits.get("uid")
    if os.geteuid() == 0 and uid:
        # Root ignores RLIMIT_NPROC and could undo the sandbox's mounts: drop to an unprivileged uid.
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    parent = limits.get("parent")
    try:  # set after the uid change, which clears it: die when the grader dies
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if parent and os.getppid() != parent:
        os._exit(0)  # the grader is already gone


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _send(fd: int, wire, message: dict) -> None:
    try:
        payload = wire.pack(message)
    except (wire.ProtocolError, TypeError, ValueError):
        payload = wire.pack({"ok": False, "kind": "unsendable", "error": "the answer is larger than the protocol allows"})
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]


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


def _error_kind(err: BaseException) -> str:
    """``memory`` or ``raised``, by identity with the real classes (never by a name the learner chose)."""
    if isinstance(err, MemoryError):
        return "memory"
    if isinstance(err, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(err):
        return "memory"
    if isinstance(err, OSError) and err.errno == errno.ENOMEM:  # e.g. an import that cannot map its files
        return "memory"
    return "raised"


def _run_cell(shell, source: str) -> dict:
    type_ = type
    try:
        result = shell.run_cell(source, store_history=False, silent=False)
        err = result.error_before_exec or result.error_in_exec
        answer = {"ok": err is None, "kind": None if err is None else _error_kind(err),
                  "error": None if err is None else f"{type_(err).__name__}: {str(err)[:300]}"}
    except BaseException as err:  # noqa: BLE001 — a SystemExit from the cell must not end the runner
        answer = {"ok": False, "kind": _error_kind(err), "error": f"{type_(err).__name__}: {str(err)[:300]}"}
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass
    return answer


def _run_probe(user_ns: dict, execute, request: dict) -> dict:
    target = request.get("target")
    if not isinstance(target, str) or target not in user_ns:
        return {"ok": False, "kind": "missing", "error": f"{target} is not defined: run the cell that defines it",
                "violation": None}
    answer = execute(user_ns[target], request.get("probe"), request.get("inputs"),
                     tuple(request.get("forbidden", ())), tuple(request.get("answer_files", ())))
    try:
        sys.stdout.flush()
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


def _serve(answer_fd: int, shell, wire, execute) -> int:
    import builtins

    saved_builtins = dict(builtins.__dict__)
    main_pid, getpid, exit_now = os.getpid(), os.getpid, os._exit
    send, read_exact, run_cell, run_probe = _send, _read_exact, _run_cell, _run_probe
    user_ns = shell.user_ns
    problem = _self_test(shell)
    if problem:
        send(answer_fd, wire, problem)
        return 1
    send(answer_fd, wire, {"ok": True, "ready": True, "pid": main_pid})
    while True:
        try:
            request = wire.parse(read_exact(0, wire.body_size(read_exact(0, 8))))
        except EOFError:
            return 0
        op = request.get("op")
        if op == "exit":
            return 0
        if op == "cell":
            answer = run_cell(shell, str(request.get("source", "")))
        elif op == "probe":
            builtins.__dict__.update(saved_builtins)  # probes and encoding run with the real builtins
            answer = run_probe(user_ns, execute, request)
        else:
            answer = {"ok": False, "kind": "raised", "error": f"unknown op {op!r}"}
        if getpid() != main_pid:  # a fork of the learner's code came back here: it must not answer
            exit_now(0)
        send(answer_fd, wire, answer)


def main() -> int:
    limits = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    answer_fd = _open_answer_channel()
    from autograder import wire  # the framing alone: the standard library

    _limit_memory(limits)
    try:
        shell_class, execute = _import_trusted()
        _enter_sandbox(limits)
        shell = shell_class.instance()
    except BaseException as err:  # noqa: BLE001 — e.g. a memory limit too low to load PyTorch or build the shell
        _send(answer_fd, wire, _start_failure(err))
        return 1
    return _serve(answer_fd, shell, wire, execute)


if __name__ == "__main__":
    sys.exit(main())
