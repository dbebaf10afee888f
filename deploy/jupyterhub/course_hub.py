"""The one-server hub of the course: its settings, and the view of the file system each server runs in.

Read by ``jupyterhub_config.py`` (next to this file); also a command, to run the course's grading
tools as the course's user from a root shell, in the same view as the formgrader service:

    sudo TDD_HUB_COURSE=/srv/ml101/course TDD_HUB_EDITION=/srv/ml101/edition \\
        .venv/bin/python deploy/jupyterhub/course_hub.py run -- python -m autograder course collect . 01_attention_by_hand

Every server runs under bubblewrap, started as root, in a mount namespace assembled from read-only
binds, then switched to its user by ``setpriv``:

* a **learner** (a student of the course's gradebook) sees the system folders, the course's Python
  environment with the **student edition** in place of ``solutions`` and ``autograder`` (the
  package folders the environment imports are the edition's: nothing of the full repository),
  their own home, and the exchange; processes of their own only (a pid namespace);
* an **instructor** sees the same with the full repository instead of the edition (their own
  server: the course as the instructors have it, to read and try); grading happens in the course's
  service, which every instructor reaches;
* the **course** service (formgrader and a terminal with the grading tools, for every instructor)
  runs as the owner of the course directory and sees the full repository, the course directory
  (read-write) and the exchange, and the host's ``/proc``, so that ``autograder grade`` can make its
  own sandbox inside.

Nobody sees the other users' homes, the course directory (gradebook, submissions, feedback, the
source notebooks) unless they are the course service, or the repository unless they are an
instructor. The views need no change of the file permissions of the repository or of the Python
installation (a Python under ``/root`` is fine: the view binds it where every user can reach it).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pwd
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
LEARNER_CONFIG = HERE / "learner"  # Jupyter config of learners' and instructors' own servers
SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32")  # not /opt: a course may live there
PACKAGES = ("solutions", "autograder")
ENV_NAMES = ("TDD_HUB_COURSE", "TDD_HUB_EDITION", "TDD_HUB_INSTRUCTORS", "TDD_HUB_STATE", "TDD_HUB_IP",
             "TDD_HUB_PORT", "TDD_HUB_API_PORT", "TDD_HUB_PROXY_API_PORT", "TDD_HUB_SERVICE_PORT")


class HubError(Exception):
    """One line for the instructor: what is missing and what to run."""


@dataclass(frozen=True)
class Settings:
    course_dir: Path  # the nbgrader course directory (python -m autograder course init); its owner is the course's user
    edition: Path  # the student edition (python -m autograder publish)
    instructors: tuple[str, ...]  # system users who get the course's service (formgrader, grading tools)
    state: Path  # the hub's own files: its database, cookie secret, proxy pid
    ip: str
    port: int  # where learners and instructors open the hub
    api_port: int  # the hub's API (local only)
    proxy_api_port: int  # the proxy's API (local only)
    service_port: int  # the course service (local only)
    course_id: str
    exchange: Path

    @property
    def course_user(self) -> str:
        return pwd.getpwuid(self.course_dir.stat().st_uid).pw_name


def course_config(course_dir: Path) -> tuple[str, Path]:
    """(course id, exchange root) from the course directory's ``nbgrader_config.py``."""
    from traitlets.config.loader import PyFileConfigLoader

    config_file = course_dir / "nbgrader_config.py"
    if not config_file.is_file():
        raise HubError(f"no {config_file}: make the course first (python -m autograder course init {course_dir} "
                       "--course-id ID), as the course's user")
    config = PyFileConfigLoader(config_file.name, path=str(course_dir)).load_config()
    course_id = config.CourseDirectory.get("course_id")
    exchange = config.Exchange.get("root")
    if not course_id or not exchange:
        raise HubError(f"{config_file} sets no course id or exchange: run python -m autograder course init again")
    return str(course_id), Path(exchange)


