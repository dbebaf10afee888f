"""Student-side probes: call the learner's object on given inputs and return its outputs.

These run inside the learner's kernel, so they import nothing from ``solutions``
and decide nothing: verdicts are the judges' job (see :mod:`autograder.checks.core`).
Every probe has the signature ``probe(obj, inputs: dict) -> dict`` of plain data
(tensors, numbers, strings, None, lists, dicts) that :func:`core.encode` can send.
"""

from __future__ import annotations

from typing import Any

import torch


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
