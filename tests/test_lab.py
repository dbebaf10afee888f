"""`make lab` as a learner meets it: the work folder, the environment of its terminals, one server.

The fast tests run `make lab` with a stand-in for JupyterLab (LAB=...) that records what it was
given; the slow one starts the real JupyterLab through `make lab`, opens a terminal through the
server's API (as File → New → Terminal does) and runs there the self-check command that
course/00_start_here.ipynb prints, exactly as printed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from support import BARE_PATH, STAMP, VENV
from support import REPO as ROOT

from autograder import registry


def make_lab(work: Path, lab: str | None = None, *extra: str, timeout: float = 120, env: dict | None = None,
             popen: bool = False):
    """`make lab` with this environment as its .venv (never reinstalled), the work folder ``work``."""
    if not (VENV / "bin" / "python").exists() or not STAMP.exists():
        pytest.skip(f"`make lab` needs the environment made by `make install` ({STAMP} is missing)")
    cmd = ["make", "--no-print-directory", "-C", str(ROOT), "-o", str(STAMP), "lab", f"VENV={VENV}", f"WORK={work}",
           *([f"LAB={lab}"] if lab else []), *extra]
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": BARE_PATH, "LANG": "C.UTF-8", **(env or {})}
    if popen:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


RECORDER = ("python3 -c 'import json, os, sys; json.dump({\"env\": dict(os.environ), \"argv\": sys.argv[1:]}, "
            "open(os.environ[\"LAB_RECORD\"], \"w\"))'")


@pytest.mark.subprocess
def test_make_lab_exports_the_course_environment_and_fills_the_work_folder(tmp_path):
    record = tmp_path / "record.json"
    work = tmp_path / "work"
    out = make_lab(work, RECORDER, env={"LAB_RECORD": str(record)})
    assert out.returncode == 0, out.stdout + out.stderr
    seen = json.loads(record.read_text())
    assert seen["env"]["PATH"].split(":")[0] == str(VENV / "bin")
    assert seen["env"]["VIRTUAL_ENV"] == str(VENV)
    assert seen["env"]["JUPYTER_CONFIG_PATH"].split(":")[0] == str(ROOT / "binder" / "jupyter")
    assert f"--notebook-dir={work}" in seen["argv"]
    assert (work / "00_start_here.ipynb").is_file()
    for chapter in registry.CHAPTERS:
        if chapter.release_path().is_file():
            assert (work / chapter.id / chapter.notebook).is_file(), out.stdout
    assert f"Your notebooks are in {work}/" in out.stdout


@pytest.mark.slow
def test_make_lab_never_overwrites_learner_work(tmp_path):
    work = tmp_path / "work"
    assert make_lab(work, "true").returncode == 0
    chapter = next(c for c in registry.CHAPTERS if c.release_path().is_file())
    mine = work / chapter.id / chapter.notebook
    nb = nbformat.read(mine, as_version=4)
    nb.cells[-1].source += "\n# my notes"
    nbformat.write(nb, mine)
    before = mine.read_bytes()
    out = make_lab(work, "true")
    assert out.returncode == 0, out.stderr
    assert mine.read_bytes() == before


def test_lab_terminal_shell_is_not_a_login_shell_and_puts_the_venv_first(tmp_path):
    """The terminal config: bash reads terminal.bashrc, which puts $VIRTUAL_ENV/bin first after ~/.bashrc."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text('PATH="/opt/other-python/bin:$PATH"\n')  # e.g. a conda `activate`
    rc = ROOT / "binder" / "jupyter" / "terminal.bashrc"
    out = subprocess.run(["bash", "--rcfile", str(rc), "-i", "-c", 'echo "$PATH"'], capture_output=True, text=True,
                         env={"HOME": str(home), "PATH": BARE_PATH, "VIRTUAL_ENV": str(VENV)}, timeout=60)
    assert out.stdout.strip().split(":")[0] == str(VENV / "bin"), out
    config = (ROOT / "binder" / "jupyter" / "jupyter_server_config.py").read_text()
    assert "terminado_settings" in config and "shell_command" in config


