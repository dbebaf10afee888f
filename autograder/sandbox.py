"""Run the student-side runner (:mod:`autograder.runner`) in a sandbox, with limits.

Isolation levels, best first (:func:`detect` picks one with a real probe):

* ``bwrap`` — bubblewrap: new pid, net, ipc, uts namespaces (and a user namespace when
  not root); no network; a read-only root made only of read-only binds of the system
  and Python directories and of the course packages, with every chapter's checks, the answer
  modules of the graded chapter and of the later ones, the source notebooks and ``__pycache__`` masked; a size-capped
  ``/tmp`` and a size-capped writable ``/sandbox`` (both tmpfs, fresh at every start).
  Nothing else of the host is visible: not the submissions, not the gradebook, not the
  grader's output.
* ``unshare`` — root without bubblewrap: new net and pid namespaces (no network, the
  whole tree is killed with its init), but the file system is NOT hidden.
* ``none`` — rlimits only; network and file-system isolation are off (a warning says so).

Limits in every level: ``RLIMIT_AS`` (memory), ``RLIMIT_FSIZE``, ``RLIMIT_NPROC`` (as root,
the runner drops to an unprivileged uid of its own, fresh at every start, so no two
runners share a process count), ``RLIMIT_CPU``, no core dumps; wall time per request
enforced here, both for writing the request and for reading the answer; the learner's
output is drained while it streams and the runner is killed past a cap. After every
request, every process the learner's code left behind in the sandbox is killed
(:meth:`Runner.reap`), so nothing outlives the cell or check that started it.
"""

from __future__ import annotations

import errno
import functools
import hmac
import json
import os
import re
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import autograder
import solutions
from autograder import environment, limits, wire
from autograder.protocol import Died, Failed, Op
from autograder.runner import signer

PACKAGE_DIR = Path(autograder.__file__).resolve().parent
MAC_BYTES = 32  # each answer is followed by its HMAC-SHA256 (autograder.runner.signer)
SOLUTIONS_DIR = Path(solutions.__file__).resolve().parent


@dataclass(frozen=True)
class Limits:
    """A kernel's limits; the defaults, and why each value, are in :mod:`autograder.limits`."""

    cell_seconds: float = limits.CELL_SECONDS  # wall time of one cell or one probe
    notebook_seconds: float = limits.NOTEBOOK_SECONDS  # wall time of everything run for one notebook
    memory_bytes: int = limits.MEMORY_BYTES  # RLIMIT_AS
    processes: int = limits.PROCESSES  # RLIMIT_NPROC of the sandbox uid (threads count too)
    file_bytes: int = limits.FILE_BYTES  # RLIMIT_FSIZE: the largest file the learner may write
    disk_bytes: int = limits.DISK_BYTES  # everything the learner may write (/sandbox and /tmp together, bwrap)
    output_bytes: int = limits.OUTPUT_BYTES  # the learner's prints; the runner is killed past this
    cpu_seconds: int = limits.CPU_SECONDS  # RLIMIT_CPU, a backstop behind the wall-time limits
    start_seconds: float = limits.START_SECONDS  # wall time to start the runner (imports torch)


class RunnerDied(Exception):
    """The runner was stopped or died; ``kind`` (a :class:`autograder.protocol.Died`) says how."""

    def __init__(self, kind: Died, message: str):
        super().__init__(message)
        self.kind = Died(kind)


@functools.lru_cache(maxsize=1)
def detect() -> str:
    """The best isolation level that works here: ``bwrap``, ``unshare`` or ``none`` (probed for real)."""
    forced = os.environ.get("AUTOGRADER_SANDBOX")
    if forced in ("bwrap", "unshare", "none"):
        return forced
    if shutil.which("bwrap"):
        cmd = _bwrap_prefix(hide=[], limits=Limits()) + [sys.executable, "-I", "-c", "print('ok')"]
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


BWRAP_MINIMUM = (0, 8)  # --size (size-capped tmpfs for /tmp and /sandbox) came with bubblewrap 0.8.0


