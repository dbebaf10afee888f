"""Grade one notebook: read it, run the learner's cells in the sandboxed kernel, judge every exercise.

This module runs in the verdict process, where no learner code ever runs. Its steps,
in order (each a function below):

1. :func:`read_notebook` — the bytes become a notebook, or every exercise is ``invalid``
   with a reason that quotes nothing from the file;
2. :class:`Code` and :func:`cells_to_run` — every code cell parsed once (a notebook with
   more than :data:`MAX_CODE_BYTES` of code is ``invalid``), and the learner's cells to run,
   without the release's own test cells and untouched demos;
3. :func:`static_flags` — the static no-delegation pass (:mod:`autograder.checks.honesty`),
   on the cells already parsed;
4. :class:`Session` — the sandboxed kernel: start it, run the cells, restart it after a
   cell or check that killed it (that cell is then skipped), give up only at the
   notebook's deadline (which runs from step 1) or when the kernel cannot start at all;
5. :func:`judge` — every exercise through the one case-and-seed loop
   (:func:`autograder.checks.core.judge_check`) with a probe that runs in the kernel and
   inputs built here from fresh random seeds; outputs are read with
   :mod:`autograder.wire` (never unpickled) and judged here.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import re
import secrets
import time
import warnings
from pathlib import Path

import nbformat

from autograder import limits as caps
from autograder import protocol, registry, results, sandbox, status, wire
from autograder.checks import core, honesty


# --- 1. read ---------------------------------------------------------------------------


class NotANotebook(ValueError):
    """The file is not a notebook; the message never quotes the file's content."""


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')


def read_notebook(data: bytes, warned: list | None = None) -> nbformat.NotebookNode:
    """The notebook in ``data``; :class:`NotANotebook` (quoting nothing of the file) otherwise.

    Its size in JSON containers and in cells is checked on the raw bytes, before it is parsed: a small file of
    millions of empty objects would take gigabytes once parsed. nbformat's warnings (e.g. duplicate cell ids)
    are counted into ``warned``, never printed one by one.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise NotANotebook(f"the file is not UTF-8 text (byte {err.start})") from None
    containers = _STRINGS.sub(b"", data).translate(None, b"]}\" \t\r\n,:0123456789.-+eEtrufalsn")
    if len(containers) > caps.MAX_JSON_CONTAINERS:
        raise NotANotebook(f"the file holds {len(containers)} JSON objects and arrays, more than the "
                           f"{caps.MAX_JSON_CONTAINERS} a notebook this grader reads may hold")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise NotANotebook(f"the file is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    except RecursionError:
        raise NotANotebook("the file is JSON nested too deeply to be a notebook") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        raise NotANotebook("the file is JSON but not a notebook (no list of cells)")
    if len(raw["cells"]) > caps.MAX_CELLS:
        raise NotANotebook(f"the notebook has {len(raw['cells'])} cells, more than the {caps.MAX_CELLS} this grader "
                           "reads")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            nb = nbformat.reads(text, as_version=4)
            nbformat.validate(nb)
        except RecursionError:
            raise NotANotebook("the file is JSON nested too deeply to be a notebook") from None
        except Exception as err:  # noqa: BLE001 — nbformat's messages quote the content: say only where
            where = "/".join(str(p) for p in list(getattr(err, "absolute_path", []) or [])[:6])
            raise NotANotebook("the file is JSON but not a valid notebook (nbformat 4)"
                               + (f"; the problem is at {where}" if where else "")) from None
    if warned is not None:
        warned.extend(getattr(w.category, "__name__", "Warning") for w in caught)
    return nb


# --- 2. which cells run --------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def release_cells(release_path: str) -> dict[str, bool]:
    """Source of each code cell of the release (not solution cells) -> whether it is a test cell."""
    cells = {}
    path = Path(release_path)
    if not path.is_file():
        return cells
    for cell in nbformat.read(path, as_version=4).cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and not meta.get("solution"):
            cells[cell.source] = bool(meta.get("grade"))
    return cells


def _code_cells(nb) -> list[tuple[int, str]]:
    return [(i, c.source) for i, c in enumerate(nb.cells)
            if c.get("cell_type") == "code" and isinstance(c.get("source"), str)]


class Code:
    """The notebook's code cells, each parsed once (:class:`honesty.Code`), by cell index."""

    def __init__(self, nb):
        self.cells = _code_cells(nb)
        self.static = honesty.Code([src for _, src in self.cells])
        self.facts = {i: facts for (i, _), facts in zip(self.cells, self.static.facts)}

    def parsed(self, i: int) -> bool:
        return self.facts.get(i) is not None


