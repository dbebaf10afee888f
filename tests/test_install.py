"""The install: PyTorch's CPU build where no NVIDIA GPU is, with an override and a fallback; progress shown.

The CPU wheel index is not reachable from the test machines: the detector, the index probe
and pip are stubbed, and what the script would run is checked.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("install_torch", ROOT / "scripts" / "install_torch.py")
install_torch = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(install_torch)


def _install(setting="auto", system="Linux", gpu=False, unreachable=None):
    ran, probed = [], []

    def probe(index):
        probed.append(index)
        return unreachable

    status = install_torch.install(setting, system=system, gpu=lambda: gpu, probe=probe,
                                   runner=lambda cmd: ran.append(cmd) or 0, installed=False)
    return status, ran, probed


@pytest.mark.parametrize("system", ["Linux"])
def test_install_torch_linux_without_gpu_uses_the_cpu_index(system, capsys):
    status, ran, probed = _install(system=system)
    assert status == 0 and probed == [install_torch.CPU_INDEX]
    (cmd,) = ran
    assert cmd[cmd.index("--index-url") + 1] == install_torch.CPU_INDEX
    assert any(a.startswith("torch") and not a.startswith("torchvision") for a in cmd)
    assert any(a.startswith("torchvision") for a in cmd)
    assert "CPU build" in capsys.readouterr().out


@pytest.mark.parametrize("system, gpu", [("Linux", True), ("Darwin", False), ("Windows", False)])
def test_install_torch_gpu_or_other_systems_use_the_default_index(system, gpu, capsys):
    status, ran, probed = _install(system=system, gpu=gpu)
    assert (status, ran, probed) == (0, [], [])
    assert "default build" in capsys.readouterr().out


def test_install_torch_falls_back_to_the_default_index_when_the_cpu_index_is_unreachable(capsys):
    status, ran, probed = _install(unreachable="Name or service not known")
    assert (status, ran) == (0, [])
    line = capsys.readouterr().out
    assert "cannot be reached (Name or service not known)" in line and "default" in line
    assert line.count("\n") == 1


@pytest.mark.parametrize("setting, expected", [("cpu", install_torch.CPU_INDEX), ("default", None),
                                               ("https://mirror.example.org/whl/cpu", "https://mirror.example.org/whl/cpu")])
def test_install_torch_override_variable(setting, expected):
    status, ran, probed = _install(setting, gpu=True)  # the override wins over the detector
    if expected is None:
        assert ran == [] and probed == []
    else:
        assert ran[0][ran[0].index("--index-url") + 1] == expected


def test_install_torch_rejects_a_bad_override():
    with pytest.raises(ValueError, match="TORCH_INDEX must be auto, cpu, default or an index URL"):
        install_torch.choose("gpu-please", "Linux", lambda: False)


def test_install_torch_does_nothing_when_torch_is_installed():
    ran = []
    assert install_torch.install("cpu", system="Linux", gpu=lambda: False, probe=lambda i: None,
                                 runner=lambda cmd: ran.append(cmd) or 0, installed=True) == 0
    assert ran == []


def test_install_torch_versions_are_pyproject_ranges():
    found = install_torch.requirements()
    text = (ROOT / "pyproject.toml").read_text()
    assert {re.match(r"[a-z]+", r).group() for r in found} == {"torch", "torchvision"}
    assert all(f'"{r}"' in text for r in found)


def test_detector_reads_the_driver_or_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setattr(install_torch.shutil, "which", lambda name: None)
    assert install_torch.has_nvidia_gpu() == (Path("/proc/driver/nvidia/gpus").is_dir()
                                              and any(Path("/proc/driver/nvidia/gpus").iterdir()))
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA A100 (UUID: GPU-x)'\n")
    smi.chmod(0o755)
    monkeypatch.setattr(install_torch.shutil, "which", lambda name: str(smi))
    assert install_torch.has_nvidia_gpu()
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2; exit 9\n")
    assert install_torch.has_nvidia_gpu() == (Path("/proc/driver/nvidia/gpus").is_dir()
                                              and any(Path("/proc/driver/nvidia/gpus").iterdir()))


def test_makefile_installs_torch_first_with_progress():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(STAMP): pyproject.toml", 1)[1].split("\n\n", 1)[0]
    assert recipe.index("scripts/install_torch.py") < recipe.index("pip install")
    assert "--quiet" not in recipe and " -q " not in recipe
    assert "TORCH_INDEX" in recipe and re.search(r"^TORCH_INDEX \?= auto$", makefile, re.MULTILINE)
    assert len(re.findall(r"\[\d/4\]", recipe)) == 4  # one line per step


def _make_dry(target: str, venv: Path) -> str:
    """What `make TARGET` would run for a fresh .venv at ``venv`` (nothing is installed)."""
    import subprocess

    out = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), target, f"VENV={venv}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_learner_install_has_no_test_tools_and_make_test_adds_them(tmp_path):
    """`make lab` (and `make install`) install the course without the test extra; `make test` and `make check`
    add the test tools (pytest, Playwright, kubernetes-validate) on top."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"pytest", "playwright", "kubernetes-validate"} <= {re.match(r"[\w-]+", r).group() for r in extras["test"]}
    venv = tmp_path / "venv"
    for target in ("lab", "install"):
        dry = _make_dry(target, venv)
        assert re.search(r"pip install .*-e \.$", dry, re.MULTILINE), dry
        assert "[test]" not in dry, dry
    for target in ("test", "check"):
        dry = _make_dry(target, venv)
        assert "pip install --progress-bar on -e '.[test]'" in dry, dry
        assert dry.index("-e '.[test]'") < dry.index("-m pytest"), dry
