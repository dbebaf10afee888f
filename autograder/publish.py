"""``python -m autograder publish DEST``: the student edition, a repository to give learners of a graded course.

This repository is the instructor's: ``autograder/source/`` holds every solution and hidden
test, ``autograder/checks/`` the hidden cases, ``solutions/`` every answer. The student
edition written to ``DEST`` holds what learners need and nothing they must not see:

* ``course/``: the release notebooks (stubs, visible tests; no solution region, no hidden test) of the
  chapters it opens, and ``00_start_here.ipynb``. A chapter imports the answers of the chapters it
  ``needs`` (the registry), so it opens only once their answers are released: by default the edition
  opens every chapter whose prerequisites' answers are released (``--answers``; with none, chapter 1),
  and ``--chapters`` names them instead; a chapter named whose prerequisites are withheld is refused;
* ``solutions/``: the library, except the answer modules (the registry's ``Chapter.answers``)
  of the chapters not named with ``--answers``, and the modules that import them: each is
  replaced by a module that raises ``ImportError`` saying it is withheld (run with ``python -m``,
  it prints that in one line). Publishing again with more ``--answers`` releases those chapters'
  answers and opens the chapters that were waiting for them;
* ``autograder/``: the checks with every ``Check``'s hidden cases removed (``hidden=()``),
  the self-check and the grader, without ``source/``. A chapter's checks compute what is an
  answer (with the reference, or by their own code) only in functions marked
  ``@core.recorded``; for every checks module that needs a withheld module, publishing runs its
  visible cases with the reference and saves those functions' results in
  ``autograder/checks/recorded/<module>.pt`` (tensors and numbers, loaded with
  ``weights_only=True``), and empties the marked functions' bodies (helpers only they used go
  too): in the edition the visible checks replay the reference's results and give the
  notebook's verdicts, and no code of theirs computes a withheld answer
  (tests/test_publish.py traces this);
* ``binder/``, ``pyproject.toml``, ``.gitignore``, ``scripts/install_torch.py``, the learners' part of
  the ``Makefile`` (``make lab``, ``install``, ``clean-venv``: the targets above its instructor line) and a
  short README: ``make lab`` works there as here, and nothing there points to what the edition lacks.

``DEST`` is created, or updated in place when it holds an earlier edition (its ``.git`` is kept,
so the instructor commits and pushes the update). Before anything is written the edition is built
in a temporary folder and searched for solution regions, hidden-test markers, hidden case names
and withheld code; publishing stops if one is found.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

from autograder import registry

ROOT = registry.PACKAGE_DIR.parent
MARKER = ".student-edition.json"  # in DEST: what was published, so that DEST can be updated later
COPIED = ("course", "solutions", "autograder", "binder", "pyproject.toml", ".gitignore",
          "scripts/install_torch.py", "LICENSE", "LICENSE.md", "LICENSE.txt")
SKIPPED_PARTS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache"}
START_HERE = "00_start_here.ipynb"
# The Makefile's line after which its targets are the instructor's and the developer's (not in the edition).
INSTRUCTOR_LINE = "# --- instructor and developer targets"
# A solution region or hidden tests, as nbgrader marks them: the marker alone on its line.
REGION = re.compile(r"^[ \t]*### (BEGIN|END) (SOLUTION|HIDDEN TESTS)[ \t]*$", re.MULTILINE)


class PublishError(Exception):
    """The edition cannot be published as asked; the message says why and what to change."""


# --- which modules are withheld -----------------------------------------------------


def module_name(path: Path, root: Path = ROOT) -> str:
    """``solutions/data/text.py`` -> ``solutions.data.text``; ``solutions/__init__.py`` -> ``solutions``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=256)
def _tree(source: str) -> ast.Module:
    """``ast.parse(source)`` once per text: a build reads the same modules several times (a checks module is parsed
    for its imports, its hidden cases and its recorded functions). The trees are only read."""
    return ast.parse(source)


def imported_modules(source: str, module: str = "", is_package: bool = False) -> set[str]:
    """The modules ``source`` imports (absolute names; relative imports resolved against ``module``)."""
    found = set()
    for node in ast.walk(_tree(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _library_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / "solutions").rglob("*.py"))
            if not SKIPPED_PARTS & set(p.parts)}


