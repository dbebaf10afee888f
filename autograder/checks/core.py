"""The check protocol: every check is written once and used in four places.

A check is an :class:`Exercise` made of :class:`Case` s. Each case has three parts
that may run in different processes:

* ``inputs(gen)`` — *verdict side*: builds the inputs from a seeded generator.
* ``probe`` — *student side*: the name of a function in :mod:`autograder.checks.probes`
  that calls the learner's object on the inputs and returns its outputs. Probes
  import nothing from ``solutions``, so they can run where the reference is hidden.
* ``judge(inputs, outputs)`` — *verdict side*: compares with the reference and
  with properties; raises :class:`CheckFailed` with a hint naming the likely mistake.

In a notebook (visible tests, nbgrader hidden tests) and in pytest (reference
and mutants), :func:`run_exercise` runs all three in one process. The batch
grader runs ``inputs`` and ``judge`` in a process where no student code ever ran,
sends the inputs to the student's kernel with :func:`encode`, runs only the probe
there, and reads the outputs back with :func:`decode` — plain JSON and raw
bytes, never pickle.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


class CheckFailed(AssertionError):
    """A check failed; the message is the hint shown to the learner."""


@dataclass(frozen=True)
class Case:
    name: str  # what is being checked, in plain words ("rows sum to 1")
    inputs: Callable[[torch.Generator], dict[str, Any]]
    probe: str  # a function name in autograder.checks.probes
    judge: Callable[[dict[str, Any], dict[str, Any]], None]


@dataclass(frozen=True)
class Exercise:
    name: str  # the exercise id, also the nbgrader grade id prefix ("softmax")
    target: str  # the notebook global that is graded ("softmax", "MultiHeadAttention")
    points: int
    visible: tuple[Case, ...]
    hidden: tuple[Case, ...] = ()
    # Calling one of these (module path, attribute) while the learner's code
    # runs means the exercise was delegated, not solved: e.g. ("torch.nn.functional",
    # "scaled_dot_product_attention"). "solutions" modules are always forbidden
    # for the exercise's own chapter.
    forbidden: tuple[tuple[str, str], ...] = field(default=())


def fail(message: str) -> None:
    raise CheckFailed(message)


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


def seeds_for(level: str, seed: int) -> list[int]:
    return [seed] if level == "visible" else [seed, seed + 1, seed + 2]


def run_case(case: Case, obj: Any, seed: int) -> None:
    """Run one case in this process: inputs, probe, judge."""
    from autograder.checks import probes

    gen = torch.Generator().manual_seed(seed)
    inputs = case.inputs(gen)
    outputs = getattr(probes, case.probe)(obj, decode(encode(inputs)))
    case.judge(inputs, outputs)


def run_exercise(exercise: Exercise, obj: Any, *, level: str = "visible", seed: int = 0, quiet: bool = False) -> None:
    """Check ``obj`` (the learner's function or class); raise CheckFailed on the first failing case.

    ``level="visible"`` runs the visible cases with one seed; ``"hidden"`` runs the
    visible and hidden cases with several seeds.
    """
    if level not in ("visible", "hidden"):
        raise ValueError(f"level must be 'visible' or 'hidden'; got {level!r}")
    cases = exercise.visible if level == "visible" else exercise.visible + exercise.hidden
    for case in cases:
        for s in seeds_for(level, seed):
            try:
                run_case(case, obj, s)
            except CheckFailed as err:
                raise CheckFailed(f"{exercise.name}: {case.name}: {err}") from None
            except NotImplementedError:
                raise
            except Exception as err:  # the learner's code raised: report it as a failure with its type
                raise CheckFailed(f"{exercise.name}: {case.name}: your code raised {type(err).__name__}: {err}") from err
    if not quiet:
        print(f"✓ {exercise.name}: all {len(cases)} {level} checks passed")


# --- safe transport between processes: JSON + raw tensor bytes, no pickle ---

_DTYPES = {str(t).removeprefix("torch."): t for t in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
)}


def _to_json(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        name = str(t.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            raise TypeError(f"cannot send tensors of dtype {t.dtype}")
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {"__tensor__": name, "shape": list(t.shape), "data": base64.b64encode(raw).decode("ascii")}
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return {"__float__": repr(obj)}  # keeps nan and inf
    if isinstance(obj, (list, tuple)):
        return {"__list__": [_to_json(x) for x in obj], "tuple": isinstance(obj, tuple)}
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError("only dicts with str keys can be sent")
        return {"__dict__": {k: _to_json(v) for k, v in obj.items()}}
    raise TypeError(f"cannot send a {type(obj).__name__}")


def _from_json(obj: Any) -> Any:
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if not isinstance(obj, dict):
        raise ValueError("malformed payload")
    if "__tensor__" in obj:
        dtype = _DTYPES.get(obj["__tensor__"])
        shape = obj["shape"]
        if dtype is None or not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ValueError("malformed tensor in payload")
        raw = bytearray(base64.b64decode(obj["data"], validate=True))
        count = math.prod(shape)
        if len(raw) != count * torch.empty((), dtype=dtype).element_size():
            raise ValueError("tensor data does not match its shape and dtype")
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape).clone()
    if "__float__" in obj:
        return float(obj["__float__"])
    if "__list__" in obj:
        items = [_from_json(x) for x in obj["__list__"]]
        return tuple(items) if obj.get("tuple") else items
    if "__dict__" in obj:
        return {str(k): _from_json(v) for k, v in obj["__dict__"].items()}
    raise ValueError("malformed payload")


def encode(obj: Any) -> str:
    """A JSON string for tensors, numbers, strings, None, lists, tuples and str-keyed dicts."""
    return json.dumps(_to_json(obj))


def decode(text: str | bytes) -> Any:
    """The inverse of :func:`encode`; raises ValueError on anything malformed. Never unpickles."""
    try:
        return _from_json(json.loads(text))
    except (json.JSONDecodeError, TypeError, KeyError, base64.binascii.Error) as err:
        raise ValueError(f"malformed payload: {err}") from None