def _start_here_command(start_here_run) -> str:
    """The self-check command the start-here notebook printed when run in the work folder."""
    printed = "".join(o.get("text", "") for c in start_here_run.cells if c.cell_type == "code" for o in c.outputs)
    commands = re.findall(r"^python -m autograder check .+$", printed, re.MULTILINE)
    assert len(commands) == 1, printed
    return commands[0]


def _terminal_run(base: str, token: str, command: str, until: re.Pattern, timeout: float = 240) -> str:
    """Open a terminal on the server (as JupyterLab does), type ``command``, return what it printed up to ``until``."""
    import websocket

    request = urllib.request.Request(f"{base}/api/terminals?token={token}", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        name = json.loads(response.read())["name"]
    ws = websocket.create_connection(f"{base.replace('http', 'ws')}/terminals/websocket/{name}?token={token}",
                                     timeout=10)
    text, deadline = "", time.monotonic() + timeout
    try:
        ws.send(json.dumps(["stdin", command + "\r"]))
        while time.monotonic() < deadline and not until.search(text):
            try:
                message = json.loads(ws.recv())
            except websocket.WebSocketTimeoutException:
                continue
            if message[0] == "stdout":
                text += message[1]
    finally:
        ws.close()
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def readme_lab_command() -> str:
    """The self-check command the README prints for a terminal of the JupyterLab that `make lab` started."""
    (command,) = re.findall(r"^(python -m autograder check \S+)\s+# in the lab's terminal", (ROOT / "README.md").read_text(),
                            re.MULTILINE)
    return command


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(600)
def test_readme_self_check_command_runs_as_printed_in_the_lab_terminal(lab, start_here_run):
    """The README's self-check command, typed into a terminal of the JupyterLab `make lab` started (the session's
    ``lab``; opened as File → New → Terminal opens it: no folder asked for), runs the course's self-check there; the
    command start-here prints names the same notebook; a second `make lab` starts no second server."""
    work = lab["work"]
    second = make_lab(work, None, "LAB_ARGS=--no-browser", env=lab["env"], timeout=120)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "already running" in second.stdout and f":{lab['port']}/" in second.stdout, second.stdout

    first = registry.CHAPTERS[0]
    command = readme_lab_command()
    (printed,) = shlex.split(_start_here_command(start_here_run))[4:]
    assert Path(printed) == Path(work) / shlex.split(command)[4], (printed, command)
    out = _terminal_run(lab["base"], lab["token"], f"pwd; {command}",
                        re.compile(r"visible score: \d+/\d+|No module named|Traceback \(most|error: "))
    assert str(work) in [line.strip() for line in out.replace("\r", "").splitlines()], out[-3000:]  # pwd
    assert "No module named" not in out and "Traceback" not in out and "error: " not in out, out[-3000:]
    assert f"visible score: 0/{first.points}" in out, out[-3000:]
    assert "not done yet" in out


def test_lab_terminal_opens_in_the_work_folder_where_the_server_started(tmp_path):
    """Binder starts the server in the repository: a terminal opened there (no folder asked for) moves to the work
    folder; one opened in a folder of its own (the launcher of a subfolder) stays there."""
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    home, server_dir, work = tmp_path / "home", tmp_path / "repo", tmp_path / "repo" / "work"
    (work / "01_chapter").mkdir(parents=True)
    home.mkdir()
    rc = ROOT / "binder" / "jupyter" / "terminal.bashrc"
    env = {"HOME": str(home), "PATH": BARE_PATH, "TDD_WORK": str(work), "TDD_SERVER_DIR": str(server_dir)}
    for start, expected in ((server_dir, work), (work / "01_chapter", work / "01_chapter")):
        out = subprocess.run(["bash", "--rcfile", str(rc), "-i", "-c", "pwd"], cwd=start, capture_output=True,
                             text=True, env=env, timeout=60)
        assert out.stdout.strip().splitlines()[-1] == str(expected), out
    start_script = (ROOT / "binder" / "start").read_text()
    assert "TDD_WORK=" in start_script and "TDD_SERVER_DIR=" in start_script
