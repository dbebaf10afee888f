"""Student-side probes: call the learner's object on given inputs and return its outputs.

These run inside the learner's kernel, so they import nothing from ``solutions``
and decide nothing: verdicts are the judges' job (see :mod:`autograder.checks.core`).
Every probe has the signature ``probe(obj, inputs: dict) -> dict`` of plain data
(tensors, numbers, strings, None, lists, dicts) that :func:`wire.encode_value` can send.

:func:`execute` is the one entry point, used both by the batch grader's kernel
(:mod:`autograder.runner`) and in-process by the notebook checks: it decodes the
inputs, calls the probe under the no-delegation :class:`~autograder.checks.guard.Guard`,
and answers with the encoded outputs and the inputs as they are *after* the call (so
that the verdict side can see a function that changed its inputs in place).
"""

from __future__ import annotations

from typing import Any

import torch

from autograder import wire
from autograder.checks.guard import Forbidden, Guard


def execute(obj: Any, probe: str, inputs: str, forbidden: tuple[str, ...] = (),
            answer_files: tuple[str, ...] = ()) -> dict:
    """Run probe ``probe`` on ``obj`` with the encoded ``inputs``; the answer message (never raises).

    ``{"ok": True, "outputs": str, "inputs_after": str, "violation": str | None}`` or
    ``{"ok": False, "kind": "not_implemented" | "memory" | "raised" | "unsendable",
    "error": str, "violation": str | None}``. The kind is decided here by identity with
    the real exception classes, never from a class name.
    """
    function = _PROBES.get(probe)
    if function is None:
        return {"ok": False, "kind": "raised", "error": f"unknown probe {probe!r}", "violation": None}
    guard = Guard(forbidden, answer_files)
    try:
        args = wire.decode_value(inputs)
        with guard:
            outputs = function(obj, args)
    except Forbidden:
        return {"ok": False, "kind": "raised", "error": "", "violation": guard.violation}
    except NotImplementedError:
        return {"ok": False, "kind": "not_implemented", "error": "", "violation": guard.violation}
    except MemoryError:
        return {"ok": False, "kind": "memory", "error": "MemoryError", "violation": guard.violation}
    except RecursionError as err:
        return {"ok": False, "kind": "raised", "error": f"RecursionError: {str(err)[:300]}", "violation": guard.violation}
    except RuntimeError as err:  # PyTorch's CPU allocator reports running out of memory as a RuntimeError
        kind = "memory" if "DefaultCPUAllocator: can't allocate memory" in _message(err) else "raised"
        return {"ok": False, "kind": kind, "error": f"{type(err).__name__}: {_message(err)}",
                "violation": guard.violation}
    except Exception as err:  # noqa: BLE001 — the learner's exception is reported to the verdict side
        return {"ok": False, "kind": "raised", "error": f"{type(err).__name__}: {_message(err)}",
                "violation": guard.violation}
    try:
        return {"ok": True, "outputs": wire.encode_value(outputs), "inputs_after": wire.encode_value(args),
                "violation": guard.violation}
    except (TypeError, ValueError, RecursionError) as err:
        return {"ok": False, "kind": "unsendable", "error": str(err)[:300], "violation": guard.violation}


def _message(err: BaseException) -> str:
    try:
        return str(err)[:300]
    except Exception:  # noqa: BLE001 — a hostile __str__
        return "(no message)"


def call(obj: Any, inputs: dict) -> dict:
    """``obj(*args, **kwargs)``; the result under ``"out"``."""
    return {"out": obj(*inputs.get("args", ()), **inputs.get("kwargs", {}))}


def call_with_grad(obj: Any, inputs: dict) -> dict:
    """Call, then backpropagate ``sum(out * cotangent)``; returns ``out`` and the gradients
    of the positional arguments listed in ``inputs["grad_args"]`` (None where no gradient flowed)."""
    args = list(inputs.get("args", ()))
    for i in inputs["grad_args"]:
        args[i] = args[i].clone().requires_grad_(True)
    out = obj(*args, **inputs.get("kwargs", {}))
    first = out[0] if isinstance(out, tuple) else out
    if not isinstance(first, torch.Tensor) or not first.requires_grad:
        return {"out": first, "grads": [None for _ in inputs["grad_args"]]}
    (first * inputs["cotangent"]).sum().backward()
    return {"out": first.detach(), "grads": [args[i].grad for i in inputs["grad_args"]]}


def module_forward(obj: Any, inputs: dict) -> dict:
    """Build ``obj(*init_args, **init_kwargs)``, load ``state`` (a name → tensor dict, strict),
    switch to eval mode and return ``forward(*args, **kwargs)`` and the parameter count."""
    module = obj(*inputs.get("init_args", ()), **inputs.get("init_kwargs", {}))
    if inputs.get("state") is not None:
        module.load_state_dict(inputs["state"], strict=True)
    module.eval()
    with torch.no_grad():
        out = module(*inputs.get("args", ()), **inputs.get("kwargs", {}))
    n_params = sum(p.numel() for p in module.parameters())
    return {"out": out, "n_params": n_params}


