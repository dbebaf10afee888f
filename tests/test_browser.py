"""The chapters in a real browser: `make lab` (JupyterLab) + headless Chromium, driven by Playwright.

One JupyterLab, started by `make lab` on a temporary work folder as a learner starts it, and
one browser serve every test (the session's ``lab`` and ``browser``, conftest.py):

* every chapter of the registry, untouched, as a learner first opens it: "Run All Cells" runs
  every code cell — an unfinished exercise's test cell shows one red "not done yet" line and the
  run goes on — no other cell shows an error, and every widget the kernel displayed is rendered
  as a control (not as a text fallback, "Error displaying widget" or "Loading widget...");
* chapter 1 with the answers filled in from the source notebook: no cell shows an error, widgets
  render, nbgrader's Validate button is in the toolbar, and the student configuration shows no
  Assignment List (whose "Error fetching courses!" confused learners working alone). A screenshot
  of it goes to the pytest tmp dir; with UPDATE_SCREENSHOTS=1 it also replaces
  docs/screenshots/chapter1_widget.png (shown in README.md).

Kernels run with TDD_QUICK=1 (short training budgets). Nothing is written into course/. On a
failure a screenshot of the page is saved in the pytest tmp dir.

Needs Chromium: Debian's /usr/bin/chromium (`apt-get install chromium`) or the path in
$TDD_CHROMIUM. Without it the tests are skipped; `.ci/run` installs it in CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from support import FILLED, REPO, fill_solutions

from autograder import registry

FIRST = registry.CHAPTERS[0]
CHAPTERS = [c for c in registry.CHAPTERS if c.release_path().is_file()]
SCREENSHOT_NAME = "chapter1_widget.png"
README_SCREENSHOT = REPO / "docs" / "screenshots" / SCREENSHOT_NAME
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]


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


def _api(lab: dict, method: str, path: str):
    request = urllib.request.Request(f"{lab['base']}{path}?token={lab['token']}", method=method)
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    return json.loads(body) if body else None


def _count_finished_cells(page) -> tuple[int, int, int]:
    """(code cells, cells with an execution count, cells still running or queued) as the DOM shows them."""
    return page.evaluate("""() => {
        const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')];
        const text = prompts.map(p => p.textContent.trim());
        return [prompts.length, text.filter(t => /^\\[\\d+\\]:$/.test(t)).length,
                text.filter(t => t === '[*]:').length];
    }""")


# The notebook toolbar's kernel status: "Kernel status: Idle" in JupyterLab 4's execution indicator
# (data-jp-item-name="executionProgress"), the title of the kernelStatus item in earlier versions.
KERNEL_STATE = ("() => { const s = document.querySelector('.jp-NotebookPanel [data-jp-item-name=\"executionProgress\"],"
                " .jp-NotebookPanel .jp-Toolbar-kernelStatus, .jp-NotebookPanel [data-jp-item-name=\"kernelStatus\"]');"
                " if (!s) return 'missing';"
                " return /idle/i.test(s.getAttribute('title') || s.getAttribute('aria-label') || s.textContent || '')"
                " ? 'idle' : 'busy'; }")


def _kernel_ready(lab: dict, relative: str) -> bool:
    """The server lists a session for the notebook ``relative`` whose kernel is idle."""
    return any((s.get("path") or "").lstrip("/") == relative and (s.get("kernel") or {}).get("execution_state") == "idle"
               for s in _api(lab, "GET", "/api/sessions") or [])


def _open_and_run_all(lab: dict, page, relative: str, timeout: float = 420) -> tuple[int, int, int]:
    # A workspace of its own per notebook: JupyterLab would otherwise reopen the previous test's tabs.
    workspace = re.sub(r"[^a-z0-9]+", "-", relative.lower())
    page.goto(f"{lab['base']}/lab/workspaces/{workspace}/tree/{relative}?token={lab['token']}", timeout=90_000)
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    # The kernel must be up before "Run All Cells", or the run waits on a dialog. On a busy machine JupyterLab may
    # ask which kernel to start (while the first one is slow to come up): accepted when it shows.
    # (No kernel status shown at all after 10 s: this JupyterLab has none in the toolbar; go on, as before.)
    # The toolbar may read "Idle" before the notebook has a kernel at all: the server must also list this
    # notebook's session with its kernel idle (it has started and answered).
    opened = time.monotonic()
    while not _kernel_ready(lab, relative) or (
            (state := page.evaluate(KERNEL_STATE)) != "idle" and not (state == "missing" and time.monotonic() - opened > 10)):
        dialog = page.locator(".jp-Dialog .jp-mod-accept")
        if dialog.count():
            dialog.first.click()
        assert time.monotonic() - opened < 90, f"{relative}: the kernel did not come up within 90 s"
        page.wait_for_timeout(250)
    page.locator(".jp-NotebookPanel .jp-Notebook").first.click(position={"x": 5, "y": 5})
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click()
    # After an error JupyterLab shows the cells still queued as not run ("[ ]") until the kernel
    # answers for them: the kernel's own state says when the run is over.
    start = time.monotonic()
    deadline, idle_since, started = start + timeout, None, False
    n_code, n_done, n_running = _count_finished_cells(page)
    while time.monotonic() < deadline:
        page.wait_for_timeout(1000)
        n_code, n_done, n_running = _count_finished_cells(page)
        if n_running == 0 and n_done == n_code:
            break
        busy = any(k.get("execution_state") != "idle" for k in _api(lab, "GET", "/api/kernels") or [])
        started = started or busy or n_running > 0 or n_done > 0
        idle_since = None if busy or n_running else (idle_since or time.monotonic())
        if idle_since is not None and time.monotonic() - idle_since > 5 and (started or time.monotonic() - start > 60):
            break  # the kernel has nothing more to run: Run All stopped
    return n_code, n_done, n_running


def _error_texts(page) -> list[dict]:
    """Each error shown in an output area (an error or stderr output; a demo may print ✗ lines on purpose):
    its text and whether its cell is a graded test cell."""
    return page.evaluate("""() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].flatMap(cell => {
        const outputs = [...cell.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')];
        const source = cell.querySelector('.jp-InputArea-editor')?.textContent || '';
        return outputs.map(e => e.textContent)
            .filter(t => /Traceback|^\\s*\\w*(Error|Exception)\\b|NotImplementedError|CheckFailed|✗/m.test(t))
            .map(t => ({text: t, test_cell: /checks\\.run\\(/.test(source)}));
    })""")


def _widget_problems(page) -> list[str]:
    body = page.locator(".jp-Notebook").first.inner_text()
    problems = [p for p in ("Error displaying widget", "Loading widget...") if p in body]
    problems += page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output .jp-RenderedText')]
        .map(e => e.textContent).filter(t => /^\\s*(interactive|VBox|HBox|IntSlider|FloatSlider)\\(/.test(t))""")
    return problems


def _rendered_widgets(page) -> int:
    return page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output')]
        .filter(e => e.classList.contains('jupyter-widgets') || e.querySelector('.jupyter-widgets')).length""")


def _save_and_count_widget_outputs(page, path: Path) -> int:
    """Save the notebook from the browser and count the widget views the kernel displayed in it."""
    before = path.stat().st_mtime_ns
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 30
    while path.stat().st_mtime_ns == before and time.monotonic() < deadline:
        page.wait_for_timeout(300)
    while True:  # the server may be caught between truncating the file and writing it
        try:
            nb = nbformat.read(path, as_version=4)
            break
        except (nbformat.reader.NotJSONError, ValueError):
            if time.monotonic() > deadline:
                raise
            page.wait_for_timeout(300)
    return sum(WIDGET_MIME in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def _shutdown_kernels(lab: dict) -> None:
    for session in _api(lab, "GET", "/api/sessions") or []:
        _api(lab, "DELETE", f"/api/sessions/{session['id']}")


@contextlib.contextmanager
def _page(lab: dict, browser, tmp_path: Path):
    """A browser tab; on a failure a screenshot and the browser's errors; afterwards its kernel is shut down."""
    page = browser.new_page(viewport={"width": 1400, "height": 950})
    browser_errors: list[str] = []
    page.on("pageerror", lambda err: browser_errors.append(str(err)))
    try:
        yield page
    except BaseException:
        page.screenshot(path=str(tmp_path / "failure.png"), full_page=False)
        print(f"failure screenshot: {tmp_path / 'failure.png'}; jupyter log: {lab['log']}")
        if browser_errors:
            print("browser errors:\n" + "\n".join(browser_errors))
        raise
    finally:
        page.close()
        _shutdown_kernels(lab)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.id)
