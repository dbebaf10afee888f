"""binder/ agrees with pyproject.toml, and the learner's Jupyter config is student-only nbgrader."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"
STUDENT_CONFIG = BINDER / "jupyter"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def binder_pins() -> dict[str, Version]:
    pins = {}
    for line in (BINDER / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"binder/requirements.txt: pin {req.name} with == (got {line!r})"
        pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def project_dependencies() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {canonicalize_name(Requirement(d).name): Requirement(d) for d in project["dependencies"]}


@pytest.mark.parametrize("name", sorted(project_dependencies()))
def test_binder_pin_satisfies_pyproject(name):
    pins = binder_pins()
    assert name in pins, f"{name} is a dependency in pyproject.toml but is not pinned in binder/requirements.txt"
    req = project_dependencies()[name]
    assert req.specifier.contains(pins[name], prereleases=True), (
        f"binder/requirements.txt pins {name}=={pins[name]}, outside pyproject.toml's {req}")


def test_binder_pins_nothing_outside_pyproject():
    extra = set(binder_pins()) - set(project_dependencies())
    assert not extra, f"binder/requirements.txt pins {sorted(extra)} that pyproject.toml does not depend on"


def test_binder_torch_is_cpu_only():
    text = (BINDER / "requirements.txt").read_text()
    assert f"--extra-index-url {CPU_INDEX}" in text
    pins = binder_pins()
    for name in ("torch", "torchvision"):
        assert pins[name].local == "cpu", f"pin {name} to the +cpu build so Binder does not fetch CUDA wheels"


def test_binder_postbuild_installs_package_without_deps():
    postbuild = (BINDER / "postBuild").read_text()
    assert re.search(r"pip install --no-deps .*-e \.", postbuild)
    for script in ("postBuild", "start"):
        assert os.access(BINDER / script, os.X_OK), f"binder/{script} must be executable"


def test_binder_start_adds_student_config():
    start = (BINDER / "start").read_text()
    assert "JUPYTER_CONFIG_PATH" in start and "/jupyter" in start and 'exec "$@"' in start


def test_student_config_enables_only_student_nbgrader():
    server = json.loads((STUDENT_CONFIG / "jupyter_server_config.json").read_text())["ServerApp"]["jpserver_extensions"]
    assert server == {
        "nbgrader.server_extensions.assignment_list": True,
        "nbgrader.server_extensions.validate_assignment": True,
        "nbgrader.server_extensions.formgrader": False,
        "nbgrader.server_extensions.course_list": False,
    }
    lab = json.loads((STUDENT_CONFIG / "labconfig" / "page_config.json").read_text())["disabledExtensions"]
    assert {k for k, v in lab.items() if v} == {
        "@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:course-list"}


def test_student_config_effective_in_jupyterlab():
    """JupyterLab itself reports the instructor plugins disabled when the student config is on the path."""
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(STUDENT_CONFIG)}
    out = subprocess.run([sys.executable, "-m", "jupyterlab.labextensions", "list"], env=env,
                         capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    disabled = text.split("Disabled extensions:", 1)[1] if "Disabled extensions:" in text else ""
    for plugin in ("formgrader", "create-assignment", "course-list"):
        assert f"@jupyter/nbgrader:{plugin}" in disabled, text[-2000:]
    for plugin in ("validate-assignment", "assignment-list"):
        assert f"@jupyter/nbgrader:{plugin}" not in disabled


def test_makefile_lab_uses_student_config():
    makefile = (ROOT / "Makefile").read_text()
    lab = makefile.split("\nlab:", 1)[1].split("\n\n", 1)[0]
    assert "binder/jupyter" in lab and "JUPYTER_CONFIG_PATH" in lab