def bwrap_version() -> tuple[int, ...] | None:
    """The version of the ``bwrap`` on PATH (``bubblewrap 0.6.1`` -> (0, 6, 1)), or None without one."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(part) for part in found.groups() if part is not None) if found else None


def _bwrap_problem() -> str:
    """Why bubblewrap is not used, when its version says why (older than 0.8); else a plain "not usable"."""
    version = bwrap_version()
    if version is not None and version < BWRAP_MINIMUM:
        return (f"bubblewrap {'.'.join(map(str, version))} is older than 0.8 (it has no --size, which the sandbox "
                "needs for its size-capped /tmp and /sandbox), so it is not used")
    return "bubblewrap (bwrap) not usable"


def warning(level: str) -> str | None:
    """What the instructor must know about ``level``: what a submission can do there that it cannot under bwrap."""
    if level == "bwrap":
        return None
    install = "Install bubblewrap >= 0.8 (apt-get install bubblewrap; Ubuntu 22.04 ships 0.6: use a newer release)"
    if level == "unshare":
        return (f"warning: {_bwrap_problem()}: submissions run without network but CAN READ the file system (hidden "
                "tests, solutions), and what they write is capped per file, not in total. " + install)
    return (f"warning: no sandbox available ({_bwrap_problem()}, and not root): submissions run with resource limits "
            "only — network and file-system isolation and the cap on their total disk use are OFF. " + install
            + " and allow unprivileged user namespaces, or grade as root.")


def _fresh_uid() -> int | None:
    """An unprivileged uid used by no one else, when we are root (root ignores RLIMIT_NPROC)."""
    return 2**30 + secrets.randbelow(2**29) if os.geteuid() == 0 else None


def _world_traversable(path: Path) -> bool:
    """Whether every folder down to ``path`` lets other users through (o+x)."""
    path = Path(path).resolve()
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def _system_dirs() -> list[Path]:
    dirs = [Path(p) for p in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc")]
    dirs += [Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent.parent]
    return [d for d in dict.fromkeys(dirs) if d.exists()]


def _bwrap_prefix(hide: list[Path], limits: Limits) -> list[str]:
    # As root: no user namespace (so the runner can drop to an unmapped unprivileged uid itself);
    # otherwise an unprivileged user namespace.
    unshare = (["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
               if os.geteuid() == 0 else ["--unshare-all"])
    half = max(limits.disk_bytes // 2, 1 << 20)
    cmd = ["bwrap", *unshare, "--die-with-parent", "--new-session", "--size", str(1 << 20), "--tmpfs", "/",
           "--dev", "/dev", "--proc", "/proc", "--perms", "01777", "--size", str(half), "--tmpfs", "/tmp",
           "--perms", "01777", "--size", str(half), "--tmpfs", "/sandbox"]
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
    masks = [PACKAGE_DIR / "source", SOLUTIONS_DIR / "__pycache__", PACKAGE_DIR / "checks" / "__pycache__",
             PACKAGE_DIR / "__pycache__"]
    visible = [*_system_dirs(), PACKAGE_DIR, SOLUTIONS_DIR]
    for path in masks + [Path(p) for p in hide]:
        if not any(path == d or d in path.parents for d in visible):
            continue  # not visible anyway
        if path.is_dir() and not path.is_symlink():
            cmd += ["--perms", "0555", "--size", "4096", "--tmpfs", str(path), "--remount-ro", str(path)]
        elif path.exists():
            cmd += ["--ro-bind", "/dev/null", str(path)]
    cmd += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/sandbox", "--setenv", "HOME", "/sandbox",
            "--setenv", "OMP_NUM_THREADS", "1", "--setenv", "MPLBACKEND", "Agg"]
    return cmd


def hidden_paths(chapter, extra: list[Path] = ()) -> list[Path]:
    """Files the learner must not read while ``chapter`` (a registry Chapter) is graded: the registry decides
    which (:func:`autograder.registry.hidden_while_graded`), plus ``extra``."""
    from autograder import registry

    return [Path(p) for p in extra] + ([] if chapter is None else registry.hidden_while_graded(chapter))


# --- files: never through a link, never recursively --------------------------------


def _own_folder(name: str, dir_fd: int) -> None:
    """Make the folder ``name`` in ``dir_fd`` readable and writable by us (0700), never through a link.

    The learner may have made it unreadable (or unwritable: then it cannot be moved). ``chmod`` on
    a name would follow a link put there meanwhile, so it goes through an ``O_PATH`` descriptor of
    that very folder. Not ours and we are not root: left as it is.
    """
    path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{path_fd}", 0o700)
    except PermissionError:
        pass
    finally:
        os.close(path_fd)


def _open_folder(name: str, dir_fd: int) -> int:
    """A descriptor for listing the folder ``name`` in ``dir_fd``, never through a link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:
        _own_folder(name, dir_fd)
        return os.open(name, flags, dir_fd=dir_fd)


