"""Run the student-side runner (:mod:`autograder.runner`) in a sandbox, with limits.

Isolation levels, best first (:func:`detect` picks one with a real probe):

* ``bwrap`` — bubblewrap: new user (when not root), pid, net, ipc, uts namespaces; no
  network; a root file system made only of read-only binds of the system and Python
  directories, the course packages with the instructor's files masked (the source
  notebooks, the solutions module of the chapter being graded and every check module
  that imports it, ``__pycache__``), a fresh ``/tmp`` and a writable scratch directory
  holding only a copy of the notebook. Nothing else of the host is visible: not the
  submissions, not the gradebook, not the grader's output.
* ``unshare`` — root without bubblewrap: new net and pid namespaces (no network, the
  whole tree is killed with its init), but the file system is NOT hidden.
* ``none`` — rlimits only; network and file system isolation are off (a warning says so).

Limits in every level: ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE``, ``RLIMIT_NPROC`` (the runner
drops to an unprivileged uid when started as root, since root ignores it), ``RLIMIT_CPU``,
no core dumps; wall time per request enforced here (the whole tree is killed); the
learner's output is drained while it streams and the runner is killed past a cap.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import autograder
import solutions

PACKAGE_DIR = Path(autograder.__file__).resolve().parent
SOLUTIONS_DIR = Path(solutions.__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent


@dataclass(frozen=True)
class Limits:
    cell_seconds: float = 60.0  # wall time of one cell or one probe
    notebook_seconds: float = 600.0  # wall time of everything run for one notebook
    memory_bytes: int = 6 * 2**30  # RLIMIT_AS; `import torch` alone maps about 3.3 GB of address space
    processes: int = 64  # RLIMIT_NPROC of the sandbox uid (threads count too)
    file_bytes: int = 64 * 2**20  # RLIMIT_FSIZE: the largest file the learner may write
    output_bytes: int = 1 * 2**20  # the learner's prints; the runner is killed past this
    cpu_seconds: int = 1200  # RLIMIT_CPU, a backstop behind the wall-time limits
    start_seconds: float = 60.0  # wall time to start the runner (imports torch)


class RunnerDied(Exception):
    """The runner was killed or died; ``kind`` is timeout, memory, crashed or output."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@functools.lru_cache(maxsize=1)
def detect() -> str:
    """The best isolation level that works here: ``bwrap``, ``unshare`` or ``none`` (probed for real)."""
    forced = os.environ.get("AUTOGRADER_SANDBOX")
    if forced in ("bwrap", "unshare", "none"):
        return forced
    if shutil.which("bwrap"):
        cmd = _bwrap_prefix(Path(tempfile.gettempdir()), hide=[]) + [sys.executable, "-I", "-c", "print('ok')"]
        try:
            out = subprocess.run(cmd, capture_output=True, timeout=30)
            if out.returncode == 0 and out.stdout.strip() == b"ok":
                return "bwrap"
        except (OSError, subprocess.SubprocessError):
            pass
    if os.geteuid() == 0 and shutil.which("unshare"):
        try:
            out = subprocess.run(["unshare", "--net", "--pid", "--fork", "--kill-child", "true"],
                                 capture_output=True, timeout=30)
            if out.returncode == 0:
                return "unshare"
        except (OSError, subprocess.SubprocessError):
            pass
    return "none"


def warning(level: str) -> str | None:
    if level == "bwrap":
        return None
    if level == "unshare":
        return ("warning: bubblewrap (bwrap) not usable: submissions run without network but CAN READ the file "
                "system (hidden tests, solutions). Install it: apt-get install bubblewrap")
    return ("warning: no sandbox available (bubblewrap not usable and not root): submissions run with resource "
            "limits only — network and file-system isolation are OFF. Install bubblewrap (apt-get install "
            "bubblewrap) and allow unprivileged user namespaces, or grade as root.")


def _sandbox_uid() -> int | None:
    """An unprivileged uid for this worker when we are root (root ignores RLIMIT_NPROC)."""
    return 200000 + os.getpid() % 100000 if os.geteuid() == 0 else None


