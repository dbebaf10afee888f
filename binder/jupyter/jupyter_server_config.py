# Terminals opened in JupyterLab keep the environment the server was started with (`make lab`
# exports the course's .venv, so `python` is the course's). Without a shell_command, a server
# started without a terminal of its own runs a *login* shell, whose /etc/profile resets PATH
# on Debian and Ubuntu. bash also reads terminal.bashrc: the user's ~/.bashrc, then the course's
# environment in front again (a conda `activate` in ~/.bashrc would otherwise take `python`).
import os
import shutil
from pathlib import Path

_shell = os.environ.get("SHELL") or shutil.which("bash") or shutil.which("sh") or "/bin/sh"
_rc = Path(__file__).with_name("terminal.bashrc")
c.ServerApp.terminado_settings = {  # noqa: F821 — `c` is given by Jupyter's config loader
    "shell_command": [_shell, "--rcfile", str(_rc)] if Path(_shell).name == "bash" else [_shell],
}
# The course's own small JupyterLab extension (labextensions/tdd-course: Validate's progress and whole hints).
c.LabApp.extra_labextensions_path = [str(Path(__file__).with_name("labextensions"))]  # noqa: F821