_WORD = re.compile(r"\w+")  # every identifier (Unicode ones too), and more


def cells_to_run(code: Code, release: dict[str, bool]) -> list[tuple[int, str]]:
    """The learner's code cells that are run: all but release test cells and untouched release demos.

    An untouched demo is run when it defines a function or class, uses a magic, or binds (by import or
    assignment) a name that a cell which runs mentions anywhere (a word of its text: code, string or comment),
    counting the demos this rule runs. So an import only the demos need (chapter 1's ``causal_lower_right``,
    whose module imports torch's compiler, 2 s a kernel) costs nothing when no answer mentions it."""
    run: list[tuple[int, str]] = []
    imports: dict[int, tuple[str, set[str]]] = {}  # untouched demos that import: cell -> (source, names bound)
    for i, src in code.cells:
        if src in release:
            if release[src]:
                continue  # an unchanged test cell: verdicts never come from the notebook's own tests
            facts = code.facts[i]
            if facts is not None and "%" not in src and not any(
                    isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in facts.tree.body):
                if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in facts.tree.body):
                    imports[i] = (src, facts.top)
                continue  # an unchanged demo: nothing a graded exercise can depend on
        run.append((i, src))
    mentioned: set[str] = set()
    new = run
    while new and imports:
        for _, src in new:
            mentioned.update(_WORD.findall(src))
        new = [(i, src) for i, (src, names) in imports.items() if names & mentioned]
        for i, _ in new:
            del imports[i]
        run += new
    return sorted(run)


def syntax_errors(cells: list[tuple[int, str]], code: Code) -> dict[int, str]:
    """Cell index -> "line L: message" for every cell Python cannot parse."""
    found = {}
    for i, src in cells:
        if not code.parsed(i):
            lines = [("pass  # " + line) if line.lstrip().startswith(("%", "!")) else line for line in src.splitlines()]
            try:
                compile("\n".join(lines), f"cell {i}", "exec", dont_inherit=True)
                found[i] = "cannot be parsed"
            except SyntaxError as err:
                found[i] = f"line {err.lineno}: {err.msg}"
            except (ValueError, RecursionError, MemoryError) as err:
                found[i] = type(err).__name__
    return found


# --- 3. static flags -------------------------------------------------------------------


MAX_CODE_BYTES = caps.MAX_CODE_BYTES


def static_flags(chapter: registry.Chapter, code: Code) -> dict[str, str | None]:
    """Exercise -> why its code delegates (None when it does not); every cell already parsed once."""
    checks = chapter.load_checks()
    return {ex.name: code.static.delegation(ex.target, checks[ex.name].forbidden, chapter.answers)
            for ex in chapter.exercises}


def owners(chapter: registry.Chapter, cells: list[tuple[int, str]], code: Code) -> dict[str, int]:
    """Exercise -> the first run cell that defines it."""
    found: dict[str, int] = {}
    for i, _ in cells:
        facts = code.facts[i]
        for ex in chapter.exercises:
            if facts is not None and ex.target in facts.top:
                found.setdefault(ex.name, i)
    return found


# --- 4. the kernel ---------------------------------------------------------------------


