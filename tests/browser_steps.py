"""Browser steps for nbgrader's learner side in the JupyterLab of `make lab`: the Nbgrader menu and Validate.

Plain functions over a Playwright ``page`` that shows a notebook open in JupyterLab started by `make lab` (as
tests/test_browser.py starts it), and a folder for the screenshots; tests/test_browser.py calls them in its one
browser session. What they check (binder/jupyter is the configuration of `make lab` and Binder):

* :func:`nbgrader_menu` — the menu bar holds no "Nbgrader" menu, since nothing in it applies without an exchange
  (Assignment List, Course List, Formgrader, Create Assignment are off); where one is shown (a hub), opening it
  lists only enabled items. Screenshot of the menu bar, or of the open menu.
* :func:`validate` — the notebook's Validate button: while nbgrader runs the notebook its label counts the
  seconds ("Validating… 12 s", the course's extension binder/jupyter/labextensions/tdd-course); then the result
  dialog shows every line whole (no line cut at the dialog's edge: each ``pre`` wraps). Screenshots of the
  button while it runs and of the dialog.
* :func:`no_news_popup` — JupyterLab does not ask "get notified about official Jupyter news?".

:func:`wrong_chapter_notebook` makes a finished notebook with one wrong answer, whose hint is longer than the
dialog is wide: validating it shows the wrapped hint.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import nbformat

SOLUTION_MARKERS = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)
# chapter 1's softmax, normalised over every element instead of along dim: its hint is about 200 characters
WRONG_SOFTMAX = '''def softmax(x, dim=-1):
    """Numerically stable softmax; equal to ``torch.softmax(x, dim)``."""
    shifted = x - x.amax(dim=dim, keepdim=True)
    return shifted.exp() / shifted.exp().sum()
'''


def wrong_chapter_notebook(release: Path, source: Path, out: Path) -> Path:
    """Chapter 1's release with every answer filled in from the source notebook but softmax, which is wrong."""
    answers = {c.metadata["nbgrader"]["grade_id"]: SOLUTION_MARKERS.sub("", c.source)
               for c in nbformat.read(source, as_version=4).cells if c.metadata.get("nbgrader", {}).get("solution")}
    answers["softmax_solution"] = WRONG_SOFTMAX
    nb = nbformat.read(release, as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = answers[grade_id]
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)
    return out


def nbgrader_menu(page, shots: Path) -> str:
    """Open the Nbgrader menu if there is one; "hidden" or "shown". Either way nothing in it is a dead end."""
    page.wait_for_selector(".lm-MenuBar-content", timeout=60_000)
    menus = [m.strip() for m in page.locator(".lm-MenuBar-itemLabel").all_inner_texts()]
    assert "File" in menus, menus
    if "Nbgrader" not in menus:
        page.locator(".lm-MenuBar-content").screenshot(path=str(shots / "nbgrader_menu_hidden.png"))
        return "hidden"
    page.get_by_role("menuitem", name="Nbgrader", exact=True).click()
    menu = page.locator(".lm-Menu").first
    menu.wait_for(state="visible", timeout=10_000)
    items = [t.strip() for t in menu.locator(".lm-Menu-itemLabel").all_inner_texts() if t.strip()]
    disabled = menu.locator(".lm-Menu-item.lm-mod-disabled").count()
    page.screenshot(path=str(shots / "nbgrader_menu.png"))
    page.keyboard.press("Escape")
    assert items, "the Nbgrader menu opens empty"
    assert disabled == 0, f"{disabled} disabled item(s) in the Nbgrader menu: {items}"
    return "shown"


def no_news_popup(page, wait_ms: int = 3000) -> None:
    """No "get notified about official Jupyter news?" notification after the page has settled."""
    page.wait_for_timeout(wait_ms)
    toasts = " ".join(page.locator(".Toastify__toast, .jp-Notification-Toast").all_inner_texts())
    assert "news" not in toasts.lower(), toasts


def validate(page, shots: Path, timeout: float = 600) -> dict:
    """Press the open notebook's Validate button and wait for its dialog.

    Returns ``{"seconds": how long it ran, "counted": the counts its label showed while it ran, "text": the dialog's
    text}``; asserts that the label counted the seconds while it ran, that the dialog shows every line whole, and
    saves ``validate_running.png`` and ``validate_dialog.png`` in ``shots``.
    """
    assert page.evaluate("() => !!document.getElementById('tdd-course-style')"), "the course's lab extension is not loaded"
    button = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .validate-button").first
    button.wait_for(state="visible", timeout=60_000)
    label = button.locator(".jp-ToolbarButtonComponent-label")
    start = time.monotonic()
    button.click()
    counted: list[int] = []
    shot_taken = False
    dialog = page.locator(".jp-Dialog")
    while time.monotonic() - start < timeout:
        if dialog.count() and dialog.first.is_visible():
            break
        text = label.inner_text(timeout=5_000) if label.count() else ""
        found = re.match(r"Validating… (\d+) s", text)
        if found:
            counted.append(int(found.group(1)))
            if not shot_taken and int(found.group(1)) >= 2:
                button.screenshot(path=str(shots / "validate_running.png"))
                shot_taken = True
        page.wait_for_timeout(400)
    seconds = time.monotonic() - start
    assert dialog.count() and dialog.first.is_visible(), f"no Validate dialog after {timeout:.0f} s"
    assert counted and max(counted) >= min(counted), f"Validate's label did not count the seconds ({seconds:.0f} s)"
    if seconds > 4:
        assert len(set(counted)) > 1, f"the count did not move in {seconds:.0f} s: {counted}"
    dialog.first.screenshot(path=str(shots / "validate_dialog.png"))
    cut = page.evaluate("""() => [...document.querySelectorAll('.jp-Dialog pre')]
        .filter(p => p.scrollWidth > p.clientWidth + 1).map(p => p.textContent.slice(0, 120))""")
    assert not cut, f"lines cut at the dialog's edge: {cut}"
    text = dialog.first.inner_text()
    page.locator(".jp-Dialog .jp-mod-accept").first.click()
    assert "Validate" == label.inner_text(timeout=10_000).strip(), "the button did not come back"
    return {"seconds": seconds, "counted": counted, "text": text}