def settings(env: dict | None = None, *, new_course: bool = False) -> Settings:
    """The hub's settings; with ``new_course`` (for ``run``), a course directory without its config yet is fine
    (its exchange is then TDD_HUB_EXCHANGE, default /srv/nbgrader/exchange: for ``course init``), and the
    edition is checked only where it is used (a learner's view)."""
    env = os.environ if env is None else env
    missing = [n for n in ("TDD_HUB_COURSE", "TDD_HUB_EDITION") if not env.get(n)]
    if missing:
        raise HubError(f"set {' and '.join(missing)}: the course directory (python -m autograder course init) and "
                       "the student edition (python -m autograder publish); see docs/grading.md, 'On a JupyterHub'")
    course_dir = Path(env["TDD_HUB_COURSE"]).resolve()
    edition = Path(env["TDD_HUB_EDITION"]).resolve()
    if not new_course and not (edition / ".student-edition.json").is_file():
        raise HubError(f"{edition} is not a student edition: python -m autograder publish {edition} --answers ...")
    if new_course and not (course_dir / "nbgrader_config.py").is_file():
        course_id, exchange = "", Path(env.get("TDD_HUB_EXCHANGE", "/srv/nbgrader/exchange"))
    else:
        course_id, exchange = course_config(course_dir)
    return Settings(
        course_dir=course_dir, edition=edition,
        instructors=tuple(u for u in env.get("TDD_HUB_INSTRUCTORS", "").replace(",", " ").split() if u),
        state=Path(env.get("TDD_HUB_STATE") or course_dir.parent / "hub-state").resolve(),
        ip=env.get("TDD_HUB_IP", "127.0.0.1"), port=int(env.get("TDD_HUB_PORT", 8000)),
        api_port=int(env.get("TDD_HUB_API_PORT", 8081)), proxy_api_port=int(env.get("TDD_HUB_PROXY_API_PORT", 8001)),
        service_port=int(env.get("TDD_HUB_SERVICE_PORT", 8082)), course_id=course_id, exchange=exchange)


