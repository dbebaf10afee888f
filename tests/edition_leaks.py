"""Print, as JSON, where a student edition's checks compute the answer of an exercise it withholds.

    python tests/edition_leaks.py ORIGINAL EXERCISES_JSON

Run with the student edition first on ``PYTHONPATH`` (loading as tests/visible_verdicts.py, which this
shares): the reference answers and the mutants come from ``ORIGINAL`` (this repository), the checks from
the edition. For every visible case (seed 0) of every exercise whose answer the edition withholds:

1. the case's inputs are built and its judge run on the outputs of the reference answer and of each of the
   exercise's planted mistakes (so that the hint paths run too);
2. every private function of the edition's checks module that is not a ``@core.recorded`` stub is called
   with the case's inputs as ``f(*args, **kwargs)``, ``f(*args)`` and ``f(inputs)`` (parameters left
   without a value get None), so that a helper which computes the answer with its default arguments, but is
   only called with a mistake's arguments, is found too.

Meanwhile a :class:`Provenance` mode labels every tensor made:

* ``O``: the learner's outputs and what is computed from them (judging them is the checks' job);
* ``P``: made by PyTorch's own code (an ``nn.Module``, torchvision, one of :data:`REFERENCE_OPS` called
  by the checks: independent references are allowed);
* ``C``: computed by a chapter's checks module (and einops called from there; not the shared machinery of
  core.py) from the case inputs and constants, whatever else it also used;
* ``R``: a recorded reference result, and what the checks compute from recorded results alone (the
  edition's data, not code); likewise P from PyTorch's results alone.

A ``C`` tensor that ends up equal to the reference's output of the case (of the same kind: bool and
integer tensors equal, float tensors allclose; constant tensors, and outputs that are one of the inputs
handed back, are ignored; a number that is not whole is compared with float tensors of one element) is a
leak: that code holds the answer. Printed as
``{"leaks": {"<checks module>:<exercise>:<case>": ["<function> (line <n> in the edition)", ...]},
"cases": n}``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# PyTorch's own implementations that the checks may call as independent references.
REFERENCE_OPS = frozenset({"scaled_dot_product_attention", "softmax", "log_softmax", "multi_head_attention_forward",
                           "cross_entropy", "nll_loss", "layer_norm", "conv2d"})
TORCH_DIR = str(Path(torch.__file__).parent)


def _leaves(value: Any, kind: type) -> list:
    if isinstance(value, kind) and not isinstance(value, bool):
        return [value]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v, kind)]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v, kind)]
    return []


def _answers(outputs: Any, inputs: Any) -> list[torch.Tensor]:
    """What a reference output holds worth comparing: tensors of more than one element, not all equal, that are
    not one of the inputs handed back, and numbers that are not whole (as 0-dim float64 tensors), in a float or
    a float tensor of one element."""
    tensors = [t.detach() for t in _leaves(outputs, torch.Tensor)]
    given = _leaves(inputs, torch.Tensor)
    numbers = _leaves(outputs, float) + [t.item() for t in tensors if t.numel() == 1 and t.is_floating_point()]
    found = [t for t in tensors if t.numel() > 1 and not (t.flatten() == t.flatten()[0]).all()
             and not any(_equal(g, t) for g in given)]
    return found + [torch.tensor(f, dtype=torch.float64) for f in numbers if f == f and f != round(f)]


def _equal(t: torch.Tensor, answer: torch.Tensor) -> bool:
    if t.is_meta or t.is_complex() or t.is_sparse:
        return False
    if answer.dim() == 0:  # a number: the same to 1e-6, in a float tensor of one element
        return t.numel() == 1 and t.is_floating_point() and abs(t.detach().double().item() - answer.item()) <= (
            1e-6 * abs(answer.item()))
    if t.shape != answer.shape or t.dtype.is_floating_point != answer.dtype.is_floating_point or (
            (t.dtype == torch.bool) != (answer.dtype == torch.bool)):
        return False
    if not answer.dtype.is_floating_point:
        return torch.equal(t.detach().to(answer.dtype), answer)
    return torch.allclose(t.detach().double(), answer.double(), rtol=1e-4, atol=1e-5)


class Provenance(TorchFunctionMode):
    """Labels tensors O, R, P or C (see the module docstring); :meth:`leaks` says where a C tensor equal to an
    answer was made."""

    def __init__(self, own_files: set[str], own_dirs: tuple[str, ...]):
        super().__init__()
        self.own_files, self.own_dirs = own_files, own_dirs
        self.labels: dict[int, str] = {}
        self.sites: dict[int, str] = {}  # where each C tensor was made
        self.alive: list[torch.Tensor] = []  # keeps ids unique while a case runs

    def start(self, recorded: list[torch.Tensor]) -> None:
        self.labels, self.sites, self.alive = {}, {}, []
        self.tag(recorded, "R")

    def tag(self, value: Any, label: str, site: str = "") -> None:
        for t in _leaves(value, torch.Tensor):
            self.labels[id(t)] = label
            if label == "C":
                self.sites.setdefault(id(t), site)
            self.alive.append(t)

    def leaks(self, answers: list[torch.Tensor], extra: Any = None) -> set[str]:
        """Where the C tensors made since :meth:`start` (and those in ``extra``) that equal an answer were made."""
        made = [t for t in self.alive + _leaves(extra, torch.Tensor) if self.labels.get(id(t)) == "C"]
        return {self.sites[id(t)] for t in made if any(_equal(t, answer) for answer in answers)}

    @staticmethod
    def _caller(frame: Any, func: Any) -> Any:
        """The frame that called ``func``, from the one that triggered the mode: not torch's dispatch, nor the
        Python wrapper of ``func`` itself (``Tensor.split``, ``F.cross_entropy``...)."""
        name = getattr(func, "__name__", "")
        while frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR) and (
                frame.f_code.co_filename.endswith("overrides.py") or frame.f_code.co_name == name):
            frame = frame.f_back
        return frame

    def _label(self, caller: Any, func: Any, args: tuple, kwargs: dict) -> str:
        tags = {self.labels.get(id(t)) for t in _leaves((args, kwargs), torch.Tensor)} - {None}
        if "O" in tags:
            return "O"
        path = caller.f_code.co_filename if caller is not None else ""
        own = path in self.own_files or path.startswith(self.own_dirs)
        if not own or getattr(func, "__name__", "") in REFERENCE_OPS:
            return "P"
        if "C" in tags or not tags:
            return "C"
        return "R" if "R" in tags else "P"

    def _where(self, caller: Any) -> str:
        while caller is not None and caller.f_code.co_filename not in self.own_files:
            caller = caller.f_back  # from einops back to the checks
        return f"{caller.f_code.co_name} (line {caller.f_lineno} in the edition)" if caller is not None else "?"

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        caller = self._caller(sys._getframe(1), func)
        label = self._label(caller, func, args, kwargs)
        name = getattr(func, "__name__", "")
        site = self._where(caller) if label == "C" else ""
        if args and (name.endswith("_") or name.startswith("__i") or name == "__setitem__"):
            self.tag(args[0], label, site)  # changed in place: it now holds what the operation made
        self.tag(result, label, site)
        return result


def _withheld(module: str, core: Any) -> bool:
    try:
        importlib.import_module(module)
    except ImportError as err:
        return core.WITHHELD_MARK in str(err)
    return False


def _inputs(case: Any) -> dict:
    return case.inputs(torch.Generator().manual_seed(0))


def _outputs(core: Any, obj: Any, check: Any, case: Any) -> Any:
    """``obj``'s outputs on the case's inputs (seed 0, as the notebook), or None when the probe gave none."""
    try:
        return core.local_probe(obj, check.forbidden)(case, _inputs(case)).outputs
    except core.ProbeError:
        return None


def _judged(mode: Provenance, case: Any, answers: list, recorded: list, outputs: Any) -> set[str]:
    """Build the case's inputs and judge ``outputs`` under ``mode``; where a C tensor equal to an answer was made."""
    mode.start(recorded)
    with mode:
        inputs = _inputs(case)
    mode.tag(outputs, "O")
    with mode:
        try:
            case.judge(inputs, outputs)
        except Exception:  # noqa: BLE001 — a mistake fails its judge: that is the hint path we wanted to run
            pass
    return mode.leaks(answers)


