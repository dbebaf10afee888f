"""Install PyTorch into the course's environment before the rest: the CPU build where no NVIDIA GPU is.

On Linux, PyPI's default ``torch`` wheel brings the CUDA libraries (about 4 GB of the 6 GB
environment), useless without an NVIDIA GPU. ``make install`` runs this script first, with
the environment's Python and the standard library only:

* ``TORCH_INDEX`` unset or ``auto``: Linux without an NVIDIA GPU → PyTorch's CPU wheel
  index; otherwise (a GPU, macOS, Windows, whose default wheels fit) → the default index;
* ``TORCH_INDEX=cpu`` → the CPU index; ``TORCH_INDEX=default`` → the default index (pip's own
  configuration); ``TORCH_INDEX=<url>`` → that index.

When the chosen index cannot be reached, it says so in one line and leaves PyTorch to the
default index (the ``pip install`` of the course that follows). Versions are the ranges of
``pyproject.toml``. Nothing is done when PyTorch is already installed.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
PACKAGES = ("torch", "torchvision")


def has_nvidia_gpu() -> bool:
    """An NVIDIA GPU with its driver: the driver lists a GPU in /proc, or nvidia-smi does."""
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir() and any(gpus.iterdir()):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def reachable(index: str, timeout: float = 10.0) -> str | None:
    """None when ``index`` answers; otherwise why not, in a few words."""
    try:
        with urllib.request.urlopen(urllib.request.Request(index.rstrip("/") + "/torch/", method="HEAD"),
                                    timeout=timeout):
            return None
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}"
    except (OSError, ValueError) as err:
        return str(getattr(err, "reason", err)) or type(err).__name__


def choose(setting: str, system: str, gpu: Callable[[], bool]) -> tuple[str | None, str]:
    """(index URL or None for the default index, why) for ``TORCH_INDEX=setting`` on ``system``."""
    setting = (setting or "auto").strip()
    if setting == "default":
        return None, "TORCH_INDEX=default"
    if setting == "cpu":
        return CPU_INDEX, "TORCH_INDEX=cpu"
    if setting != "auto":
        if not re.match(r"^(https?|file)://", setting):
            raise ValueError(f"TORCH_INDEX must be auto, cpu, default or an index URL; got {setting!r}")
        return setting, "TORCH_INDEX"
    if system != "Linux":
        return None, f"the default PyTorch wheels for {system} have no CUDA libraries"
    if gpu():
        return None, "an NVIDIA GPU is present: the default build, with CUDA"
    return CPU_INDEX, "no NVIDIA GPU found: the CPU build (about 1.7 GB instead of 6.2 GB)"


def requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """The ``torch`` and ``torchvision`` requirements of pyproject.toml, e.g. ``torch>=2.5,<3``."""
    text = pyproject.read_text()
    found = re.findall(r'"((?:torch|torchvision)\s*[<>=!~][^"]*)"', text)
    names = {re.match(r"[a-z]+", r).group() for r in found}
    missing = [p for p in PACKAGES if p not in names]
    if missing:
        raise ValueError(f"pyproject.toml must list {', '.join(missing)} in its dependencies")
    return found


def install(setting: str | None = None, *, system: str | None = None, gpu: Callable[[], bool] = has_nvidia_gpu,
            probe: Callable[[str], str | None] = reachable, runner: Callable[[list[str]], int] | None = None,
            installed: bool | None = None) -> int:
    """Install PyTorch as :func:`choose` decides; returns pip's exit status (0 when there was nothing to do)."""
    if installed if installed is not None else importlib.util.find_spec("torch") is not None:
        return 0
    index, why = choose(os.environ.get("TORCH_INDEX", "auto") if setting is None else setting,
                        platform.system() if system is None else system, gpu)
    if index is None:
        print(f"PyTorch: the default build from the default index ({why})", flush=True)
        return 0
    problem = probe(index)
    if problem is not None:
        print(f"PyTorch: {index} cannot be reached ({problem}); the default build comes from the default index "
              "instead (larger: it includes CUDA libraries). Set TORCH_INDEX=default to skip this check.", flush=True)
        return 0
    print(f"PyTorch: {why}, from {index}", flush=True)
    command = [sys.executable, "-m", "pip", "install", "--progress-bar", "on", "--index-url", index, *requirements()]
    run = runner or (lambda cmd: subprocess.run(cmd).returncode)
    return run(command)


if __name__ == "__main__":
    try:
        sys.exit(install())
    except ValueError as err:
        sys.exit(f"error: {err}")
