"""binder/ agrees with pyproject.toml, and the learner's Jupyter config is student-only nbgrader."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
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


@pytest.mark.slow
def test_binder_start_fills_the_work_folder_the_badge_opens(tmp_path):
    """binder/start copies the course into work/ and runs the session's command; the README's badge opens there."""
    repo = tmp_path / "repo"
    (repo / "binder").mkdir(parents=True)
    shutil.copyfile(BINDER / "start", repo / "binder" / "start")
    shutil.copytree(ROOT / "course", repo / "course", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    # the autograder package of this checkout, as Binder's postBuild installs it (here: on the path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run(["bash", str(repo / "binder" / "start"), "sh", "-c", 'echo "config=$JUPYTER_CONFIG_PATH"'],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"config={repo / 'binder' / 'jupyter'}" in out.stdout
    assert (repo / "work" / "00_start_here.ipynb").is_file()
    badge = re.search(r"\(https://mybinder\.org/v2/gh/[^)]*urlpath=([^)]+)\)", (ROOT / "README.md").read_text())
    assert badge and badge.group(1) == "lab/tree/work/00_start_here.ipynb"


def test_student_config_enables_only_student_nbgrader():
    """Validate only: without an exchange (make lab, Binder) the assignment list only says "Error fetching courses!";
    the Nbgrader menu, which holds only the instructor's and the exchange's items, is hidden, and so is
    JupyterLab's question whether to fetch Jupyter news (it would also go online)."""
    server = json.loads((STUDENT_CONFIG / "jupyter_server_config.json").read_text())["ServerApp"]["jpserver_extensions"]
    assert server == {
        "nbgrader.server_extensions.assignment_list": False,
        "nbgrader.server_extensions.validate_assignment": True,
        "nbgrader.server_extensions.formgrader": False,
        "nbgrader.server_extensions.course_list": False,
    }
    lab = json.loads((STUDENT_CONFIG / "labconfig" / "page_config.json").read_text())["disabledExtensions"]
    assert {k for k, v in lab.items() if v} == {
        "@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment", "@jupyter/nbgrader:course-list",
        "@jupyter/nbgrader:assignment-list", "@jupyter/nbgrader:menu", "@jupyterlab/apputils-extension:announcements"}


@pytest.mark.subprocess
def test_student_config_effective_in_jupyterlab():
    """JupyterLab itself reports the instructor plugins disabled when the student config is on the path."""
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(STUDENT_CONFIG)}
    out = subprocess.run([sys.executable, "-m", "jupyterlab.labextensions", "list"], env=env,
                         capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    disabled = text.split("Disabled extensions:", 1)[1] if "Disabled extensions:" in text else ""
    for plugin in ("formgrader", "create-assignment", "course-list", "assignment-list", "menu"):
        assert f"@jupyter/nbgrader:{plugin}" in disabled, text[-2000:]
    assert "@jupyterlab/apputils-extension:announcements" in disabled, text[-2000:]
    assert "@jupyter/nbgrader:validate-assignment" not in disabled


def test_makefile_lab_uses_student_config():
    makefile = (ROOT / "Makefile").read_text()
    lab = makefile.split("\nlab:", 1)[1].split("\n\n", 1)[0]
    assert "binder/jupyter" in lab and "JUPYTER_CONFIG_PATH" in lab


def test_student_config_terminals_keep_the_environment():
    """The config gives terminals an explicit (non-login) shell: jupyter_server_terminals adds -l only without one."""
    from traitlets.config.loader import PyFileConfigLoader

    env = {"SHELL": "/bin/bash"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        config = PyFileConfigLoader("jupyter_server_config.py", path=str(STUDENT_CONFIG)).load_config()
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    command = config.ServerApp.terminado_settings["shell_command"]
    assert command[0] == "/bin/bash" and "-l" not in command and "--login" not in command
    assert command[1:] == ["--rcfile", str(STUDENT_CONFIG / "terminal.bashrc")]


def _load_config(name: str):
    from traitlets.config.loader import PyFileConfigLoader

    return PyFileConfigLoader(name, path=str(STUDENT_CONFIG)).load_config()


def test_student_config_loads_the_course_lab_extension():
    """binder/jupyter/labextensions/tdd-course is on JupyterLab's extension path, and JupyterLab's own reader takes
    it for a prebuilt (federated) extension whose script defines the container JupyterLab asks for its plugin."""
    from jupyterlab_server.config import get_federated_extensions

    config = _load_config("jupyter_server_config.py")
    (path,) = config.LabApp.extra_labextensions_path
    assert Path(path) == STUDENT_CONFIG / "labextensions"
    found = get_federated_extensions([path])
    assert set(found) == {"tdd-course"}, found
    load = found["tdd-course"]["jupyterlab"]["_build"]["load"]
    script = (Path(path) / "tdd-course" / load).read_text()
    assert '_JUPYTERLAB["tdd-course"]' in script and '"./extension"' in script
    assert "#validation-message pre" in script and "pre-wrap" in script  # Validate's dialog wraps long hints
    assert "Validating" in script and ".validate-button" in script      # and its button counts the seconds


def test_student_config_validates_as_the_grader_runs_notebooks():
    """nbgrader's Validate in the lab: its kernel starts with TDD_QUICK=1 (short training, as the grader's kernels),
    waits for the kernel in slices, and gives a cell 300 s (nbgrader's default of 30 s stops a training cell)."""
    from support import run_coroutine

    from autograder.kernel_client import SlicedKernelManager
    from autograder.lab_validate import ValidateKernelManager
    from solutions.notebook import QUICK_ENV

    config = _load_config("nbgrader_config.py")
    assert config.Execute.kernel_manager_class == "autograder.lab_validate.ValidateKernelManager"
    assert config.Execute.timeout >= 300 and config.Execute.iopub_timeout >= 30
    assert issubclass(ValidateKernelManager, SlicedKernelManager)
    manager = ValidateKernelManager(kernel_name="python3")
    command, kw = run_coroutine(manager._async_pre_start_kernel(env={"HOME": "/nowhere", QUICK_ENV: "0"}))
    assert kw["env"][QUICK_ENV] == "1" and kw["env"]["HOME"] == "/nowhere" and command


def test_browser_steps_wrong_notebook_fails_one_exercise_with_a_hint_wider_than_the_dialog(tmp_path):
    """tests/browser_steps.py validates a chapter-1 notebook that is finished but for softmax: its softmax fails
    the check with a hint of more than 150 characters (one line, that the dialog must wrap)."""
    import browser_steps
    import nbformat

    from autograder import registry
    from autograder.checks import attention
    from autograder.checks.core import CheckFailed

    first = registry.CHAPTERS[0]
    nb = nbformat.read(browser_steps.wrong_chapter_notebook(first.release_path(), first.source_path(),
                                                            tmp_path / first.notebook), as_version=4)
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    assert len(solutions) == len(first.exercises) and not [s for s in solutions.values() if "NotImplementedError" in s]
    namespace: dict = {}
    exec(compile("import torch\n" + solutions["softmax_solution"], "<cell>", "exec"), namespace)  # noqa: S102
    with pytest.raises(CheckFailed) as err:
        attention.run("softmax", namespace["softmax"])
    assert len(str(err.value)) > 150 and "\n" not in str(err.value), str(err.value)