class Session:
    """The learner's cells in one sandboxed kernel, restarted without the cell that killed it."""

    def __init__(self, runner: sandbox.Runner, cells: list[tuple[int, str]], limits: sandbox.Limits,
                 deadline: float):
        self.runner, self.cells, self.limits = runner, cells, limits
        self.deadline = deadline  # time.monotonic() past which the notebook is stopped
        self.killed: dict[int, sandbox.RunnerDied] = {}  # cell index -> what stopped it
        self.errors: dict[int, tuple[str, str]] = {}  # cell index -> (kind, message) of a cell that raised
        self.dead: sandbox.RunnerDied | None = None  # set when the notebook cannot go on

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def out_of_time(self) -> sandbox.RunnerDied:
        return sandbox.RunnerDied(protocol.Died.TIMEOUT, f"the notebook ran longer than its {self.limits.notebook_seconds:g} s limit")

    def boot(self) -> None:
        """Start the kernel and run every cell that did not kill it before; sets ``dead`` on failure."""
        while self.dead is None:
            if self.time_left() <= 0:
                self.dead = self.out_of_time()
                return
            try:
                self.runner.start()
            except sandbox.RunnerDied as died:
                self.dead = died  # a kernel that cannot start will not start on a retry either
                return
            if self._run_cells():
                return

    def _run_cells(self) -> bool:
        """Run the cells in order; False when one killed the kernel (recorded, so the next boot skips it)."""
        for i, src in self.cells:
            if i in self.killed:
                continue
            left = self.time_left()
            if left <= 0:
                self.dead = self.out_of_time()
                return True
            try:
                answer = self.runner.request({"op": protocol.Op.CELL, "source": src}, min(self.limits.cell_seconds, left))
                if answer.get("ok") is False:
                    kind = protocol.Failed.MEMORY if protocol.failed(answer.get("kind")) == protocol.Failed.MEMORY \
                        else protocol.Failed.RAISED
                    self.errors[i] = (kind, str(answer.get("error", ""))[: caps.ERROR_CHARS])
                else:
                    self.errors.pop(i, None)
            except sandbox.RunnerDied as died:
                if self.time_left() <= 0:
                    self.dead = self.out_of_time()
                    return True
                self.killed[i] = died
                return False
        return True

    def probe(self, exercise: registry.Exercise, forbidden: tuple[str, ...], answer_files: tuple[str, ...]) -> core.Probe:
        """A probe for :func:`core.judge_check` that calls the learner's object in the kernel."""

        def call(case: core.Case, inputs: dict) -> core.ProbeResult:
            if self.dead is not None:
                raise core.ProbeError(protocol.status_of_death(self.dead.kind), str(self.dead))
            left = self.time_left()
            if left <= 0:
                raise core.ProbeError(status.TIMEOUT, str(self.out_of_time()))
            try:
                encoded = wire.encode_value(inputs)
                pid = self.runner.host_pid() if case.memory else None
                before = core.peak_reset(pid) if pid is not None else None  # measured from here: out of its reach
                answer = self.runner.request(
                    {"op": protocol.Op.PROBE, "target": exercise.target, "probe": case.probe, "inputs": encoded,
                     "forbidden": list(forbidden), "answer_files": list(answer_files)},
                    min(self.limits.cell_seconds, left))
                peak = core.peak_growth(pid, before) if pid is not None else None
            except sandbox.RunnerDied as died:
                self.boot()  # the next exercises get a live kernel
                raise core.ProbeError(protocol.status_of_death(died.kind), str(died)) from None
            return dataclasses.replace(core.result_from_answer(answer), peak=peak)

        return call


# --- 5. judge ----------------------------------------------------------------------------


def fresh_seeds(level: str):
    """The grader's seeds: 0 for the visible level (as the notebook), else ``case.seeds`` (three) fresh random ones
    per case."""
    if level == "visible":
        return lambda case: [0]
    return lambda case: [secrets.randbits(62) for _ in range(case.seeds)]


def judge(chapter: registry.Chapter, session: Session, flags: dict[str, str | None],
          owners: dict[str, int], syntax: dict[int, str], level: str) -> list[dict]:
    checks = chapter.load_checks()
    answer_files = chapter.answer_files()
    rows = []
    for ex in chapter.exercises:
        cell = owners.get(ex.name)
        if cell is not None and cell in session.killed:
            died = session.killed[cell]
            rows.append(results.row(ex, protocol.status_of_death(died.kind),
                            f"the cell that defines it was stopped: {died}"))
            continue
        if flags.get(ex.name):
            rows.append(results.row(ex, status.FLAGGED, f"not accepted: your code {flags[ex.name]}"))
            continue
        verdict = core.judge_check(checks[ex.name], session.probe(ex, checks[ex.name].forbidden, answer_files),
                                   fresh_seeds(level), level=level)
        if verdict.status == status.MISSING and "is not defined" in verdict.reason:
            verdict = _why_not_defined(ex, verdict, cell, session, syntax)
        rows.append(results.row(ex, verdict.status, verdict.reason))
    return rows


