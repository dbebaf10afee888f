"""The check protocol: every check is written once and used in four places.

A :class:`Check` (one per exercise, in ``autograder/checks/<module>.py``'s ``CHECKS``)
is made of :class:`Case` s. Each case has three parts that may run in different processes:

* ``inputs(gen)`` — *verdict side*: builds the inputs from a seeded generator.
* ``probe`` — *student side*: the name of a function in :mod:`autograder.checks.probes`
  that calls the learner's object on the inputs and returns its outputs. Probes
  import nothing from ``solutions``, so they can run where the reference is hidden.
* ``judge(inputs, outputs)`` — *verdict side*: compares with the reference and
  with properties; raises :class:`CheckFailed` with a hint naming the likely mistake.

:func:`judge_check` is the one case-and-seed loop. The notebook checks (visible
test cells, nbgrader's hidden tests) and pytest run the probe in-process
(:func:`local_probe`); the batch grader runs it in the sandboxed kernel and hands the
loop a probe that talks to it. Either way the probe goes through
:func:`autograder.checks.probes.execute` (the no-delegation guard, the same encoding),
so a notebook, ``nbgrader autograde`` and ``autograder grade`` reach the same verdict.
Which exercises exist and what they are worth is not said here but in
:mod:`autograder.registry`.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import functools
import hashlib
import importlib
import inspect
import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from autograder import protocol, status, wire


class CheckFailed(AssertionError):
    """A check failed; the message is the hint shown to the learner. ``learners``: the parts of the message the
    learner's code wrote (quoted from its outputs or its exception), which a hidden case's reason leaves out."""

    def __init__(self, message: str = "", learners: Iterable[str] = ()):
        super().__init__(message)
        self.learners = tuple(learners)

    def _render_traceback_(self) -> list[str]:
        # IPython shows these lines instead of a traceback; nbgrader still records the cell as failed.
        return [f"\x1b[31m✗ {self}\x1b[0m"]


class NotDone(CheckFailed):
    """The exercise still raises NotImplementedError (or is not defined yet)."""


@dataclass(frozen=True)
class Case:
    name: str  # what is being checked, in plain words ("rows sum to 1")
    inputs: Callable[[torch.Generator], dict[str, Any]]
    probe: str  # a function name in autograder.checks.probes
    judge: Callable[[dict[str, Any], dict[str, Any]], None]
    # A bound on memory, whatever library the code uses: (bytes the call may add to the process's peak resident
    # memory, the hint when it adds more), measured from outside the learner's code (see peak_growth).
    memory: tuple[int, str] | None = None
    # Seeds at the hidden level (fresh ones in the grader): three, so that a lucky input passes no wrong answer;
    # one for a case whose property does not depend on the values drawn (a memory bound on a large input).
    seeds: int = 3


@dataclass(frozen=True)
class Check:
    name: str  # the exercise name, as in the registry ("softmax")
    visible: tuple[Case, ...]
    hidden: tuple[Case, ...] = ()
    # What the learner's code may not call for this exercise, because calling it is delegating
    # the exercise: PyTorch functions and operators (fnmatch patterns of their names, e.g.
    # "*softmax*"), and other libraries' functions by their dotted name
    # ("torchvision.models.vision_transformer.interpolate_embeddings"); the chapter's own library
    # modules are always forbidden.
    forbidden: tuple[str, ...] = field(default=())

    def cases(self, level: str) -> tuple[Case, ...]:
        if level not in ("visible", "hidden"):
            raise ValueError(f"level must be 'visible' or 'hidden'; got {level!r}")
        return self.visible if level == "visible" else self.visible + self.hidden


@dataclass(frozen=True)
class Verdict:
    status: str  # one of autograder.status.STATUSES
    reason: str = ""  # the hint, or why the code was stopped; "" when passed

    @property
    def passed(self) -> bool:
        return self.status == status.PASSED


class ProbeError(Exception):
    """The probe gave no outputs: the learner's code raised, or was stopped. ``status`` says which;
    ``learners`` is the part of the message the learner's code wrote (an exception's type and message)."""

    def __init__(self, status_: str, message: str, learners: str = ""):
        super().__init__(message)
        self.status = status_
        self.learners = learners


@dataclass(frozen=True)
class ProbeResult:
    outputs: dict[str, Any]
    inputs_after: Any  # the inputs as they were after the call
    violation: str | None = None
    peak: int | None = None  # bytes the call added to the process's peak resident memory (a memory case), if known


# --- peak memory, measured from outside the code that runs ------------------------------


def peak_reset(pid: int | str = "self") -> int | None:
    """Reset the peak resident memory of process ``pid`` (Linux: ``clear_refs``) and return its resident memory
    now, in bytes; None where that cannot be done."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return _status_kb(pid, "VmRSS") * 1024
    except (OSError, TypeError, ValueError):
        return None