def _not_a_folder(err: OSError) -> bool:
    return err.errno in (errno.ELOOP, errno.ENOTDIR)


def remove_tree(root: Path) -> None:
    """Delete ``root`` and everything under it without following any link, at any depth.

    Sub-folders are first moved up next to the folder being emptied, so that at most two
    folders are open at a time however deep the tree is (no recursion, no PATH_MAX).
    """
    root = Path(root)
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(root)
        return
    base_fd = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        pending = [root.name]
        counter = 0
        while pending:
            name = pending.pop()
            try:
                fd = _open_folder(name, base_fd)
            except FileNotFoundError:
                continue
            except OSError as err:
                if not _not_a_folder(err):
                    raise
                os.unlink(name, dir_fd=base_fd)  # no longer a folder (a link put in its place): the entry goes
                continue
            try:
                with os.scandir(fd) as entries:
                    children = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
                for child, is_dir in children:
                    if is_dir:
                        try:
                            _own_folder(child, fd)  # moving a folder needs write access to it
                        except OSError as err:
                            if not _not_a_folder(err):
                                raise
                            os.unlink(child, dir_fd=fd)  # a link put in its place meanwhile
                            continue
                        counter += 1
                        moved = f".tdd-rm-{os.getpid()}-{counter}-{secrets.token_hex(4)}"
                        os.rename(child, moved, src_dir_fd=fd, dst_dir_fd=base_fd)
                        pending.append(moved)
                    else:
                        os.unlink(child, dir_fd=fd)
            finally:
                os.close(fd)
            try:
                os.rmdir(name, dir_fd=base_fd)
            except OSError as err:
                if err.errno != errno.ENOTEMPTY:
                    raise
                pending.append(name)  # something appeared meanwhile (not once the runner is dead)
    finally:
        os.close(base_fd)


# --- the runner ---------------------------------------------------------------------


def _proc_status(pid: str) -> dict[str, str]:
    fields = {}
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    except OSError:
        pass
    return fields