def _world_traversable(path: Path) -> bool:
    """Whether every folder down to ``path`` lets other users through (o+x)."""
    path = Path(path).resolve()
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def _system_dirs() -> list[Path]:
    dirs = [Path(p) for p in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc")]
    dirs += [Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent.parent]
    return [d for d in dict.fromkeys(dirs) if d.exists()]


def _bwrap_prefix(scratch: Path, hide: list[Path]) -> list[str]:
    # As root: no user namespace (so the runner can drop to an unmapped unprivileged uid itself);
    # otherwise an unprivileged user namespace.
    unshare = (["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
               if os.geteuid() == 0 else ["--unshare-all"])
    cmd = ["bwrap", *unshare, "--die-with-parent", "--new-session", "--tmpfs", "/", "--dev", "/dev",
           "--proc", "/proc", "--tmpfs", "/tmp"]
    parents: list[Path] = []
    for d in [*_system_dirs(), PACKAGE_DIR, SOLUTIONS_DIR]:
        parents += [p for p in reversed(d.parents) if p != Path("/") and p not in parents]
    for p in parents:  # bwrap would create them 0700: unreadable once the runner drops its uid
        cmd += ["--perms", "0755", "--dir", str(p)]
    for d in _system_dirs():
        if d.is_symlink():
            cmd += ["--symlink", os.readlink(d), str(d)]
        else:
            cmd += ["--ro-bind", str(d), str(d)]
    for d in (PACKAGE_DIR, SOLUTIONS_DIR):
        cmd += ["--ro-bind", str(d), str(d)]
    masks = [PACKAGE_DIR / "source", SOLUTIONS_DIR / "__pycache__", PACKAGE_DIR / "checks" / "__pycache__"]
    for path in masks + list(hide):
        path = Path(path)
        if not any(path == d or d in path.parents for d in [*_system_dirs(), PACKAGE_DIR, SOLUTIONS_DIR]):
            continue  # not visible anyway
        if path.is_dir():
            cmd += ["--tmpfs", str(path)]
        elif path.exists():
            cmd += ["--ro-bind", "/dev/null", str(path)]
    cmd += ["--bind", str(scratch), "/sandbox", "--chdir", "/sandbox", "--setenv", "HOME", "/sandbox",
            "--setenv", "OMP_NUM_THREADS", "1", "--setenv", "MPLBACKEND", "Agg"]
    return cmd


def hidden_paths(module: str | None, extra: list[Path] = ()) -> list[Path]:
    """Files the learner must not read when chapter ``module`` (e.g. "attention") is graded."""
    paths = [Path(p) for p in extra]
    if module:
        paths.append(SOLUTIONS_DIR / f"{module}.py")
        for check in (PACKAGE_DIR / "checks").glob("*.py"):
            text = check.read_text(encoding="utf-8", errors="replace")
            if f"solutions.{module}" in text or f"from solutions import {module}" in text:
                paths.append(check)
    return paths


@dataclass
class Runner:
    """One sandboxed runner process; restart it after a kill with :meth:`start`."""

    limits: Limits
    scratch: Path
    hide: list[Path] = field(default_factory=list)
    level: str = field(default_factory=detect)
    unprivileged: bool = True  # drop to an unprivileged uid when root (False only for the learner's self-check)
    proc: subprocess.Popen | None = None
    output: bytearray = field(default_factory=bytearray)
    _output_total: int = 0
    _over: bool = False

    def _uid(self) -> int | None:
        """The unprivileged uid the runner drops to; outside bwrap only when it can still read Python there."""
        if not self.unprivileged:
            return None
        if self.level != "bwrap" and not all(_world_traversable(p) for p in (sys.base_prefix, sys.prefix)):
            return None
        return _sandbox_uid()

    def _command(self) -> tuple[list[str], dict]:
        uid = self._uid()
        rlimits = {"RLIMIT_AS": self.limits.memory_bytes, "RLIMIT_FSIZE": self.limits.file_bytes,
                   "RLIMIT_NPROC": self.limits.processes, "RLIMIT_CPU": self.limits.cpu_seconds, "RLIMIT_CORE": 0}
        cwd = "/sandbox" if self.level == "bwrap" else str(self.scratch)
        config = json.dumps({"rlimits": rlimits, "uid": uid, "cwd": cwd})
        runner = [sys.executable, "-I", "-m", "autograder.runner", config]
        env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "HOME": cwd,
               "LANG": "C.UTF-8"}
        if self.level == "bwrap":
            return _bwrap_prefix(self.scratch, self.hide) + runner, env
        if self.level == "unshare":
            return ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"] + runner, env
        return runner, env

    def start(self) -> None:
        self.kill()
        uid = self._uid()
        if uid is not None:
            os.chown(self.scratch, uid, uid)
            for p in self.scratch.iterdir():
                os.chown(p, uid, uid)
        cmd, env = self._command()
        preexec = os.setsid
        self.output = bytearray()
        self._output_total = 0
        self._over = False
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     cwd=str(self.scratch), env=env, preexec_fn=preexec, close_fds=True)
        self._drain = threading.Thread(target=self._drain_output, args=(self.proc,), daemon=True)
        self._drain.start()
        self._read_answer(self.limits.start_seconds)

    def _drain_output(self, proc: subprocess.Popen) -> None:
        while True:
            try:
                chunk = proc.stderr.read1(65536)
            except (OSError, ValueError):
                return
            if not chunk:
                return
            self._output_total += len(chunk)
            if len(self.output) < 16384:
                self.output += chunk[: 16384 - len(self.output)]
            if self._output_total > self.limits.output_bytes and not self._over:
                self._over = True
                self._kill_tree(proc)

    @staticmethod
    def _kill_tree(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.kill()
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        if self.proc is not None:
            self._kill_tree(self.proc)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                try:
                    stream.close()
                except OSError:
                    pass
            self.proc = None

    def _died(self) -> RunnerDied:
        proc = self.proc
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill_tree(proc)
            code = proc.wait()
        self._drain.join(timeout=5)
        tail = bytes(self.output[-2000:]).decode("utf-8", "replace")
        self.kill()
        if self._over:
            return RunnerDied("output", f"printed more than {self.limits.output_bytes} bytes; the kernel was stopped")
        if "MemoryError" in tail or "can't allocate memory" in tail or code in (-signal.SIGKILL,):
            if "MemoryError" in tail or "allocate" in tail:
                return RunnerDied("memory", "the kernel ran out of its memory limit")
        if code == -signal.SIGXCPU or code == 128 + signal.SIGXCPU:
            return RunnerDied("timeout", "the kernel used up its CPU time limit")
        return RunnerDied("crashed", f"the kernel died (exit status {code})")

    def _read_answer(self, timeout: float) -> dict:
        proc = self.proc
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf = bytearray()
        need = 8
        size = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise RunnerDied("timeout", f"took longer than {timeout:g} s; the kernel was stopped")
            ready, _, _ = select.select([fd], [], [], min(left, 0.5))
            if self._over:
                raise self._died()
            if not ready:
                if proc.poll() is not None:
                    raise self._died()
                continue
            chunk = os.read(fd, min(need - len(buf), 1 << 20))
            if not chunk:
                raise self._died()
            buf += chunk
            if len(buf) == need:
                if size is None:
                    (size,) = struct.unpack(">Q", bytes(buf))
                    if size > 80 * 2**20:
                        self.kill()
                        raise RunnerDied("crashed", "the kernel sent a malformed answer")
                    buf, need = bytearray(), size
                    if size == 0:
                        break
                else:
                    break
        try:
            answer = json.loads(bytes(buf))
            if not isinstance(answer, dict):
                raise ValueError
        except ValueError:
            self.kill()
            raise RunnerDied("crashed", "the kernel sent a malformed answer") from None
        return answer

    def request(self, message: dict, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            raise RunnerDied("crashed", "the kernel is not running")
        data = json.dumps(message).encode("utf-8")
        try:
            self.proc.stdin.write(struct.pack(">Q", len(data)) + data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died() from None
        return self._read_answer(timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                data = json.dumps({"op": "exit"}).encode()
                self.proc.stdin.write(struct.pack(">Q", len(data)) + data)
                self.proc.stdin.flush()
            except OSError:
                pass
        self.kill()