def peak_growth(pid: int | str, before: int | None) -> int | None:
    """How far the peak resident memory of ``pid`` rose above ``before`` (from :func:`peak_reset`), in bytes."""
    if before is None:
        return None
    try:
        return max(0, _status_kb(pid, "VmHWM") * 1024 - before)
    except (OSError, TypeError, ValueError):
        return None


def _status_kb(pid: int | str, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise ValueError(field)


Probe = Callable[[Case, dict[str, Any]], ProbeResult]

NOT_DONE = "not done yet: replace `raise NotImplementedError()` with your code"


def fail(message: str, *learners: str) -> None:
    """Fail with ``message``; ``learners`` are the parts of it the learner's code wrote (see :class:`CheckFailed`)."""
    raise CheckFailed(message, learners)


def end_aligned_causal_mask(seq_q: int, seq_k: int) -> torch.Tensor:
    """(seq_q, seq_k) bool, True where query i may see key j: the queries are the last seq_q positions of the keys
    (j <= i + seq_k - seq_q). PyTorch's own ``causal_lower_right(seq_q, seq_k)._materialize()``
    (``torch.nn.attention.bias``), to which tests/test_checks_core.py compares it; that module is not imported
    here, since importing it imports ``torch._dynamo`` (about 900 modules, 2 s idle and 6 s busy) in every kernel
    that checks chapter 1 or 2."""
    return torch.ones(seq_q, seq_k, dtype=torch.bool).tril(seq_k - seq_q)


def expect_close(actual: Any, expected: torch.Tensor, hint: str, *, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """Fail with ``hint`` unless ``actual`` is a tensor equal to ``expected`` (shape, then values)."""
    if not isinstance(actual, torch.Tensor):
        fail(f"expected a torch.Tensor, got {type(actual).__name__}")
    if tuple(actual.shape) != tuple(expected.shape):
        fail(f"wrong shape: got {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if actual.dtype.is_floating_point and not torch.isfinite(actual).all() and torch.isfinite(expected).all():
        fail(f"your output contains NaN or inf. {hint}")
    if actual.dtype == torch.bool or expected.dtype == torch.bool:
        if actual.dtype != expected.dtype or not torch.equal(actual, expected):
            fail(hint)
        return
    if not torch.allclose(actual.to(expected.dtype), expected, atol=atol, rtol=rtol, equal_nan=True):
        diff = (actual.to(expected.dtype) - expected).abs().nan_to_num(math.inf).max().item()
        fail(f"{hint} (largest difference {diff:.3g})")


def rand_int(gen: torch.Generator, low: int, high: int) -> int:
    """A random int in [low, high], drawn from ``gen``."""
    return int(torch.randint(low, high + 1, (), generator=gen))


# How same() takes dtypes: "equal": the same dtype, and NaN matches NaN; "cast": any dtype, compared in the expected
# one's; "kind": as "cast", if both are floating point or neither is.
_SAME_DTYPES = ("equal", "cast", "kind")


def same(actual: Any, expected: torch.Tensor, atol: float = 1e-5, *, dtype: str = "equal") -> bool:
    """Whether ``actual`` is a tensor of ``expected``'s shape and values (rtol 1e-4), its dtype as ``dtype`` says."""
    if dtype not in _SAME_DTYPES:
        raise ValueError(f"dtype must be one of {_SAME_DTYPES}; got {dtype!r}")
    if not isinstance(actual, torch.Tensor) or tuple(actual.shape) != tuple(expected.shape):
        return False
    if dtype == "equal":
        return actual.dtype == expected.dtype and torch.allclose(actual, expected, atol=atol, rtol=1e-4,
                                                                 equal_nan=True)
    if dtype == "kind" and actual.is_floating_point() != expected.is_floating_point():
        return False
    return torch.allclose(actual.to(expected.dtype), expected, atol=atol, rtol=1e-4)


def expect(actual: Any, expected: torch.Tensor, hint: str, mistakes: Iterable[tuple[torch.Tensor, str]] = (),
           atol: float = 1e-5) -> None:
    """Like :func:`expect_close`, but first fails with the message of a known mistake whose output ``actual`` is."""
    if not same(actual, expected, atol):
        for wrong, message in mistakes:
            if same(actual, wrong, atol):
                fail(message)
    expect_close(actual, expected, hint, atol=atol)


def expect_value_error(error: dict[str, str] | None, what: str, *names: str, word: bool = True) -> None:
    """Fail unless ``error`` (a probe's: None when the call returned) is a ValueError whose message names one of
    ``names``, as a whole word or (``word=False``) anywhere in it; with no names (the exercise's text asks for
    none), any ValueError will do. ``what`` (the bad call, or what is wrong) opens the hint."""
    listed = " or ".join(names)
    naming = f" naming {listed}" if names else ""
    if error is None:
        fail(f"{what}: your code returned a result; check for this first and raise a ValueError{naming}")
    said = error["message"]
    if error["type"] != "ValueError":
        fail(f"{what}: the error must be a ValueError{naming}; your code raised {error['type']}: {said}",
             f"{error['type']}: {said}")
    if names and not any(re.search(rf"\b{re.escape(n)}\b", said) if word else n in said for n in names):
        fail(f"{what}: your ValueError should name {listed}, so that the caller knows what to change; it said "
             f"{said!r}", repr(said))


# --- the reference, or its recording in a student edition ------------------------
#
# A checks module imports its chapter's library module with :func:`reference` and computes
# everything that is an answer (with the reference, or by its own code: an expected mask,
# attention by hand) in functions of the case inputs only, marked :func:`recorded`, called
# on the pass path of the visible cases. In this repository they simply run. ``autograder
# publish`` runs every withheld chapter's visible cases (seed 0) with the reference under
# :func:`recording` and saves the results in ``autograder/checks/recorded/``; in the
# student edition, where the reference module raises ImportError, each marked function
# returns its recorded result instead (plain tensors and numbers, no code).

RECORDED_DIR = Path(__file__).resolve().parent / "recorded"
WITHHELD_MARK = "withheld in this student edition"
_recorder: dict[str, dict[str, Any]] | None = None
_recordings: dict[str, dict[str, Any]] = {}
TORCH_VERSION_KEY = "torch.__version__"  # in each recording: the PyTorch that made it


class ReferenceWithheld(CheckFailed):
    """The check needs a reference result that the student edition does not hold."""


class Withheld:
    """Stands in for a reference module the student edition withholds; using it directly is an error."""

    def __init__(self, module: str):
        self._module = module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise ReferenceWithheld(f"{self._module}.{name} is withheld in this student edition: this comparison "
                                "runs in your instructor's grading only")


def reference(module: str) -> Any:
    """The reference module ``module``, or a :class:`Withheld` stand-in where the student edition withholds it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if WITHHELD_MARK not in str(err):
            raise
        return Withheld(module)


def _canonical(value: Any, out: list[bytes]) -> None:
    """Append the canonical bytes of a call argument (tensors by dtype, shape and contents)."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        out.append(f"T{t.dtype}{tuple(t.shape)}".encode())
        out.append(_bits(t).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, dict):
        out.append(f"D{len(value)}".encode())
        for k, v in value.items():
            _canonical(k, out)
            _canonical(v, out)
    elif isinstance(value, (list, tuple)):
        out.append(f"{type(value).__name__[0]}{len(value)}".encode())
        for v in value:
            _canonical(v, out)
    elif value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.Size)):
        out.append(f"{type(value).__name__}:{value!r};".encode())
    else:
        raise TypeError(f"a recorded reference call takes plain data (tensors, numbers, strings, lists, dicts); "
                        f"got {type(value).__name__}")


def call_digest(name: str, args: tuple, kwargs: dict) -> str:
    parts: list[bytes] = [name.encode()]
    _canonical((args, kwargs), parts)
    return f"{name}:{hashlib.sha256(b'|'.join(parts)).hexdigest()[:32]}"


def _plain(value: Any) -> Any:
    """``value`` as plain data for the recording (tensors detached and cloned); TypeError for anything else."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.Size)):
        return value
    raise TypeError(f"a recorded reference result must be plain data; got {type(value).__name__}")


def recording_path(checks_module: str) -> Path:
    return RECORDED_DIR / f"{checks_module.rsplit('.', 1)[1]}.pt"


def _recording(checks_module: str) -> dict[str, Any]:
    if checks_module not in _recordings:
        path = recording_path(checks_module)
        _recordings[checks_module] = torch.load(path, weights_only=True) if path.is_file() else {}
    return _recordings[checks_module]


def recorded(fn: Callable) -> Callable:
    """Mark a checks-module function that computes an answer, with the reference or by itself, from case inputs
    only (plain data in, plain data out).

    With the reference importable it runs (and is recorded during :func:`recording`); in a student edition
    that withholds it, it returns the recorded result of the same call, or raises :class:`ReferenceWithheld`.
    """
    owner, name = fn.__module__, fn.__qualname__
    namespace = inspect.unwrap(fn).__globals__  # the checks module's (fn may be wrapped, e.g. by torch.no_grad)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        withheld = [v._module for v in namespace.values() if isinstance(v, Withheld)]
        if not withheld:
            value = fn(*args, **kwargs)
            if _recorder is not None:
                _recorder.setdefault(owner, {})[call_digest(name, args, kwargs)] = _plain(value)
            return value
        table = _recording(owner)
        key = call_digest(name, args, kwargs)
        if key not in table:
            recorded_with = table.get(TORCH_VERSION_KEY)
            why = (f" (the recording was made with PyTorch {recorded_with}, you have {torch.__version__}: inputs "
                   "may differ; use the course's PyTorch)" if recorded_with not in (None, str(torch.__version__)) else "")
            raise ReferenceWithheld(f"this comparison needs {withheld[0]}, which is withheld in this student "
                                    f"edition: it runs in your instructor's grading only{why}")
        return copy.deepcopy(table[key])

    call.recorded = True
    return call


def stacked(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Same-shaped tensors as their names and one stacked tensor, so that a recording holds one tensor per call."""
    return {"names": list(tensors), "values": torch.stack([t.to(dtype or t.dtype) for t in tensors.values()])}


def unstacked(table: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of :func:`stacked` by name."""
    return dict(zip(table["names"], table["values"]))


def recording(checks: Iterable[str], answers: Callable[[str], Any]) -> dict[str, dict[str, Any]]:
    """Run the visible cases (seed 0, as the notebook) of the checks modules ``checks`` with the reference
    answers (``answers(exercise) -> object``) and return every recorded call: checks module -> digest -> result."""
    global _recorder
    _recorder = {}
    try:
        for checks_module in checks:
            _recorder.setdefault(checks_module, {})
            for name, check in importlib.import_module(checks_module).CHECKS.items():
                verdict = judge_check(check, local_probe(answers(name), check.forbidden),
                                      notebook_seeds("visible", 0), level="visible")
                if not verdict.passed:
                    raise RuntimeError(f"{checks_module}:{name}: the reference fails its visible checks "
                                       f"({verdict.reason}); nothing was recorded")
        for table in _recorder.values():
            table[TORCH_VERSION_KEY] = str(torch.__version__)
        return _recorder
    finally:
        _recorder = None


# --- the answer of a probe, from whichever process ran it -------------------------


def result_from_answer(answer: Any) -> ProbeResult:
    """Read :func:`probes.execute`'s answer strictly; ProbeError when the probe gave no outputs."""
    if not isinstance(answer, dict) or not isinstance(answer.get(protocol.OK), bool):
        raise ProbeError(status.ERROR, "the kernel sent an answer the grader cannot read")
    violation = answer.get(protocol.VIOLATION)
    violation = violation if isinstance(violation, str) and violation else None
    if violation:
        raise ProbeError(status.FLAGGED, f"not accepted: your code {violation}")
    if not answer[protocol.OK]:
        kind = protocol.failed(answer.get(protocol.KIND))
        error = answer.get(protocol.ERROR) if isinstance(answer.get(protocol.ERROR), str) else ""
        found = protocol.FAILED_STATUS.get(kind, status.ERROR)
        if kind == protocol.Failed.NOT_IMPLEMENTED:
            raise ProbeError(found, NOT_DONE)
        if kind == protocol.Failed.MISSING:
            raise ProbeError(found, error or "not defined: run the cell that defines it")
        if kind == protocol.Failed.MEMORY:
            raise ProbeError(found, "ran out of memory")
        if kind == protocol.Failed.UNSENDABLE:
            raise ProbeError(found, f"your output cannot be checked: {error}", learners=error)
        raise ProbeError(found, f"your code raised {error}", learners=error)
    try:
        outputs = wire.decode_value(answer.get(protocol.OUTPUTS))
        inputs_after = wire.decode_value(answer.get(protocol.INPUTS_AFTER))
    except wire.ProtocolError as err:
        raise ProbeError(status.ERROR, f"unreadable outputs ({err})") from None
    if not isinstance(outputs, dict):
        raise ProbeError(status.ERROR, "unreadable outputs (the probe did not return a dict)")
    return ProbeResult(outputs, inputs_after)


def local_probe(obj: Any, forbidden: tuple[str, ...] = (), answer_files: tuple[str, ...] = ()) -> Probe:
    """A probe that calls ``obj`` in this process, through the same code as the grader's kernel."""
    from autograder.checks import probes

    def call(case: Case, inputs: dict[str, Any]) -> ProbeResult:
        encoded = wire.encode_value(inputs)
        before = peak_reset() if case.memory else None
        answer = probes.execute(obj, case.probe, encoded, forbidden, answer_files)
        return dataclasses.replace(result_from_answer(answer), peak=peak_growth("self", before))

    return call


# --- the one case-and-seed loop ---------------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` (so that NaN equals NaN and -0.0 differs from 0.0)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _grad(t: torch.Tensor) -> torch.Tensor | None:
    return t.grad if t.is_leaf else None


def changed_inputs(before: Any, after: Any, path: str = "") -> list[str]:
    """Where ``after`` differs from ``before``: ``args[0]`` (or ``kwargs['x']``...) when the values changed, else
    ``args[0].requires_grad`` or ``args[0].grad`` when the tensor's autograd state did."""
    if isinstance(before, torch.Tensor):
        where = path or "the input"
        if not (isinstance(after, torch.Tensor) and after.dtype == before.dtype and after.shape == before.shape
                and torch.equal(_bits(after), _bits(before))):
            return [where]
        grads = _grad(before), _grad(after)
        same_grad = grads[0] is None and grads[1] is None or (
            None not in grads and grads[0].shape == grads[1].shape and torch.equal(_bits(grads[0]), _bits(grads[1])))
        return ([f"{where}.requires_grad"] if after.requires_grad != before.requires_grad else []) + (
            [] if same_grad else [f"{where}.grad"])
    if isinstance(before, dict):
        if not isinstance(after, dict):
            return [path or "the input"]
        return [p for k in before for p in changed_inputs(before[k], after.get(k), f"{path}[{k!r}]" if path else k)]
    if isinstance(before, (list, tuple)):
        if not isinstance(after, (list, tuple)) or len(after) != len(before):
            return [path or "the input"]
        return [p for i, (b, a) in enumerate(zip(before, after)) for p in changed_inputs(b, a, f"{path}[{i}]")]
    return [] if before == after or (before != before and after != after) else [path or "the input"]


def changed_message(changed: list[str]) -> str:
    """The hint for inputs changed by the call (see :func:`changed_inputs`): their values first, then autograd."""
    kinds: dict[str, list[str]] = {"": [], ".requires_grad": [], ".grad": []}
    for p in changed:
        kind = next((k for k in (".requires_grad", ".grad") if p.endswith(k)), "")
        kinds[kind].append(_argument_name(p.removesuffix(kind)) if kind else _argument_name(p))
    values, flagged, graded = (", ".join(kinds[k][:3]) for k in ("", ".requires_grad", ".grad"))
    if values:
        return (f"your code changed its input ({values}) in place — the caller's tensor is corrupted. Use "
                "out-of-place operations (x = x * s, not x.mul_(s) or x *= s) or work on a copy")
    if flagged:
        return (f"your code switched on requires_grad of its input ({flagged}) — the caller's tensor now records "
                "every operation on it for autograd. Make your own leaf instead: w = w.detach().requires_grad_(True)")
    return (f"your code left a gradient in .grad of its input ({graded}) — the caller's tensor is changed, and its "
            "next backward() adds to it. Differentiate your own copy (w.detach().requires_grad_(True)) with "
            "torch.autograd.grad")


def _argument_name(path: str) -> str:
    """``args[0]`` -> "argument 1", ``kwargs['mask']`` -> "argument `mask`", else the path."""
    if path.startswith("args[") and path[5:].split("]")[0].isdigit():
        return f"argument {int(path[5:].split(']')[0]) + 1}"
    if path.startswith("kwargs[") and "]" in path:
        return f"argument `{path[7:].split(']')[0].strip(chr(39))}`"
    return path


def judge_check(check: Check, probe: Probe, seeds: Callable[[Case], Iterable[int]], *,
                level: str = "visible") -> Verdict:
    """Run every case of ``check`` (at ``level``) for every seed ``seeds(case)`` gives; the first failure decides.

    A failure on a hidden case is said without anything that could carry the case out (see :func:`hidden_reason`).
    """
    for case in check.cases(level):
        hidden = any(case is h for h in check.hidden)
        for seed in seeds(case):
            inputs = case.inputs(torch.Generator().manual_seed(seed))
            try:
                result = probe(case, inputs)
            except ProbeError as err:
                return _verdict(err.status, case, str(err), hidden, err.learners)
            changed = changed_inputs(inputs, result.inputs_after)
            if changed:
                return _verdict(status.FAILED, case, changed_message(changed), hidden)
            if case.memory is not None and result.peak is not None and result.peak > case.memory[0]:
                return _verdict(status.FAILED, case, f"{case.memory[1]} (your code held {result.peak / 2**20:.0f} MB "
                                f"more at its peak; the bound is {case.memory[0] / 2**20:.0f} MB)", hidden)
            try:
                case.judge(inputs, result.outputs)
            except CheckFailed as err:
                return _verdict(status.FAILED, case, str(err), hidden, *getattr(err, "learners", ()))
            except Exception as err:  # noqa: BLE001 — outputs the judge cannot read are a wrong answer
                return _verdict(status.FAILED, case, f"your output could not be checked ({type(err).__name__}: {err})",
                                hidden, str(err))
    return Verdict(status.PASSED)


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_BUILTIN_EXCEPTIONS = frozenset(name for name, value in vars(builtins).items()
                                if isinstance(value, type) and issubclass(value, BaseException))


def hidden_reason(case_name: str, message: str, learners: Iterable[str] = ()) -> str:
    """The reason of a failure on a hidden case: the case and the mistake, never a value from it.

    A hidden case's inputs must not reach the learner's feedback, and the learner's code could write them
    into anything it controls: so the text the learner's code wrote (an exception's message, a quoted value)
    is cut out, an exception is named only by a built-in class name, and every number becomes ``…``.
    """
    for text in sorted((t for t in learners if t), key=len, reverse=True):
        kind = text.split(":", 1)[0].strip()
        message = message.replace(text, kind if kind in _BUILTIN_EXCEPTIONS else "an exception")
    return f"{case_name} (a hidden case): " + _NUMBER.sub("…", message)


def _verdict(status_: str, case: Case, message: str, hidden: bool, *learners: str) -> Verdict:
    if hidden:
        return Verdict(status_, hidden_reason(case.name, message, learners))
    return Verdict(status_, f"{case.name}: {message}"[:400] if learners else f"{case.name}: {message}")


def notebook_seeds(level: str, seed: int) -> Callable[[Case], list[int]]:
    """Seeds of a notebook check: one for the visible cases, ``case.seeds`` (three) for the hidden ones."""
    return lambda case: [seed] if level == "visible" else [seed + i for i in range(case.seeds)]


def _static_flag(obj: Any, check: Check, answers: tuple[str, ...]) -> str | None:
    """The grader's static no-delegation pass, on the source of ``obj`` when Python can find it."""
    from autograder.checks import honesty

    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):  # e.g. a class defined in a notebook cell, or a builtin
        return None
    return honesty.delegation([textwrap.dedent(source)], getattr(obj, "__name__", check.name), check.forbidden,
                              answers)


def runner(checks_module: str) -> Callable[..., None]:
    """The ``run`` of a checks module (``run = core.runner(__name__)``): its notebook's entry point."""

    def run_exercise(name: str, obj: Any, *, level: str = "visible", seed: int = 0) -> None:
        """Check the learner's ``obj`` for exercise ``name``; raises CheckFailed with a hint when wrong."""
        run(checks_module, name, obj, level=level, seed=seed)

    run_exercise.__name__ = run_exercise.__qualname__ = "run"
    run_exercise.__module__ = checks_module
    return run_exercise


def run(checks_module: str, name: str, obj: Any, *, level: str = "visible", seed: int = 0, quiet: bool = False) -> None:
    """Check the learner's ``obj`` for exercise ``name`` of ``checks_module`` in this process.

    Raises :class:`NotDone` or :class:`CheckFailed` (one line in the notebook) unless every
    case passes; prints a ✓ line when it does. The exercise's forbidden names and the
    chapter's answer modules are enforced exactly as the batch grader does.
    """
    from autograder import registry

    checks = importlib.import_module(checks_module).CHECKS
    if name not in checks:
        raise ValueError(f"name must be one of {sorted(checks)}; got {name!r}")
    chapter = registry.chapter_of_checks(checks_module)
    check = checks[name]
    flagged = _static_flag(obj, check, chapter.answers)
    if flagged:
        raise CheckFailed(f"{name}: not accepted: your code {flagged}")
    verdict = judge_check(check, local_probe(obj, check.forbidden, chapter.answer_files()),
                          notebook_seeds(level, seed), level=level)
    if verdict.status == status.MISSING:
        raise NotDone(f"{name}: {verdict.reason}")
    if not verdict.passed:
        raise CheckFailed(f"{name}: {verdict.reason}")
    if not quiet:
        print(f"✓ {name}: all {len(check.cases(level))} {level} checks passed")