def students(cfg: Settings) -> set[str]:
    """The course's students: those of its gradebook (course init --students)."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{cfg.course_dir / 'gradebook.db'}") as gb:
        return {s.id for s in gb.students}


# --- the views ------------------------------------------------------------------------------------


def package_dirs() -> dict[str, Path]:
    """Where this environment imports ``solutions`` and ``autograder`` from (an editable install: the repository)."""
    found = {}
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise HubError(f"this Python ({sys.executable}) does not have the course installed: make install")
        found[name] = Path(list(spec.submodule_search_locations)[0]).resolve()
    return found


def python_dirs() -> list[Path]:
    return list(dict.fromkeys(Path(p).resolve() for p in (sys.base_prefix, sys.prefix)))


def repository() -> Path:
    """The repository (the folder holding the packages of an editable install)."""
    return package_dirs()["autograder"].parent


def _inside(path: Path, dirs: list[Path]) -> bool:
    return any(path == d or d in path.parents for d in dirs)


def view_command(kind: str, username: str, cfg: Settings) -> list[str]:
    """The bubblewrap + setpriv prefix that runs a command as ``username`` in the view of ``kind``
    (``learner``, ``instructor`` or ``course``); see the module's docstring."""
    if kind not in ("learner", "instructor", "course"):
        raise ValueError(f"kind must be learner, instructor or course; got {kind!r}")
    user = pwd.getpwnam(username)
    if user.pw_uid == 0:
        raise HubError("a server never runs as root: choose another user")
    home = Path(user.pw_dir)
    ro = [*python_dirs()]
    rw = [cfg.exchange] + ([home] if home.is_dir() else [])
    links: list[tuple[Path, Path]] = []  # (target, link)
    overlays: list[tuple[Path, Path]] = []  # (source, mount point): binds over a bound folder
    if kind == "learner":
        if not (cfg.edition / ".student-edition.json").is_file():
            raise HubError(f"{cfg.edition} is not a student edition: python -m autograder publish {cfg.edition}")
        ro += [cfg.edition, LEARNER_CONFIG]
        for name, where in package_dirs().items():
            (overlays if _inside(where, ro) else links).append((cfg.edition / name, where))
    else:
        ro += [repository()]
        if kind == "instructor":
            ro.append(LEARNER_CONFIG)
        else:
            rw.append(cfg.course_dir)
    # A pid namespace of its own: when the hub stops the server (or the hub dies), bubblewrap's init in it dies
    # and takes every process of the view with it (setpriv's change of user would clear a parent-death signal).
    cmd = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--tmpfs", "/", "--dev", "/dev",
           "--perms", "01777", "--tmpfs", "/dev/shm", "--perms", "01777", "--tmpfs", "/tmp"]
    # The course's service sees the host's /proc: autograder grade mounts a fresh one in its own sandbox, which
    # the kernel allows only where a /proc is fully visible (the one bubblewrap mounts as root has parts covered).
    cmd += ["--bind", "/proc", "/proc"] if kind == "course" else ["--proc", "/proc"]
    for name in SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            cmd += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            cmd += ["--ro-bind", name, name]
    # What the user must not see, should it lie inside a system folder bound above (a clone in /usr/local/src):
    hidden = ([repository()] if kind == "learner" else []) + ([cfg.course_dir] if kind != "course" else [])
    for d in hidden:
        if _inside(d, [Path(s) for s in SYSTEM_DIRS]) and d.is_dir():
            cmd += ["--perms", "0755", "--tmpfs", str(d)]
    parents: list[Path] = []
    for d in [*ro, *rw, *(link for _, link in links)]:
        parents += [p for p in reversed(d.parents) if p != Path("/") and p not in parents and not p.is_symlink()]
    for p in parents:  # created 0755, so the user can reach what is bound below
        if p != Path("/tmp") and not _inside(p, [Path(s) for s in SYSTEM_DIRS]):
            cmd += ["--perms", "0755", "--dir", str(p)]
    for d in ro:
        cmd += ["--ro-bind", str(d), str(d)]
    for d in rw:
        cmd += ["--bind", str(d), str(d)]
    for source, mount_point in overlays:
        cmd += ["--ro-bind", str(source), str(mount_point)]
    for target, link in links:
        cmd += ["--symlink", str(target), str(link)]
    cwd = cfg.course_dir if kind == "course" else home
    cmd += ["--chdir", str(cwd), "--", "setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
            "--init-groups", "--inh-caps=-all", "--bounding-set=-all", "--"]
    return cmd


def view_environment(kind: str, username: str, cfg: Settings) -> dict[str, str]:
    """What the view's processes need beside JupyterHub's variables."""
    user = pwd.getpwnam(username)
    env = {
        "PATH": f"{Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": sys.prefix,
        "HOME": user.pw_dir, "USER": username, "LOGNAME": username, "SHELL": "/bin/bash",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "TDD_COURSE_ID": cfg.course_id, "TDD_EXCHANGE": str(cfg.exchange),
    }
    if kind != "course":
        env["JUPYTER_CONFIG_PATH"] = str(LEARNER_CONFIG)
    return env


# --- the command ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course_hub.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("run", help="run a command as the course's user, in the course service's view (as root)")
    p.add_argument("--as", dest="kind", choices=("course", "learner", "instructor"), default="course",
                   help="whose view (default: the course service's)")
    p.add_argument("--user", help="the user (default: the owner of TDD_HUB_COURSE)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    if os.geteuid() != 0:
        print("error: run it as root (sudo): it switches to the course's user", file=sys.stderr)
        return 2
    try:
        cfg = settings(new_course=True)
        user = args.user or cfg.course_user
        prefix = view_command(args.kind, user, cfg)
    except (HubError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    env = {**view_environment(args.kind, user, cfg), "TERM": os.environ.get("TERM", "dumb")}
    os.execvpe(prefix[0], prefix + command, env)


if __name__ == "__main__":
    sys.exit(main())