def _called(mode: Provenance, module: Any, case: Any, answers: list, recorded: list) -> set[str]:
    """Call each private function of ``module`` that is not a recorded stub with the case's inputs."""
    found = set()
    for name, fn in sorted(vars(module).items()):
        if (not inspect.isfunction(fn) or fn.__module__ != module.__name__ or not name.startswith("_")
                or getattr(fn, "recorded", False)):
            continue
        for shape in range(3):
            inputs = _inputs(case)
            args, kwargs = tuple(inputs.get("args", ())), dict(inputs.get("kwargs", {}))
            args, kwargs = [(args, kwargs), (args, {}), ((inputs,), {})][shape]
            try:
                bound = inspect.signature(fn).bind_partial(*args, **kwargs)
            except TypeError:
                continue
            for p in inspect.signature(fn).parameters.values():
                if p.name not in bound.arguments and p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                                                          p.KEYWORD_ONLY):
                    bound.arguments[p.name] = None
            mode.start(recorded)
            result = None
            with mode, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    result = fn(*bound.args, **bound.kwargs)
                except Exception:  # noqa: BLE001 — most functions do not take these arguments
                    pass
            found |= {f"{name} (called with the case's inputs; made at {site})" for site in mode.leaks(answers, result)}
    return found


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from visible_verdicts import _load_originals

    original, exercises = Path(sys.argv[1]), [tuple(e) for e in json.loads(sys.argv[2])]
    answers, mutants = _load_originals(original, exercises)
    from autograder.checks import core

    torch.set_num_threads(1)
    import einops

    own = {str(Path(importlib.import_module(c).__file__)) for c in {e[0] for e in exercises}}
    mode = Provenance(own, (str(Path(einops.__file__).parent),))
    leaks, cases = {}, 0
    for (checks, name, reference_name), reference in zip(exercises, answers.values()):
        if not _withheld(reference_name.split(":")[0], core):
            continue  # this exercise's answer is released in the edition
        module, check = importlib.import_module(checks), importlib.import_module(checks).CHECKS[name]
        recorded = _leaves(list(core._recording(checks).values()), torch.Tensor)
        planted = [m.obj for m in mutants.get(checks.rsplit(".", 1)[1] + "_mutants", []) if m.exercise == name]
        for case in check.visible:
            cases += 1
            expected = _answers(_outputs(core, reference, check, case), _inputs(case))
            found = _called(mode, module, case, expected, recorded)
            for obj in [reference, *planted]:
                outputs = _outputs(core, obj, check, case)
                if outputs is not None:
                    found |= _judged(mode, case, expected, recorded, outputs)
            if found:
                leaks[f"{checks}:{name}:{case.name}"] = sorted(found)
    print(json.dumps({"leaks": leaks, "cases": cases}))


if __name__ == "__main__":
    main()
