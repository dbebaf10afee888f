"""Chapter 1 in a real browser: JupyterLab + headless Chromium, driven by Playwright.

What a learner sees after "Run All Cells" with correct answers: no cell shows an error,
the ipywidgets render as widgets (not as a text fallback or "Error displaying widget"),
and nbgrader's Validate button is in the notebook toolbar.

The chapter is copied into a temporary JupyterLab root and its solution cells are filled
from the source notebook (autograder/source/); nothing is written into course/.
A screenshot of the chapter with a widget goes to the pytest tmp dir; with
UPDATE_SCREENSHOTS=1 it also replaces docs/screenshots/chapter1_widget.png (shown in
README.md). On failure a screenshot of the page is saved in the pytest tmp dir.

Needs Chromium: Debian's /usr/bin/chromium (`apt-get install chromium`) or the path in
$TDD_CHROMIUM. Without it the test is skipped; `.ci/run` installs it in CI.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = "01_attention_by_hand"
RELEASE_NB = ROOT / "course" / CHAPTER / f"{CHAPTER}.ipynb"
SOURCE_NB = ROOT / "autograder" / "source" / CHAPTER / f"{CHAPTER}.ipynb"
STUDENT_CONFIG = ROOT / "binder" / "jupyter"
SCREENSHOT_NAME = "chapter1_widget.png"
README_SCREENSHOT = ROOT / "docs" / "screenshots" / SCREENSHOT_NAME
CHROMIUM = Path(os.environ.get("TDD_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(360)]

SOLUTION_MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)


def fill_solutions(release: nbformat.NotebookNode, source: nbformat.NotebookNode) -> int:
    """Put the source notebook's answers into the release's solution cells; returns how many."""
    answers = {
        cell.metadata["nbgrader"]["grade_id"]: cell.source
        for cell in source.cells
        if cell.metadata.get("nbgrader", {}).get("solution")
    }
    filled = 0
    for cell in release.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            grade_id = meta["grade_id"]
            if grade_id not in answers:
                raise AssertionError(f"solution cell {grade_id!r} of the release is not in {SOURCE_NB}")
            cell.source = SOLUTION_MARKERS.sub("", answers[grade_id])
            filled += 1
    return filled


def test_fill_solutions_removes_markers_and_keeps_other_cells():
    meta = {"nbgrader": {"solution": True, "grade_id": "f_solution", "grade": False, "locked": False}}
    source = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION", metadata=meta),
    ])
    release = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("text"),
        nbformat.v4.new_code_cell("def f():\n    # YOUR CODE HERE\n    raise NotImplementedError()", metadata=meta),
        nbformat.v4.new_code_cell("f()"),
    ])
    assert fill_solutions(release, source) == 1
    assert release.cells[1].source == "def f():\n    return 1\n"
    assert [c.source for c in (release.cells[0], release.cells[2])] == ["text", "f()"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_server(url: str, proc: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"jupyter lab exited with status {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"jupyter lab did not answer {url} within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _write_lab_settings(settings_dir: Path) -> None:
    """Lab settings for a reproducible run: every cell in the DOM, no news or update checks."""
    settings = {
        "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
            "fetchNews": "false", "checkForUpdates": False},
    }
    for name, value in settings.items():
        path = settings_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


@pytest.fixture(scope="module")
def chromium_path() -> Path:
    if not CHROMIUM.is_file():
        pytest.skip(f"Chromium not found at {CHROMIUM}: install it (Debian/Ubuntu: `sudo apt-get install chromium`) "
                    "or set TDD_CHROMIUM=/path/to/chromium to run the browser test; CI installs it in .ci/run")
    pytest.importorskip("playwright.sync_api", reason="the browser test needs `pip install -e '.[test]'` (playwright)")
    return CHROMIUM


@pytest.fixture(scope="module")
def lab(tmp_path_factory, chromium_path):
    """JupyterLab with the student config on a free port, rooted at a temp copy of chapter 1 with answers."""
    assert RELEASE_NB.is_file(), f"{RELEASE_NB} is missing: run `make release`"
    assert SOURCE_NB.is_file(), f"{SOURCE_NB} is missing"
    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "course"
    shutil.copytree(RELEASE_NB.parent, root / CHAPTER)
    notebook = root / CHAPTER / RELEASE_NB.name
    release = nbformat.read(notebook, as_version=4)
    n_filled = fill_solutions(release, nbformat.read(SOURCE_NB, as_version=4))
    assert n_filled > 0, f"no solution cell in {RELEASE_NB}"
    nbformat.write(release, notebook)
    _write_lab_settings(tmp / "settings")

    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ,
           "JUPYTER_CONFIG_PATH": str(STUDENT_CONFIG),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "MPLBACKEND": "module://matplotlib_inline.backend_inline",
           "OMP_NUM_THREADS": "1"}
    log = tmp / "jupyter.log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
             f"--LabApp.user_settings_dir={tmp / 'settings'}", f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
             *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
            cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for_server(f"{base}/api/status?token={token}", proc, log)
        yield {"base": base, "token": token, "root": root, "notebook": notebook, "n_filled": n_filled,
               "log": log, "tmp": tmp}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _count_finished_cells(page) -> tuple[int, int, int]:
    """(code cells, cells with an execution count, cells still running) as the DOM shows them."""
    return page.evaluate("""() => {
        const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')];
        const text = prompts.map(p => p.textContent.trim());
        return [prompts.length, text.filter(t => /^\\[\\d+\\]:$/.test(t)).length,
                text.filter(t => t === '[*]:').length];
    }""")


def test_chapter1_runs_in_jupyterlab_with_widgets_and_validate(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    url = f"{lab['base']}/lab/tree/{CHAPTER}/{RELEASE_NB.name}?token={lab['token']}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 950})
        browser_errors: list[str] = []
        page.on("pageerror", lambda err: browser_errors.append(str(err)))
        try:
            page.goto(url, timeout=90_000)
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
            # The kernel must be up before "Run All Cells", or the run waits on a dialog.
            page.wait_for_function(
                "() => { const s = document.querySelector('.jp-NotebookPanel .jp-Toolbar-kernelStatus,"
                " .jp-NotebookPanel [data-jp-item-name=\"kernelStatus\"]');"
                " return !s || /idle/i.test(s.getAttribute('title') || s.getAttribute('aria-label') || s.textContent || 'idle'); }",
                timeout=90_000)

            # nbgrader's student extension: Validate in the notebook toolbar.
            validate = page.locator(".jp-NotebookPanel .validate-button")
            validate.first.wait_for(state="visible", timeout=30_000)
            assert "Validate" in validate.first.inner_text()

            page.locator(".jp-NotebookPanel .jp-Notebook").first.click(position={"x": 5, "y": 5})
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()

            n_code, n_done, n_running = _count_finished_cells(page)
            assert n_code > 0
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                n_code, n_done, n_running = _count_finished_cells(page)
                if n_running == 0 and (n_done == n_code or page.locator(
                        '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').count()):
                    break  # finished, or stopped at an error (JupyterLab stops "Run All" there)
                page.wait_for_timeout(1000)

            tracebacks = page.evaluate("""() => [...document.querySelectorAll(
                    '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], .jp-RenderedText')]
                .map(e => e.textContent)
                .filter(t => /Traceback|^\\s*\\w*(Error|Exception)\\b|NotImplementedError|CheckFailed/m.test(t))""")
            assert tracebacks == [], "cells show errors:\n" + "\n---\n".join(t[:1500] for t in tracebacks)
            assert n_done == n_code, f"only {n_done} of {n_code} code cells ran ({n_running} still running)"

            widgets = page.locator(".jp-OutputArea-output .jupyter-widgets, .jp-OutputArea-output .widget-slider")
            n_widgets = widgets.count()
            assert n_widgets > 0, "no ipywidgets rendered in the chapter"
            body = page.locator(".jp-Notebook").first.inner_text()
            assert "Error displaying widget" not in body
            assert "Loading widget..." not in body
            fallbacks = page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output .jp-RenderedText')]
                .map(e => e.textContent).filter(t => /^\\s*(interactive|VBox|HBox|IntSlider|FloatSlider)\\(/.test(t))""")
            assert fallbacks == [], f"widgets shown as text instead of controls: {fallbacks[:3]}"

            # The screenshot for README.md: the first interactive widget with its figure.
            current_tab = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
            if current_tab.count():
                current_tab.first.click()  # collapse the file browser: more of the notebook in the picture
            first = page.locator(".jp-OutputArea-output .widget-interact, .jp-OutputArea-output .jupyter-widgets").first
            first.scroll_into_view_if_needed()
            cell = page.locator(".jp-Cell", has=first).first
            cell.evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(500)
            shot = tmp_path / SCREENSHOT_NAME
            page.screenshot(path=str(shot))
            assert shot.stat().st_size > 10_000
            if os.environ.get("UPDATE_SCREENSHOTS") == "1":
                README_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shot, README_SCREENSHOT)
        except BaseException:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=False)
            print(f"failure screenshot: {tmp_path / 'failure.png'}; jupyter log: {lab['log']}")
            if browser_errors:
                print("browser errors:\n" + "\n".join(browser_errors))
            raise
        finally:
            browser.close()
