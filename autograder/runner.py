"""The student-side runner: the only process in which a learner's code ever runs.

Started by :mod:`autograder.sandbox` as ``python -I -m autograder.runner LIMITS_JSON``
inside the sandbox. It reads requests from stdin and writes answers on a private
copy of its original stdout; the learner's own prints go to stderr, which the
grader drains with a size cap. Messages are 8-byte big-endian lengths followed by
UTF-8 JSON. Requests:

* ``{"op": "cell", "source": str}`` — run one cell with IPython (magics work);
  answer ``{"ok": bool, "error": str | None}``. An error does not stop later cells.
* ``{"op": "probe", "target": str, "probe": str, "inputs": str}`` — call the probe
  ``autograder.checks.probes.<probe>`` *directly* (not through ``run_cell``, so input
  transformers and ``showtraceback`` overrides never see it) on the notebook global
  ``target`` and the :func:`core.decode` d inputs; answer ``{"ok": true, "outputs":
  core.encode(outputs)}`` or ``{"ok": false, "error": ..., "type": ...}``.
* ``{"op": "exit"}``.

This process decides nothing: the verdict is computed by the grader from the
outputs, so whatever the learner's code does to this process (patching ``torch``,
``builtins``, IPython) can only change its own outputs.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import sys

MAX_ANSWER = 64 * 1024 * 1024  # bytes of one encoded answer


def _apply_limits(limits: dict) -> None:
    for name, value in limits.get("rlimits", {}).items():
        res = getattr(resource, name)
        resource.setrlimit(res, (value, value))
    uid = limits.get("uid")
    if os.geteuid() == 0 and uid:
        # Root ignores RLIMIT_NPROC and could undo the sandbox's mounts: drop to an unprivileged uid.
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _send(fd: int, message: dict) -> None:
    data = json.dumps(message).encode("utf-8")
    if len(data) > MAX_ANSWER:
        data = json.dumps({"ok": False, "type": "OutputTooLarge",
                           "error": f"the outputs are larger than {MAX_ANSWER} bytes"}).encode()
    payload = struct.pack(">Q", len(data)) + data
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def main() -> int:
    limits = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    # Private answer channel; fd 1 becomes the learner's output stream (fd 2, capped by the grader).
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    os.set_inheritable(answer_fd, False)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch  # noqa: F401  (imported before the limits: the import itself is trusted and large)

    torch.set_num_threads(1)
    from IPython.core.interactiveshell import InteractiveShell

    from autograder.checks import core, probes

    # Bind what we need now, so that a learner patching the modules later cannot reach us.
    encode, decode = core.encode, core.decode
    probe_functions = {name: getattr(probes, name) for name in dir(probes) if not name.startswith("_")}
    os.chdir(limits.get("cwd", os.getcwd()))
    _apply_limits(limits)

    import builtins

    saved_builtins = dict(builtins.__dict__)
    shell = InteractiveShell.instance()
    user_ns = shell.user_ns
    send, read_exact, unpack = _send, _read_exact, struct.unpack
    loads, dumps_type = json.loads, type

    main_pid = os.getpid()
    send(answer_fd, {"ok": True, "ready": True})
    while True:
        if os.getpid() != main_pid:  # a fork of the learner's code came back here: it must not answer
            os._exit(0)
        try:
            (size,) = unpack(">Q", read_exact(0, 8))
            request = loads(read_exact(0, size))
        except EOFError:
            return 0
        op = request.get("op")
        if op == "exit":
            return 0
        if op == "cell":
            try:
                result = shell.run_cell(request["source"], store_history=False, silent=False)
                err = result.error_before_exec or result.error_in_exec
                answer = {"ok": err is None,
                          "error": None if err is None else f"{dumps_type(err).__name__}: {str(err)[:500]}"}
            except BaseException as err:  # noqa: BLE001 — a SystemExit from the cell must not end the runner
                answer = {"ok": False, "error": f"{dumps_type(err).__name__}: {str(err)[:500]}"}
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001
                pass
            if os.getpid() != main_pid:
                os._exit(0)
            send(answer_fd, answer)
        elif op == "probe":
            builtins.__dict__.update(saved_builtins)  # probes and encode run with the real builtins
            try:
                if request["target"] not in user_ns:
                    answer = {"ok": False, "type": "Missing", "error": f"{request['target']} is not defined"}
                else:
                    probe = probe_functions[request["probe"]]
                    outputs = probe(user_ns[request["target"]], decode(request["inputs"]))
                    answer = {"ok": True, "outputs": encode(outputs)}
            except BaseException as err:  # noqa: BLE001 — reported to the verdict process, which decides
                answer = {"ok": False, "type": dumps_type(err).__name__, "error": str(err)[:500]}
            try:
                sys.stdout.flush()
            except BaseException:  # noqa: BLE001
                pass
            if os.getpid() != main_pid:
                os._exit(0)
            if not isinstance(answer.get("type", ""), str):
                answer["type"] = "Error"
            send(answer_fd, answer)
        else:
            send(answer_fd, {"ok": False, "type": "Protocol", "error": f"unknown op {op!r}"})


if __name__ == "__main__":
    sys.exit(main())