def _pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _stopped_or_gone(pid: int) -> bool:
    """Whether ``pid`` is stopped (``T``, or ``t`` when traced), a zombie, or gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in (b"T", b"t", b"Z", b"X")


# (isolation level, memory limit) -> why no kernel can start with them, in this process
_START_FAILURES: dict[tuple, str] = {}


# Why a kernel could not start, when it never will within these limits (a later try is no use).
NO_START_IN_MEMORY = "it cannot work within the memory limit"


@dataclass
class Runner:
    """One sandboxed runner process; :meth:`start` (again after a kill), :meth:`request`, :meth:`close`."""

    limits: Limits
    hide: list[Path] = field(default_factory=list)
    level: str = field(default_factory=detect)
    unprivileged: bool = True  # drop to an unprivileged uid when root (False only for the learner's self-check)
    preload: tuple[str, ...] = ()  # native libraries to load before the lockdown (runner.NATIVE_LIBRARIES)
    proc: subprocess.Popen | None = None
    output: bytearray = field(default_factory=bytearray)
    _output_total: int = 0
    _over: bool = False
    _killed: str | None = None  # why we killed it, when we did
    _scratch: Path | None = None  # host folder for the learner's files (unshare and none only)
    _namespace: str | None = None  # the runner's pid namespace (bwrap, unshare)
    _runner_pid: int | None = None  # the runner's pid as it sees itself
    _sign: object = None  # the session's signer of answers (autograder.runner.signer)
    _nonce: int = 0  # of the last request
    _violations: int | None = None  # our end of the violations channel
    _violations_child: int | None = None  # the runner's end, while it starts

    # -- start --

    def _uid(self) -> int | None:
        """The unprivileged uid the runner drops to; outside bwrap only when it can still read Python there."""
        if not self.unprivileged:
            return None
        if self.level != "bwrap" and not all(_world_traversable(p) for p in (sys.base_prefix, sys.prefix)):
            return None
        return _fresh_uid()

    def _fresh_scratch(self, uid: int | None) -> str:
        """``/sandbox`` under bwrap (a fresh tmpfs); otherwise a new empty host folder owned by ``uid``."""
        if self.level == "bwrap":
            return "/sandbox"
        if self._scratch is not None:
            remove_tree(self._scratch)
        self._scratch = Path(tempfile.mkdtemp(prefix="tdd-sandbox-"))
        if uid is not None:
            os.chown(self._scratch, uid, uid)  # a folder we just made: no link to follow
        return str(self._scratch)

    def _command(self, uid: int | None, cwd: str) -> tuple[list[str], dict]:
        rlimits = {"RLIMIT_AS": self.limits.memory_bytes, "RLIMIT_FSIZE": self.limits.file_bytes,
                   "RLIMIT_NPROC": self.limits.processes, "RLIMIT_CPU": self.limits.cpu_seconds, "RLIMIT_CORE": 0}
        config = json.dumps({"rlimits": rlimits, "uid": uid, "cwd": cwd, "violations_fd": self._violations_child,
                             "parent": None if self.level != "none" else os.getpid(), "preload": list(self.preload)})
        runner = [sys.executable, "-I", "-m", "autograder.runner", config]
        env = environment.kernel(home=cwd)
        if self.level == "bwrap":
            return _bwrap_prefix(self.hide, self.limits) + runner, env
        if self.level == "unshare":
            return ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"] + runner, env
        return runner, env

    def _start_key(self) -> tuple:
        return self.level, self.limits.memory_bytes

    def start(self) -> None:
        """(Re)start the runner with fresh scratch space; RunnerDied(Died.START, why) if it cannot start.

        A kernel that could not start within the memory limit will not start within it later
        either: this process then says so at once for every later notebook, without trying again.
        """
        self.kill()
        known = _START_FAILURES.get(self._start_key())
        if known is not None:
            raise RunnerDied(Died.START, f"the kernel could not start: {known}")
        uid = self._uid()
        cwd = self._fresh_scratch(uid)
        key = secrets.token_bytes(32)
        self._sign, self._nonce = signer(key), 0
        self._violations, self._violations_child = os.pipe()
        cmd, env = self._command(uid, cwd)
        self.output, self._output_total, self._over, self._killed = bytearray(), 0, False, None
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         cwd="/" if self.level == "bwrap" else cwd, env=env, start_new_session=True,
                                         close_fds=True, pass_fds=(self._violations_child,))
        except OSError as err:
            raise RunnerDied(Died.START, f"the kernel could not start ({err.strerror})") from None
        finally:
            os.close(self._violations_child)
            self._violations_child = None
        os.set_blocking(self._violations, False)
        os.set_blocking(self.proc.stdin.fileno(), False)
        self._drain = threading.Thread(target=self._drain_output, args=(self.proc,), daemon=True)
        self._drain.start()
        try:
            self._write(wire.pack({"key": key.hex()}), time.monotonic() + self.limits.start_seconds)
            ready = self._read_answer(self.limits.start_seconds)
        except RunnerDied as died:
            raise RunnerDied(Died.START, f"the kernel could not start: {died}") from None
        if ready.get("ready") is not True:
            self.kill()
            why = str(ready.get("error", ""))[:200]
            if ready.get("kind") == Failed.MEMORY:
                why = (f"{NO_START_IN_MEMORY} of {self.limits.memory_bytes / 2**30:g} GB "
                       "(address space; PyTorch alone maps about 3.5 GB): raise --memory-gb")
                _START_FAILURES[self._start_key()] = why
            raise RunnerDied(Died.START, f"the kernel could not start: {why}")
        pid = ready.get("pid")
        self._runner_pid = pid if type(pid) is int else None
        self._namespace = self._find_namespace()

    def _find_namespace(self) -> str | None:
        if self.level == "none" or self.proc is None:
            return None
        host_ns = _pid_namespace(os.getpid())
        for entry in os.listdir("/proc"):  # the child of bwrap/unshare that lives in a new pid namespace
            if entry.isdigit() and _proc_status(entry).get("PPid") == str(self.proc.pid):
                ns = _pid_namespace(int(entry))
                if ns and ns != host_ns:
                    return ns
        return None

    # -- output --

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
                self._killed = Died.OUTPUT
                self._kill_tree(proc)

    # -- stopping --

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

    def _leftovers(self) -> list[int]:
        """Pids of the live processes the learner's code left in the sandbox: all but the runner, the
        namespace's init and zombies (a zombie runs nothing; its parent or init collects it)."""
        if self.proc is None:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in (os.getpid(), self.proc.pid):
                continue
            # The namespace first: one system call rules out each process of the host (nearly all of them), where
            # opening and reading its stat file took ten times as long: this runs twice after every request.
            if self._namespace is not None and _pid_namespace(int(entry)) != self._namespace:
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if not fields or fields[0] in (b"Z", b"X"):
                continue
            if self._namespace is not None:
                inner = _proc_status(entry).get("NSpid", "").split()
                if not inner or inner[-1] in ("1", str(self._runner_pid)):
                    continue  # the namespace's init, and the runner itself
            elif len(fields) < 4 or fields[3] != str(self.proc.pid).encode() or int(entry) == self._runner_pid:
                continue  # not in the runner's session (fields: state, ppid, pgrp, session, ...)
            found.append(int(entry))
        return found

    def host_pid(self) -> int | None:
        """The runner's pid as this process sees it (inside bwrap or unshare it has another one of its own)."""
        if self.proc is None:
            return None
        if self._namespace is None:
            return self.proc.pid
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _pid_namespace(int(entry)) == self._namespace:
                inner = _proc_status(entry).get("NSpid", "").split()
                if inner and inner[-1] == str(self._runner_pid):
                    return int(entry)
        return None

    def reap(self, seconds: float = 30.0) -> int:
        """Kill every process the learner's code left in the sandbox (all but the runner); how many.

        First the runner's whole process group is stopped with one signal (the learner's processes are in it
        unless they left it): nothing in it can fork any more, however fast it forks, and the runner is
        stopped with them for that moment. Then, pass after pass, every process found that is not the runner
        is sent SIGSTOP until each one has really stopped (state ``T``: it is back from any fork it was in, so
        that child is visible and found in the next pass) and a pass finds none that is new — this finds also
        those that left the group. Then they are all killed, and the runner goes on.
        """
        group = self.host_pid() if self._leftovers() else None
        if group is not None:
            try:
                os.killpg(group, signal.SIGSTOP)
            except (ProcessLookupError, PermissionError):
                group = None
        try:
            deadline = time.monotonic() + seconds
            signalled: set[int] = set()
            while time.monotonic() < deadline:
                # First whether all those signalled have stopped, then the list: a child made before
                # its parent stopped (or exited) is in the list; one made later cannot exist.
                settled = all(_stopped_or_gone(pid) for pid in signalled)
                new = [pid for pid in self._leftovers() if pid not in signalled]
                for pid in new:
                    try:
                        os.kill(pid, signal.SIGSTOP)
                    except (ProcessLookupError, PermissionError):
                        continue
                    signalled.add(pid)
                if settled and not new:
                    break
                if not new:
                    time.sleep(0.001)
            for pid in signalled:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return len(signalled)
        finally:
            if group is not None:
                try:
                    os.kill(group, signal.SIGCONT)  # the runner only: the others are dead
                except (ProcessLookupError, PermissionError):
                    pass

    def kill(self) -> None:
        if self._violations is not None:
            os.close(self._violations)
            self._violations = None
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
        """Why the runner is gone, from our own records and its exit status (never from its output)."""
        proc = self.proc
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill_tree(proc)
            code = proc.wait()
        self._drain.join(timeout=5)
        killed = self._killed
        self.kill()
        if killed == Died.OUTPUT:
            return RunnerDied(Died.OUTPUT, f"printed more than {self.limits.output_bytes} bytes; the kernel was stopped")
        if code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            return RunnerDied(Died.TIMEOUT, "the kernel used up its CPU time limit")
        if code in (-signal.SIGKILL, 128 + signal.SIGKILL):
            return RunnerDied(Died.MEMORY, "the kernel was killed, most likely for using too much memory")
        return RunnerDied(Died.CRASHED, f"the kernel died (exit status {code})")

    def _stop(self, kind: str, message: str) -> RunnerDied:
        self._killed = kind
        self.kill()
        return RunnerDied(kind, message)

    # -- requests --

    def _write(self, data: bytes, deadline: float) -> None:
        fd = self.proc.stdin.fileno()
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._stop(Died.TIMEOUT, "the kernel stopped reading its input; it was stopped")
            _, writable, _ = select.select([], [fd], [], min(left, 0.5))
            if self._over:
                raise self._died()
            if not writable:
                if self.proc.poll() is not None:
                    raise self._died()
                continue
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError):
                raise self._died() from None

    def _read_answer(self, timeout: float) -> dict:
        proc = self.proc
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf, need, size = bytearray(), 8, None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._stop(Died.TIMEOUT, f"took longer than {timeout:.3g} s; the kernel was stopped")
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
            if len(buf) < need:
                continue
            if size is None:
                try:
                    size = wire.body_size(bytes(buf))
                except wire.ProtocolError:
                    raise self._stop(Died.CRASHED, "the kernel sent a malformed answer") from None
                buf, need = bytearray(), size + MAC_BYTES
                continue
            body, mac = bytes(buf[:size]), bytes(buf[size:])
            if not hmac.compare_digest(self._sign(self._nonce, wire.HEADER.pack(size) + body), mac):
                raise self._stop(Died.TAMPERED, "an answer that is not the grader's own reached the grader: the "
                                                "notebook's code wrote to the grader's channel; the kernel was stopped")
            try:
                return wire.parse(body)
            except wire.ProtocolError:
                raise self._stop(Died.CRASHED, "the kernel sent a malformed answer") from None

    def request(self, message: dict, timeout: float) -> dict:
        """Send ``message`` and return the answer; RunnerDied if the kernel is stopped or dies meanwhile.

        ``timeout`` bounds writing the request and reading the answer together. Afterwards the
        processes the learner's code left behind are killed.
        """
        if self.proc is None or self.proc.poll() is not None:
            raise RunnerDied(Died.CRASHED, "the kernel is not running")
        deadline = time.monotonic() + timeout
        self._nonce += 1
        try:
            self._write(wire.pack({**message, "nonce": self._nonce}), deadline)
            answer = self._read_answer(max(deadline - time.monotonic(), 0.001))
        finally:
            self.reap()
        seen = self.violation()
        if seen is not None and isinstance(answer, dict):
            answer = {**answer, "violation": seen}
        return answer

    def violation(self) -> str | None:
        """What the guard reported on the violations channel since the last request (or that the channel was
        closed by the notebook's code), or None."""
        if self._violations is None:
            return None
        data = b""
        while True:
            try:
                chunk = os.read(self._violations, 65536)
            except BlockingIOError:
                break
            if not chunk:
                return data.split(b"\n", 1)[0].decode("utf-8", "replace") if data else (
                    "closed the channel on which the checks report what it calls, which is not allowed")
            data += chunk
            if len(data) > 65536:
                break
        return data.split(b"\n", 1)[0].decode("utf-8", "replace") if data else None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self._write(wire.pack({"op": Op.EXIT}), time.monotonic() + 1)
            except RunnerDied:
                pass
        self.kill()
        if self._scratch is not None:
            try:
                remove_tree(self._scratch)
            except OSError:
                pass
            self._scratch = None