# --- chapter 3 ---


def _error(err: BaseException) -> dict:
    return {"type": type(err).__name__, "message": str(err)[:500]}


def call_or_error(obj: Any, inputs: dict) -> dict:
    """Like :func:`call`, but an exception is returned (type and message) instead of raised,
    so a judge can require e.g. a ValueError; ``out`` is None when it raised."""
    try:
        return {"out": obj(*inputs.get("args", ()), **inputs.get("kwargs", {})), "error": None}
    except NotImplementedError:  # an unsolved stub is not an answer
        raise
    except Exception as err:  # the judge decides whether this error was the expected one
        return {"out": None, "error": _error(err)}


def module_forward_or_error(obj: Any, inputs: dict) -> dict:
    """Like :func:`module_forward` (construction and state loading must succeed), but an exception
    raised by ``forward`` is returned (type and message) instead of raised."""
    module = obj(*inputs.get("init_args", ()), **inputs.get("init_kwargs", {}))
    if inputs.get("state") is not None:
        module.load_state_dict(inputs["state"], strict=True)
    module.eval()
    try:
        with torch.no_grad():
            out = module(*inputs.get("args", ()), **inputs.get("kwargs", {}))
    except NotImplementedError:  # an unsolved stub is not an answer
        raise
    except Exception as err:  # the judge decides whether this error was the expected one
        return {"out": None, "error": _error(err)}
    return {"out": out, "error": None}


def rope_scores(obj: Any, inputs: dict) -> dict:
    """For each ((q, m), (k, n)) in ``inputs["calls"]``: the dot product of ``obj(q, start_pos=m)``
    and ``obj(k, start_pos=n)`` (one query and one key vector, shape (1, 1, 1, d_head)), as floats."""
    scores = []
    for (q, m), (k, n) in inputs["calls"]:
        scores.append(float((obj(q, start_pos=m) * obj(k, start_pos=n)).sum()))
    return {"scores": scores}


# --- chapter 2 ---


def module_forward_train_and_eval(obj: Any, inputs: dict) -> dict:
    """Build and load ``obj`` like :func:`module_forward`, then run ``forward`` once in train mode
    (after ``torch.manual_seed(inputs["seed"])``) and once in eval mode; both outputs are returned."""
    module = obj(*inputs.get("init_args", ()), **inputs.get("init_kwargs", {}))
    if inputs.get("state") is not None:
        module.load_state_dict(inputs["state"], strict=True)
    outputs = {}
    for mode in ("train", "eval"):
        module.train(mode == "train")
        torch.manual_seed(inputs.get("seed", 0))
        with torch.no_grad():
            outputs[mode] = module(*inputs.get("args", ()), **inputs.get("kwargs", {}))
    return outputs


# --- chapter 1: tiled attention ---

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