def named_modules(source: str, library: set[str]) -> set[str]:
    """The library modules ``source`` may import by a name it builds (``importlib.import_module(f"solutions.trainers.
    {task}")``): every module of a package that a string or f-string starting ``<package>.`` names."""
    found = set()
    for node in ast.walk(_tree(source)):
        text = (node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else
                node.values[0].value if isinstance(node, ast.JoinedStr) and node.values
                and isinstance(node.values[0], ast.Constant) else None)
        if isinstance(text, str) and text.endswith(".") and text[:-1] in library:
            found |= {m for m in library if m.startswith(text)}
    return found


def withheld_modules(answers: set[str], root: Path = ROOT) -> dict[str, str]:
    """Withheld library module -> why, for a student edition releasing the answers of the chapters ``answers``."""
    owner = registry.answer_modules()
    withheld = {m: f"the answers of chapter {registry.get(c).number} ({registry.get(c).title})"
                for m, c in owner.items() if c not in answers}
    library = _library_modules(root)
    imports = {m: imported_modules(p.read_text(), m, p.name == "__init__.py") | named_modules(p.read_text(), set(library))
               for m, p in library.items()}
    changed = True
    while changed:  # a module that imports a withheld one cannot work without it
        changed = False
        for module, names in imports.items():
            if module in withheld or module == "solutions":
                continue
            needed = sorted(n for n in names if n in withheld)
            if needed:
                if owner.get(module) in answers:
                    chapter = registry.get(owner[module])
                    raise PublishError(f"chapter {chapter.number}'s answers ({module}) need {needed[0]}, which holds "
                                       f"{withheld[needed[0]]}: release that chapter's answers too (--answers)")
                withheld[module] = f"it needs {needed[0]} ({withheld[needed[0]]})"
                changed = True
    return withheld


def withheld_stub(module: str, why: str) -> str:
    message = (f"{module} is withheld in this student edition: it holds {why}" if why.startswith("the answers")
               else f"{module} is withheld in this student edition: {why}")
    message += "; your instructor releases it when the chapter is due"
    # `python -m` of a withheld command (solutions.train) says so in one line, not with a traceback
    return (f'"""{message}."""\n\nimport sys\n\nif __name__ == "__main__":\n    sys.exit({message!r})\n'
            f"raise ImportError({message!r})\n")


def _chapter_names(ids: list[str]) -> str:
    return ", ".join(f"chapter {registry.get(c).number} ({c})" for c in ids)


def open_chapters(answers: set[str], chapters: list[str] | None = None) -> list[str]:
    """The chapters whose notebooks the edition holds, in course order.

    A chapter imports the answers of its prerequisites (the registry's ``needs``), so it opens only once they
    are released. By default: every chapter whose prerequisites' answers are in ``answers``. ``chapters``
    names them instead (the chapters whose answers are released stay open too). PublishError, in one line
    naming them, for a chapter named or released whose prerequisites are withheld.
    """
    unknown = sorted(set(chapters or ()) - set(registry.ids()))
    if unknown:
        raise PublishError(f"--chapters {', '.join(unknown)}: no such chapter; choose from {', '.join(registry.ids())}")
    if chapters is None:
        return [c.id for c in registry.CHAPTERS if set(registry.prerequisites(c.id)) <= answers]
    wanted = set(chapters) | answers
    for chapter in registry.CHAPTERS:
        missing = [p for p in registry.prerequisites(chapter.id) if p not in answers]
        if chapter.id in wanted and missing:
            option = " ".join(f"--answers {m}" for m in missing)
            raise PublishError(f"chapter {chapter.number} ({chapter.id}) needs the answers of {_chapter_names(missing)}, "
                               f"which this edition withholds: add {option}, or leave chapter {chapter.number} out")
    return [c.id for c in registry.CHAPTERS if c.id in wanted]