def test_run_all_on_an_untouched_chapter_runs_every_cell_and_renders_every_widget(lab, browser, chapter, tmp_path):
    with _page(lab, browser, tmp_path) as page:
        n_code, n_done, n_running = _open_and_run_all(lab, page, f"{chapter.id}/{chapter.notebook}")
        assert n_code > 0
        assert n_done == n_code, f"Run All stopped: only {n_done} of {n_code} code cells ran ({n_running} running)"

        errors = _error_texts(page)
        assert [e for e in errors if not e["test_cell"]] == [], "cells other than the tests show errors"
        assert len(errors) == len(chapter.exercises), errors
        for error in errors:
            assert "not done yet" in error["text"] and "Traceback" not in error["text"], error
            assert len(error["text"].strip().splitlines()) == 1, error

        assert _widget_problems(page) == []
        displayed = _save_and_count_widget_outputs(page, lab["work"] / chapter.id / chapter.notebook)
        assert displayed > 0, "no widget displayed: a widget waiting for an exercise shows and says so"
        assert _rendered_widgets(page) >= displayed, f"{displayed} widget(s) displayed, fewer rendered"


def test_chapter1_with_answers_runs_in_jupyterlab_with_widgets_and_validate(lab, browser, tmp_path):
    with _page(lab, browser, tmp_path) as page:
        n_code, n_done, n_running = _open_and_run_all(lab, page, f"{FILLED}/{FIRST.notebook}")
        # nbgrader's student extension: Validate in the notebook toolbar; no Assignment List without an exchange.
        validate = page.locator(".jp-NotebookPanel .validate-button")
        validate.first.wait_for(state="visible", timeout=30_000)
        assert "Validate" in validate.first.inner_text()
        menus = page.locator(".lm-MenuBar-itemLabel").all_inner_texts()
        if "Nbgrader" in menus:
            page.get_by_role("menuitem", name="Nbgrader", exact=True).click()
            assert "Assignment List" not in page.locator(".lm-Menu").first.inner_text()
            page.keyboard.press("Escape")

        assert _error_texts(page) == [], "cells show errors"
        assert n_done == n_code, f"only {n_done} of {n_code} code cells ran ({n_running} still running)"
        assert page.locator(".jp-OutputArea-output").filter(has_text="visible checks passed").count() == \
            len(FIRST.exercises)
        assert _rendered_widgets(page) > 0, "no ipywidgets rendered in the chapter"
        assert _widget_problems(page) == []
        assert "Error fetching courses" not in page.content()

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
            README_SCREENSHOT.write_bytes(shot.read_bytes())