def _why_not_defined(ex: registry.Exercise, verdict: core.Verdict, cell: int | None, session: Session,
                     syntax: dict[int, str]) -> core.Verdict:
    """A clearer verdict than "not defined" when the cell that should define it failed."""
    if syntax and (cell is None or cell in syntax):
        cell_index, message = _syntax_error_for(ex.target, syntax, session.cells)
        return core.Verdict(status.ERROR, f"cell {cell_index} has a syntax error ({message}), so "
                                          f"{ex.target} was never defined")
    if cell is not None and cell in session.errors:
        kind, message = session.errors[cell]
        earlier = [c for c in session.errors if c < cell]
        if earlier and message.startswith("NameError"):  # a name an earlier failing cell should have defined
            first = min(earlier)
            first_kind, first_message = session.errors[first]
            if first_kind == protocol.Failed.MEMORY:
                return core.Verdict(status.MEMORY, f"cell {first} ran out of memory ({first_message}), so the cell "
                                                   f"that defines {ex.target} failed too ({message})")
            return core.Verdict(status.ERROR, f"cell {first} raised {first_message}, so the cell that defines "
                                              f"{ex.target} failed too ({message})")
        if kind == protocol.Failed.MEMORY:
            return core.Verdict(status.MEMORY, f"the cell that defines {ex.target} ran out of memory ({message})")
        return core.Verdict(status.ERROR, f"the cell that defines {ex.target} raised {message}")
    return verdict


def _syntax_error_for(target: str, syntax: dict[int, str], cells: list[tuple[int, str]]) -> tuple[int, str]:
    sources = dict(cells)
    for i, message in syntax.items():
        if f"def {target}" in sources.get(i, "") or f"class {target}" in sources.get(i, ""):
            return i, message
    first = min(syntax)
    return first, syntax[first]


# --- all steps -------------------------------------------------------------------------


def preloads(chapter: registry.Chapter, cells) -> tuple[str, ...]:
    """The packages of ``runner.NATIVE_LIBRARIES`` that the cells to run or the chapter's checks name."""
    from autograder.runner import NATIVE_LIBRARIES

    checks = chapter.checks_file()
    texts = [src for _, src in cells] + ([Path(checks).read_text(errors="replace")] if checks else [])
    return tuple(name for name in NATIVE_LIBRARIES if any(name in text for text in texts))


def grade_notebook(data: bytes, chapter: registry.Chapter, *, level: str = "hidden",
                   limits: sandbox.Limits = sandbox.Limits(), hide: list[Path] = (),
                   isolation: str | None = None, unprivileged: bool = True,
                   course_dir: Path = registry.COURSE_DIR, timing: dict | None = None) -> list[dict]:
    """Rows (exercise, points, max_points, status, reason) of every exercise of ``chapter`` for ``data``.

    The notebook's time limit starts here, before the static pass. ``timing``, when given, gets
    ``static_cpu_seconds``: the CPU time of the static pass.
    """
    deadline = time.monotonic() + limits.notebook_seconds
    warned: list = []
    try:
        nb = read_notebook(data, warned)
    except NotANotebook as err:
        return results.rows_for_all(chapter, status.INVALID, f"the notebook could not be read: {err}")
    code_bytes = sum(len(src.encode("utf-8", "surrogatepass")) for _, src in _code_cells(nb))
    if code_bytes > MAX_CODE_BYTES:
        return results.rows_for_all(chapter, status.INVALID, f"the notebook's code cells hold {code_bytes} bytes of code, more "
                                                     f"than the {MAX_CODE_BYTES} bytes the grader reads")
    if timing is not None and warned:
        timing["nbformat_warnings"] = len(warned)
    started = time.process_time()
    code = Code(nb)
    cells = cells_to_run(code, release_cells(str(chapter.release_path(course_dir))))
    flags = static_flags(chapter, code)
    if timing is not None:
        timing["static_cpu_seconds"] = time.process_time() - started
    runner = sandbox.Runner(limits, hide=list(hide) + sandbox.hidden_paths(chapter), unprivileged=unprivileged,
                            preload=preloads(chapter, cells), **({"level": isolation} if isolation else {}))
    session = Session(runner, cells, limits, deadline)
    try:
        session.boot()
        if session.dead is not None and session.dead.kind == protocol.Died.START:
            return results.rows_for_all(chapter, status.CRASHED, str(session.dead))
        return judge(chapter, session, flags, owners(chapter, cells, code), syntax_errors(cells, code), level)
    finally:
        runner.close()