class _LargestOutput(TorchDispatchMode):
    """Records the number of elements of the largest tensor any PyTorch operator returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def call_tracking_size(obj: Any, inputs: dict) -> dict:
    """Like :func:`call`; also ``largest``, the element count of the largest tensor an operator made
    during the call (views count too), so that a judge can tell whether the full score matrix was built."""
    tracker = _LargestOutput()
    with tracker:
        out = obj(*inputs.get("args", ()), **inputs.get("kwargs", {}))
    return {"out": out, "largest": int(tracker.largest)}



# --- chapter 4 ---

from autograder.checks.lookup import LookupModel  # noqa: E402  (a plain-data model the decoding probes build)


def call_each(obj: Any, inputs: dict) -> dict:
    """:func:`call_or_error` for each ``(args, kwargs)`` pair of ``inputs["calls"]``; ``{"results": [...]}``."""
    return {"results": [call_or_error(obj, {"args": args, "kwargs": kwargs}) for args, kwargs in inputs["calls"]]}


def module_forward_each(obj: Any, inputs: dict) -> dict:
    """Build and load ``obj`` like :func:`module_forward` (eval mode, no grad), then ``forward(*args)`` for each
    args tuple of ``inputs["calls"]``; ``{"outs": [...]}``."""
    module = obj(*inputs.get("init_args", ()), **inputs.get("init_kwargs", {}))
    if inputs.get("state") is not None:
        module.load_state_dict(inputs["state"], strict=True)
    module.eval()
    with torch.no_grad():
        return {"outs": [module(*args) for args in inputs["calls"]]}


def scheduler_lrs(obj: Any, inputs: dict) -> dict:
    """An optimizer over one parameter, one param group per lr of ``inputs["lrs"]``; ``obj(optimizer, *args)``;
    then each group's lr before each of ``inputs["steps"]`` optimizer and scheduler steps. An exception raised
    by ``obj`` is returned (type and message) instead of raised."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in inputs["lrs"]]
    optimizer = torch.optim.SGD(groups)
    try:
        scheduler = obj(optimizer, *inputs.get("args", ()), **inputs.get("kwargs", {}))
    except NotImplementedError:  # an unsolved stub is not an answer
        raise
    except Exception as err:  # the judge decides whether this error was the expected one
        return {"lrs": None, "error": _error(err)}
    lrs = []
    for _ in range(inputs["steps"]):
        lrs.append([group["lr"] for group in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return {"lrs": lrs, "error": None}


def decode_lookup(obj: Any, inputs: dict) -> dict:
    """Build a :class:`~autograder.checks.lookup.LookupModel` from ``inputs["model"]`` (in train mode when
    ``inputs["train"]``) and call ``obj(model, *args, **kwargs)``; returns the output, the model's mode
    afterwards, how often it encoded and how many tokens each decode call fed."""
    model = LookupModel(**inputs["model"]).train(inputs.get("train", False))
    out = obj(model, *inputs.get("args", ()), **inputs.get("kwargs", {}))
    return {"out": out, "training_after": model.training, "encode_calls": model.encode_calls, "fed": model.fed}


class _StepCache:
    """The protocol of the decoder cache a chapter-4 attention module uses (``write``, ``cross_keys_values``),
    for one layer, written out here; it records which layer indices it was handed."""

    def __init__(self, cross: tuple, layer: int) -> None:
        self.cross, self.layer, self.k, self.v, self.length = cross, layer, None, None, 0
        self.layers_seen: list[int] = []

    def __len__(self) -> int:
        return self.length

    def cross_keys_values(self, layer: int) -> tuple:
        self.layers_seen.append(layer)
        return self.cross

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple:
        self.layers_seen.append(layer)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def advance(self, n_tokens: int) -> None:
        self.length += n_tokens


def decoder_layer_steps(obj: Any, inputs: dict) -> dict:
    """Build and load ``obj`` (a decoder layer) like :func:`module_forward`; ``forward(x, memory, mask)`` on the
    whole target, then one target position at a time with a cache (``cache=…, layer=inputs["layer"]``; the
    cross-attention keys/values from ``module.cross_attn.keys_values(memory)``). Returns both, and the layer
    indices the cache was handed."""
    module = obj(*inputs.get("init_args", ()), **inputs.get("init_kwargs", {}))
    module.load_state_dict(inputs["state"], strict=True)
    module.eval()
    x, memory, mask = inputs["args"]
    with torch.no_grad():
        full = module(x, memory, mask)
        cache = _StepCache(module.cross_attn.keys_values(memory), inputs["layer"])
        steps = []
        for t in range(x.shape[1]):
            steps.append(module(x[:, t : t + 1], memory, mask, cache=cache, layer=inputs["layer"]))
            cache.advance(1)
    return {"full": full, "steps": steps, "layers_seen": cache.layers_seen}


# --- chapter 5 ---


def linear_from_conv(obj: Any, inputs: dict) -> dict:
    """Build ``nn.Conv2d`` from ``inputs["weight"]`` (out, in, p, p), ``inputs["bias"]`` (None: no bias) and the
    keyword arguments ``inputs["conv"]`` (kernel_size, stride, ...), call ``obj(conv)``, and return what came back:
    whether it is an ``nn.Linear``, its ``weight`` and ``bias`` and its output on ``inputs["patches"]``. An exception
    is returned (type and message) instead of raised; ``out`` is then None."""
    weight, bias = inputs["weight"], inputs["bias"]
    conv = torch.nn.Conv2d(weight.shape[1], weight.shape[0], bias=bias is not None, **inputs["conv"])
    conv = conv.to(weight.dtype)
    with torch.no_grad():
        conv.weight.copy_(weight)
        if bias is not None:
            conv.bias.copy_(bias)
    try:
        linear = obj(conv)
        with torch.no_grad():
            out = linear(inputs["patches"])
    except NotImplementedError:  # an unsolved stub is not an answer
        raise
    except Exception as err:  # the judge decides whether this error was the expected one
        return {"out": None, "error": _error(err)}
    found = {name: getattr(linear, name, None) for name in ("weight", "bias")}
    return {"out": out, "error": None, "is_linear": isinstance(linear, torch.nn.Linear),
            **{name: value.detach() if isinstance(value, torch.Tensor) else None for name, value in found.items()}}


_PROBES = {name: value for name, value in dict(globals()).items()
           if callable(value) and not name.startswith("_") and name not in ("execute", "Forbidden", "Guard", "Any")
           and getattr(value, "__module__", None) == __name__}
