"""Nothing a learner writes is lost: the work folder, `release` and `git pull`.

The release is exercised on a temporary copy of course/ (the real course/ is never written);
`git pull` on a throw-away upstream repository and its clone.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
from support import REPO as ROOT
from support import cli

from autograder import registry, release, workspace

CHAPTERS = [c for c in registry.CHAPTERS if c.release_path().is_file()]
pytestmark = pytest.mark.skipif(not CHAPTERS, reason="no chapter released in course/")


def _edit(path: Path, text: str = "# my answer") -> bytes:
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    cell.source = cell.source.replace("raise NotImplementedError()", text)
    nbformat.write(nb, path)
    return path.read_bytes()


# --- fingerprints -------------------------------------------------------------------


def test_release_notebooks_are_pristine_and_stamped():
    for chapter in CHAPTERS:
        nb = nbformat.read(chapter.release_path(), as_version=4)
        assert nb.metadata[release.STAMP_KEY]["fingerprint"] == release.fingerprint(nb)
        assert release.is_pristine(chapter.release_path())


def test_fingerprint_sees_answers_outputs_and_new_cells_but_not_kernel_metadata(tmp_path):
    path = tmp_path / "nb.ipynb"
    shutil.copyfile(CHAPTERS[0].release_path(), path)
    nb = nbformat.read(path, as_version=4)
    nb.metadata["language_info"] = {"name": "python", "version": "3.11.7"}  # what a kernel adds on save
    nbformat.write(nb, path)
    assert release.is_pristine(path)
    for change in ("answer", "output", "cell"):
        nb = nbformat.read(CHAPTERS[0].release_path(), as_version=4)
        code = next(c for c in nb.cells if c.cell_type == "code")
        if change == "answer":
            code.source += "\nx = 1"
        elif change == "output":
            code.outputs = [nbformat.v4.new_output("stream", text="hello")]
        else:
            nb.cells.append(nbformat.v4.new_markdown_cell("my notes"))
        nbformat.write(nb, path)
        assert not release.is_pristine(path), change


# --- the work folder ----------------------------------------------------------------------


def test_workspace_copies_everything_once_then_never_overwrites(tmp_path):
    work = tmp_path / "work"
    report = workspace.sync(registry.COURSE_DIR, work)
    expected = {str(c.release_path().relative_to(registry.COURSE_DIR)) for c in CHAPTERS} | {"00_start_here.ipynb"}
    assert expected <= {line.removeprefix("added ") for line in report}
    mine = work / CHAPTERS[0].id / CHAPTERS[0].notebook
    edited = _edit(mine)
    assert workspace.sync(registry.COURSE_DIR, work) == []
    assert mine.read_bytes() == edited


def test_workspace_adds_new_chapters_updates_untouched_copies_and_keeps_edited_ones(tmp_path):
    course, work = tmp_path / "course", tmp_path / "work"
    shutil.copytree(registry.COURSE_DIR, course, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    first, *rest = CHAPTERS
    workspace.sync(course, work)
    held_back = course / "99_new_chapter"  # a chapter that arrives later
    shutil.copytree(course / first.id, held_back)
    (held_back / first.notebook).rename(held_back / "99_new_chapter.ipynb")

    edited = _edit(work / first.id / first.notebook)
    # A new release of every chapter (here: one more markdown cell).
    for chapter in CHAPTERS:
        path = course / chapter.id / chapter.notebook
        nb = nbformat.read(path, as_version=4)
        nb.cells.append(nbformat.v4.new_markdown_cell("An erratum."))
        nbformat.write(release.stamped(nb), path)

    report = workspace.sync(course, work)
    assert "added 99_new_chapter/99_new_chapter.ipynb" in report
    assert (work / first.id / first.notebook).read_bytes() == edited
    assert any(line.startswith(f"kept your {first.id}/") and "newer version" in line for line in report), report
    for chapter in rest:
        copy = nbformat.read(work / chapter.id / chapter.notebook, as_version=4)
        assert copy.cells[-1].source == "An erratum.", f"{chapter.id}: the untouched copy was not updated"
        assert release.is_pristine(work / chapter.id / chapter.notebook)


def test_workspace_rejects_a_work_folder_inside_course(tmp_path):
    with pytest.raises(ValueError, match="work_dir"):
        workspace.sync(registry.COURSE_DIR, registry.COURSE_DIR / "work")


# --- release never destroys learner work ---------------------------------------------------


@pytest.fixture
def released(nbgrader_course, tmp_path):
    """A temporary course/ holding a fresh release of the first chapter (the session's generation of it)."""
    course = tmp_path / "released"
    shutil.copytree(nbgrader_course.release(CHAPTERS[0].id), course / CHAPTERS[0].id)
    return course


def _release(capsys, *args) -> subprocess.CompletedProcess:
    """``python -m autograder release ARGS``, run in this process."""
    code, out, err = cli(capsys, "release", *args)
    return subprocess.CompletedProcess(["release", *args], code, out, err)


@pytest.mark.slow
def test_release_keeps_an_edited_notebook_and_its_checkpoints(released, tmp_path, capsys):
    course = tmp_path / "course"
    shutil.copytree(released, course)
    chapter = CHAPTERS[0]
    notebook = course / chapter.id / chapter.notebook
    checkpoints = course / chapter.id / ".ipynb_checkpoints"
    checkpoints.mkdir()
    (checkpoints / f"{chapter.id}-checkpoint.ipynb").write_bytes(notebook.read_bytes())
    edited = _edit(notebook)

    out = _release(capsys, "--chapter", chapter.id, "--course", str(course))
    assert out.returncode == 1
    assert "nothing released" in out.stderr and str(notebook) in out.stderr and "--force" in out.stderr
    assert notebook.read_bytes() == edited
    assert (checkpoints / f"{chapter.id}-checkpoint.ipynb").is_file()

    check = _release(capsys, "--check", "--chapter", chapter.id, "--course", str(course))
    assert check.returncode == 1
    assert "changes of its own" in check.stderr and "checkpoint" not in check.stderr, check.stderr
    assert "run `make release`" not in check.stderr  # the only problem is the learner's edit: no advice to regenerate

    work = tmp_path / "work"  # the learner's copy next to course/, as `make lab` makes it
    workspace.sync(course, work)
    mine = _edit(work / chapter.id / chapter.notebook, "# answer in my work folder")
    forced = _release(capsys, "--chapter", chapter.id, "--course", str(course), "--force")
    assert forced.returncode == 0, forced.stderr
    assert (work / chapter.id / chapter.notebook).read_bytes() == mine
    assert release.is_pristine(notebook)
    assert (checkpoints / f"{chapter.id}-checkpoint.ipynb").is_file()  # checkpoints are never deleted


@pytest.mark.slow
def test_release_check_ignores_checkpoints_and_regenerates_pristine_notebooks(released, tmp_path, capsys):
    course = tmp_path / "course"
    shutil.copytree(released, course)
    chapter = CHAPTERS[0]
    (course / chapter.id / ".ipynb_checkpoints").mkdir()
    (course / chapter.id / ".ipynb_checkpoints" / "scratch-checkpoint.ipynb").write_text("{}")
    check = _release(capsys, "--check", "--chapter", chapter.id, "--course", str(course))
    assert check.returncode == 0, check.stderr
    # A release notebook nobody changed is regenerated without --force.
    out = _release(capsys, "--chapter", chapter.id, "--course", str(course))
    assert out.returncode == 0, out.stderr


def test_replace_folder_deletes_only_unchanged_release_notebooks(tmp_path):
    chapter = CHAPTERS[0]
    fresh, target = tmp_path / "fresh", tmp_path / "target"
    fresh.mkdir()
    shutil.copytree(chapter.release_path().parent, target)
    shutil.copyfile(chapter.release_path(), fresh / "renamed.ipynb")  # the release no longer has the old name
    notes = target / "notes.ipynb"
    notes.write_text(nbformat.writes(nbformat.v4.new_notebook()))  # the learner's own notebook
    data = target / "my_data.csv"
    data.write_text("1,2\n")
    release.replace_folder(fresh, target)
    assert not (target / chapter.notebook).exists()  # a stale, unchanged release notebook
    assert (target / "renamed.ipynb").is_file() and notes.is_file() and data.is_file()


# --- git pull ---------------------------------------------------------------------------------


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "init.defaultBranch=main",
                          *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"git {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
    return out


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_learner_work_survives_git_pull_of_a_course_update(tmp_path):
    upstream, clone = tmp_path / "upstream", tmp_path / "clone"
    upstream.mkdir()
    shutil.copyfile(ROOT / ".gitignore", upstream / ".gitignore")
    shutil.copytree(registry.COURSE_DIR, upstream / "course", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    _git(upstream, "init", "-q")
    _git(upstream, "add", "-A")
    _git(upstream, "commit", "-qm", "course")
    _git(tmp_path, "clone", "-q", str(upstream), str(clone))

    workspace.sync(clone / "course", clone / "work")  # what `make lab` does (work/ is the default)
    chapter = CHAPTERS[0]
    mine = clone / "work" / chapter.id / chapter.notebook
    edited = _edit(mine)
    assert _git(clone, "status", "--porcelain").stdout == ""  # the work folder is not git's business

    # Upstream publishes a new release of the chapter and a new file.
    path = upstream / "course" / chapter.id / chapter.notebook
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("An erratum."))
    nbformat.write(release.stamped(nb), path)
    (upstream / "course" / chapter.id / "notes.md").write_text("new\n")
    _git(upstream, "add", "-A")
    _git(upstream, "commit", "-qm", "erratum")

    _git(clone, "pull", "-q", "--no-rebase")
    assert nbformat.read(clone / "course" / chapter.id / chapter.notebook, as_version=4).cells[-1].source == "An erratum."
    assert mine.read_bytes() == edited
    report = workspace.sync(clone / "course", clone / "work")
    assert mine.read_bytes() == edited
    assert f"added {chapter.id}/notes.md" in report
    assert any("newer version" in line for line in report)