def module_chapters(module: str, root: Path = ROOT) -> set[str]:
    """The chapters whose answers library module ``module`` holds or imports (directly or through others)."""
    owner, library = registry.answer_modules(), _library_modules(root)
    found, seen, todo = set(), set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in owner:
            found.add(owner[name])
        if name in library:
            path = library[name]
            source = path.read_text()
            todo += [m for m in imported_modules(source, name, path.name == "__init__.py") | named_modules(source, set(library))
                     if m in library]
    return found


# --- checks without their hidden cases ------------------------------------------------


def _span(source_lines: list[str], node: ast.AST) -> tuple[int, int]:
    """Character offsets of ``node`` in the joined source."""
    starts = [0]
    for line in source_lines:
        starts.append(starts[-1] + len(line))
    return (starts[node.lineno - 1] + len(source_lines[node.lineno - 1].encode()[: node.col_offset].decode()),
            starts[node.end_lineno - 1] + len(source_lines[node.end_lineno - 1].encode()[: node.end_col_offset].decode()))


def _replace_spans(source: str, spans: list[tuple[int, int, str]]) -> str:
    for start, end, text in sorted(spans, reverse=True):
        source = source[:start] + text + source[end:]
    return source


def strip_hidden(source: str, used_elsewhere: set[str] = frozenset()) -> str:
    """A checks module's source with every ``Check(..., hidden=...)`` emptied and the private
    helpers only the hidden cases used removed (except the names in ``used_elsewhere``)."""
    lines = source.splitlines(keepends=True)
    spans = []
    for node in ast.walk(_tree(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Check":
            values = [kw.value for kw in node.keywords if kw.arg == "hidden"] + node.args[2:3]
            spans += [(*_span(lines, value), "()") for value in values]
    source = _replace_spans(source, spans)
    # Drop the module-level private definitions nothing refers to any more, until none is left (a helper used only
    # by a dropped one goes in the next round), on one parse: the names each statement reads, taken once.
    tree = ast.parse(source)
    reads = [{n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
             for node in tree.body]
    defines = [[node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else
               [t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
               if isinstance(node, (ast.Assign, ast.AnnAssign)) else [] for node in tree.body]
    dropped: set[int] = set()
    while True:
        used = set(used_elsewhere).union(*(r for i, r in enumerate(reads) if i not in dropped))
        unused = {i for i, names in enumerate(defines) if i not in dropped and names
                  and all(n.startswith("_") and n not in used for n in names)}
        if not unused:
            break
        dropped |= unused
    if not dropped:
        return source
    lines = source.splitlines(keepends=True)
    for i in sorted(dropped, reverse=True):
        node = tree.body[i]
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        del lines[first - 1:node.end_lineno]
    return re.sub(r"\n{4,}", "\n\n\n", "".join(lines))


def hidden_case_names() -> dict[str, set[str]]:
    """Checks module -> the names of its hidden cases that are not also visible ones."""
    names = {}
    for chapter in registry.CHAPTERS:
        checks = chapter.load_checks()
        visible = {case.name for check in checks.values() for case in check.visible}
        names[chapter.checks] = {case.name for check in checks.values() for case in check.hidden} - visible
    return names


# --- the reference's results, recorded for the checks that need a withheld module -----------

_REFERENCE_CALL = re.compile(r"""core\.reference\(\s*["']([\w.]+)["']\s*\)""")


def reference_modules(source: str) -> set[str]:
    """The library modules a checks module's source uses: imported, or through ``core.reference("...")``."""
    return {m for m in imported_modules(source) if m.split(".")[0] == "solutions"} | set(_REFERENCE_CALL.findall(source))


def _is_recorded(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any(
        ast.unparse(d) in ("core.recorded", "recorded") for d in node.decorator_list)


def empty_recorded(source: str) -> str:
    """``source`` with the body of every ``@core.recorded`` function replaced by a ``raise`` (its results are
    replayed from the recording; the code that computed them with the reference stays with the instructor)."""
    lines = source.splitlines(keepends=True)
    spans = []
    for node in ast.walk(_tree(source)):
        if _is_recorded(node):
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            start, end = _span(lines, body[0])[0], _span(lines, body[-1])[1]
            spans.append((start, end, "raise core.ReferenceWithheld(\"replayed from autograder/checks/recorded in "
                                      "this student edition\")"))
    return _replace_spans(source, spans)


def record_references(checks: list[str]) -> dict[str, dict]:
    """Run the visible cases of ``checks`` with the reference answers; each module's recorded calls."""
    from autograder.checks import core

    exercises = {ex.name: ex for c in registry.CHAPTERS if c.checks in checks for ex in c.exercises}
    try:
        return core.recording(checks, lambda name: exercises[name].load_reference())
    except (RuntimeError, TypeError) as err:
        raise PublishError(f"the reference's results could not be recorded: {err}") from None


def _save_recordings(out: Path, recordings: dict[str, dict]) -> dict[str, int]:
    import torch

    from autograder.checks import core

    folder = out / core.RECORDED_DIR.relative_to(ROOT)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    sizes = {}
    for checks_module, table in sorted(recordings.items()):
        path = folder / core.recording_path(checks_module).name
        torch.save(table, path)
        sizes[checks_module] = path.stat().st_size
    return sizes


# --- building the edition ---------------------------------------------------------------


def checks_imported_names(root: Path = ROOT) -> set[str]:
    """The names the checks modules import from each other (``strip_hidden`` keeps them)."""
    return {alias.name for p in (root / "autograder" / "checks").glob("*.py") for node in ast.walk(_tree(p.read_text()))
            if isinstance(node, ast.ImportFrom) for alias in node.names}


def replays(chapter: registry.Chapter, withheld: set[str] | dict[str, str], root: Path = ROOT) -> bool:
    """Whether ``chapter``'s checks need a withheld module: the edition then replays their recorded results."""
    return bool(reference_modules((root / Path(*chapter.checks.split("."))).with_suffix(".py").read_text())
                & set(withheld))


def edition_checks_source(chapter: registry.Chapter, withheld: set[str] | dict[str, str], root: Path = ROOT,
                          imported: set[str] | None = None) -> str:
    """``chapter``'s checks module as an edition withholding the modules ``withheld`` holds it: every hidden case
    removed, and the ``@core.recorded`` functions emptied when the checks need a withheld module."""
    imported = checks_imported_names(root) if imported is None else imported
    source = strip_hidden((root / Path(*chapter.checks.split("."))).with_suffix(".py").read_text(), imported)
    return strip_hidden(empty_recorded(source), imported) if replays(chapter, withheld, root) else source


def edition_makefile(root: Path = ROOT) -> str:
    """The learners' part of the Makefile: everything above its instructor line."""
    text = (root / "Makefile").read_text()
    if INSTRUCTOR_LINE not in text:
        raise PublishError(f"the Makefile has no line starting {INSTRUCTOR_LINE!r}: nothing tells its learners' targets "
                           "from the instructor's")
    return text[: text.index(INSTRUCTOR_LINE)].rstrip() + "\n"


def _notebook_imports(path: Path) -> set[str]:
    found = set()
    for cell in json.loads(path.read_text()).get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = "".join(cell.get("source", ""))
        source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
        try:
            found |= imported_modules(source)
        except SyntaxError:
            continue
    return found


def _readme(answers: list[str], chapters: list[str]) -> str:
    def state(c: registry.Chapter) -> str:
        if c.id in answers:
            return "open; answers released"
        if c.id in chapters:
            return "open"
        waiting = [p for p in registry.prerequisites(c.id) if p not in answers]
        return (f"opens once the answers of chapter{'s' if len(waiting) > 1 else ''} "
                f"{', '.join(str(registry.get(p).number) for p in waiting)} are released" if waiting
                else "not released yet")

    rows = "\n".join(f"| {c.number} | {c.title} | {state(c)} |" for c in registry.CHAPTERS)
    return f"""# Transformer Deep Dive — student edition

```bash
make lab    # installs everything into .venv on first use, then opens JupyterLab on your work folder
```

You need Python ≥ 3.10 with `venv`, `make`, and a network connection for the first install only.
`make lab` copies the chapters of `course/` into `work/` (your notebooks; git does not track them, so
`git pull` brings new chapters without touching your work) and opens JupyterLab there. Start with
`00_start_here.ipynb`. Each exercise's test cell runs the visible checks; your instructor grades with
more cases.

| # | chapter | state |
|---|---|---|
{rows}

A chapter builds on the answers of the chapters before it, so it opens once those are released: new
chapters and answers arrive with `git pull`, and the next `make lab` adds them to `work/`. Until then the
library modules that hold them (`solutions/`) raise an `ImportError` that says so.

**Self-check** a chapter in a fresh kernel (the score of its visible tests), in a terminal of the JupyterLab
that `make lab` started (File → New → Terminal; it opens in `work/` and its `python` is the course's):

```bash
python -m autograder check 01_attention_by_hand/01_attention_by_hand.ipynb
```

(from this folder: `.venv/bin/python -m autograder check work/01_attention_by_hand/01_attention_by_hand.ipynb`),
or press **Validate** in the notebook's toolbar. `make clean-venv` removes `.venv/` (then `make lab` installs
again).
"""


def build(out: Path, answers: list[str], root: Path = ROOT, chapters: list[str] | None = None) -> list[str]:
    """Write the student edition into the empty folder ``out``; returns notes for the instructor."""
    unknown = sorted(set(answers) - set(registry.ids()))
    if unknown:
        raise PublishError(f"--answers {', '.join(unknown)}: no such chapter; choose from {', '.join(registry.ids())}")
    opened = open_chapters(set(answers), chapters)
    withheld = withheld_modules(set(answers), root)
    notes = [f"withheld {m}: {why}" for m, why in sorted(withheld.items())]
    for entry in COPIED:
        source = root / entry
        if source.is_file():
            (out / entry).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, out / entry)
        elif source.is_dir():
            shutil.copytree(source, out / entry, ignore=shutil.ignore_patterns(*SKIPPED_PARTS, "*.egg-info"))
    (out / "Makefile").write_text(edition_makefile(root))
    for chapter in registry.CHAPTERS:
        if chapter.id not in opened:
            shutil.rmtree(out / "course" / chapter.id, ignore_errors=True)
            waiting = [p for p in registry.prerequisites(chapter.id) if p not in answers]
            notes.append(f"chapter {chapter.number} ({chapter.id}) not opened: "
                         + (f"it needs the answers of {_chapter_names(waiting)}" if waiting else "not in --chapters"))
    shutil.rmtree(out / "autograder" / "source", ignore_errors=True)
    shutil.rmtree(out / "autograder" / "checks" / "recorded", ignore_errors=True)
    for module, why in withheld.items():
        path = out / _library_modules(root)[module].relative_to(root)
        path.write_text(withheld_stub(module, why))
    hidden = hidden_case_names()
    imported_names = checks_imported_names(root)
    replayed = [c.checks for c in registry.CHAPTERS if replays(c, withheld, root)]
    sizes = _save_recordings(out, record_references(replayed)) if replayed else {}
    for chapter in registry.CHAPTERS:
        path = out / Path(*chapter.checks.split(".")).with_suffix(".py")
        stripped = edition_checks_source(chapter, withheld, root, imported_names)
        compile(stripped, str(path), "exec")
        strings = {n.value for n in ast.walk(ast.parse(stripped)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        leaked = sorted(hidden[chapter.checks] & strings)
        if leaked:
            raise PublishError(f"{chapter.checks}: hidden cases are still there after removing every Check's "
                               f"hidden=...: {leaked[:3]}; define hidden cases inside Check(...)")
        path.write_text(stripped)
        needs = sorted(m for m in imported_modules(stripped) if m in withheld)
        if needs:
            raise PublishError(f"{chapter.checks} imports {needs[0]}, which is withheld: import it with "
                               "core.reference(...) and compute with it only in @core.recorded functions")
        if chapter.checks in replayed:
            notes.append(f"{chapter.checks} needs {', '.join(sorted(reference_modules(path.read_text()) & set(withheld)))}"
                         f" (withheld): its visible checks replay the reference's recorded results "
                         f"({sizes[chapter.checks] / 1024:.0f} KiB)")
    for notebook in sorted((out / "course").rglob("*.ipynb")):
        chapter_id = notebook.parent.name if notebook.parent != out / "course" else None
        own = set(registry.get(chapter_id).answers) if chapter_id in registry.ids() else set()
        needs = sorted(m for m in _notebook_imports(notebook) if m in withheld and m not in own)
        if needs:  # the registry's `needs` misses a chapter: the notebook would stop at its first cell
            raise PublishError(f"{notebook.relative_to(out)} imports {needs[0]}, which this edition withholds: add the "
                               "chapter it belongs to to that chapter's needs in autograder/registry.py")
    (out / "README.md").write_text(_readme(answers, opened))
    (out / MARKER).write_text(json.dumps({"answers": sorted(answers), "chapters": opened,
                                          "withheld": sorted(withheld)}, indent=2) + "\n")
    _verify(out, withheld, root)
    return notes


def _verify(out: Path, withheld: dict[str, str], root: Path) -> None:
    """No solution region, hidden test or withheld code anywhere in the edition."""
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        try:
            text = path.read_text()
            if path.suffix == ".ipynb":
                text = "\n".join("".join(c.get("source", "")) for c in json.loads(text).get("cells", []))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        found = REGION.search(text)
        if found:
            raise PublishError(f"{path.relative_to(out)} contains {found.group().strip()!r}; nothing was published")
    import torch

    for path in sorted((out / "autograder" / "checks" / "recorded").glob("*")):
        try:  # plain data only: weights_only refuses anything that would run code when loaded
            torch.load(path, weights_only=True)
        except Exception as err:  # noqa: BLE001
            raise PublishError(f"{path.relative_to(out)} is not plain data ({err}); nothing was published") from None
    library = _library_modules(root)
    for module in withheld:
        original = library[module].read_text()
        defined = [n.name for n in ast.parse(original).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        copy = (out / library[module].relative_to(root)).read_text()
        if any(re.search(rf"\b(def|class) {re.escape(name)}\b", copy) for name in defined):
            raise PublishError(f"{module} is withheld but its code is in the edition; nothing was published")


def publish(dest: Path, answers: list[str], root: Path = ROOT, chapters: list[str] | None = None) -> list[str]:
    """Build the edition, then make ``dest`` hold exactly it (an existing ``dest/.git`` is kept)."""
    dest, root_dir = Path(dest).resolve(), root.resolve()
    if dest == root_dir or dest in root_dir.parents or (root_dir in dest.parents and root_dir / "dist" not in dest.parents):
        raise PublishError(f"DEST must be outside the repository, or in its dist/ folder; got {dest}")
    if dest.exists() and (not dest.is_dir() or (any(p.name != ".git" for p in dest.iterdir())
                                                 and not (dest / MARKER).is_file())):
        raise PublishError(f"DEST {dest} exists and is not an earlier student edition: choose a new or empty folder")
    with tempfile.TemporaryDirectory(prefix="tdd-edition-") as tmp:
        notes = build(Path(tmp), answers, root, chapters)
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.iterdir():
            if old.name != ".git":
                shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
        for new in Path(tmp).iterdir():
            shutil.move(str(new), dest / new.name)
    return notes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dest", type=Path, help="the folder of the student edition (new, empty, or an earlier edition)")
    parser.add_argument("--answers", action="append", default=[], metavar="NN_name",
                        help="a chapter whose answers are released (repeatable); the other chapters' are withheld")
    parser.add_argument("--chapters", action="append", default=None, metavar="NN_name",
                        help="a chapter the edition opens (repeatable; default: every chapter whose prerequisites' "
                             "answers are released, so with no --answers only chapter 1); refused when a "
                             "prerequisite's answers are withheld")


def run(args: argparse.Namespace) -> int:
    try:
        notes = publish(args.dest, args.answers, chapters=args.chapters)
    except PublishError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"  {note}")
    released = ", ".join(args.answers) if args.answers else "none"
    opened = json.loads((Path(args.dest) / MARKER).read_text())["chapters"]
    print(f"student edition written to {args.dest} (chapters open: {', '.join(opened)}; answers released: "
          f"{released}); commit and push it for your learners")
    return 0
