"""Student-side probes: call the learner's object on given inputs and return its outputs.

These run inside the learner's kernel, so they import nothing from ``solutions``
and decide nothing: verdicts are the judges' job (see :mod:`autograder.checks.core`).
Every probe has the signature ``probe(obj, inputs: dict) -> dict`` of plain data
(tensors, numbers, strings, None, lists, dicts) that :func:`wire.encode_value` can send.

:func:`execute` is the one entry point, used both by the batch grader's kernel
(:mod:`autograder.runner`) and in-process by the notebook checks: it decodes the
inputs, calls the probe under the no-delegation guard (:func:`autograder.checks.guard.watched`),
and answers with the encoded outputs and the inputs as they are *after* the call (so
that the verdict side can see a function that changed its inputs in place).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from autograder import limits, protocol, wire
from autograder.checks import guard
from autograder.protocol import Failed


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)  # PyTorch 2.6 and later
    if accelerator is not None:
        return accelerator.is_available()
    xpu = getattr(torch, "xpu", None)
    return torch.cuda.is_available() or torch.backends.mps.is_available() or bool(xpu and xpu.is_available())


def _seed_global(seed: int, _cpu=torch.default_generator, _accelerator=_has_accelerator()) -> None:
    """``torch.manual_seed(seed)`` where it makes a difference: on a machine without an accelerator, the CPU's
    default generator alone. ``torch.manual_seed`` also queues the seed for every accelerator PyTorch knows (CUDA,
    XPU, MTIA), each time formatting the caller's stack for a later error message: a third of the time of
    chapter 6's sampling probes, more under the no-delegation guard's profile hook, which sees every call."""
    if _accelerator:
        torch.manual_seed(seed)
    else:
        _cpu.manual_seed(seed)


def execute(obj: Any, probe: str, inputs: str, forbidden: tuple[str, ...] = (),
            answer_files: tuple[str, ...] = (), report=None) -> dict:
    """Run probe ``probe`` on ``obj`` with the encoded ``inputs``; the answer message (never raises).

    ``{"ok": True, "outputs": str, "inputs_after": str, "violation": str | None}`` or
    ``{"ok": False, "kind": <protocol.Failed>, "error": str, "violation": str | None}``. The kind is decided
    here by identity with the real exception classes, never from a class name. The outputs are turned into
    plain data and encoded while the guard still watches (a tensor subclass that computes its values when it
    is read does so in sight of the guard). ``report`` gets each violation as soon as the guard sees it.
    """
    function = _PROBES.get(probe)
    if function is None:
        return _failed(Failed.RAISED, f"unknown probe {probe!r}", None)

    def probed(obj, inputs):
        # the inputs are decoded, and the outputs turned into plain data, in sight of the guard: no code of the
        # learner's (a patched decoder, a tensor subclass) runs outside it
        args = wire.decode_value(inputs)
        outputs = function(obj, args)
        return wire.encode_value(outputs), wire.encode_value(args)

    result, err, violation = guard.watched(probed, (obj, inputs), forbidden, answer_files, report)
    if err is None:
        return {protocol.OK: True, protocol.OUTPUTS: result[0], protocol.INPUTS_AFTER: result[1],
                protocol.VIOLATION: violation}
    if isinstance(err, guard.Forbidden):
        return _failed(Failed.RAISED, "", violation or str(err))
    if isinstance(err, NotImplementedError):
        return _failed(Failed.NOT_IMPLEMENTED, "", violation)
    if isinstance(err, MemoryError):
        return _failed(Failed.MEMORY, "MemoryError", violation)
    if isinstance(err, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in _message(err):
        return _failed(Failed.MEMORY, f"{type(err).__name__}: {_message(err)}", violation)
    if isinstance(err, wire.Unsendable):
        return _failed(Failed.UNSENDABLE, _message(err), violation)
    if isinstance(err, (KeyboardInterrupt, SystemExit)) or not isinstance(err, Exception):
        return _failed(Failed.RAISED, f"{type(err).__name__}: {_message(err)}", violation)
    return _failed(Failed.RAISED, f"{type(err).__name__}: {_message(err)}", violation)


def _failed(kind: Failed, error: str, violation: str | None) -> dict:
    return {protocol.OK: False, protocol.KIND: kind.value, protocol.ERROR: error, protocol.VIOLATION: violation}


def _message(err: BaseException) -> str:
    try:
        return str(err)[: limits.ERROR_CHARS]
    except Exception:  # noqa: BLE001 — a hostile __str__
        return "(no message)"


_DECLARED: dict[str, Any] = {}


def probe(function):
    """Declare ``function`` a probe: the verdict side may ask the kernel to call it by name. Only what is declared
    so is callable that way (a new helper of this module is not, unless it says so)."""
    _DECLARED[function.__name__] = function
    return function


@probe
def call(obj: Any, inputs: dict) -> dict:
    """``obj(*args, **kwargs)``; the result under ``"out"``."""
    return {"out": obj(*inputs.get("args", ()), **inputs.get("kwargs", {}))}


@probe
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


@probe
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


@probe
def call_or_error(obj: Any, inputs: dict) -> dict:
    """Like :func:`call`, but an exception is returned (type and message) instead of raised,
    so a judge can require e.g. a ValueError; ``out`` is None when it raised."""
    try:
        return {"out": obj(*inputs.get("args", ()), **inputs.get("kwargs", {})), "error": None}
    except NotImplementedError:  # an unsolved stub is not an answer
        raise
    except Exception as err:  # the judge decides whether this error was the expected one
        return {"out": None, "error": _error(err)}


@probe
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


@probe
def rope_scores(obj: Any, inputs: dict) -> dict:
    """For each ((q, m), (k, n)) in ``inputs["calls"]``: the dot product of ``obj(q, start_pos=m)``
    and ``obj(k, start_pos=n)`` (one query and one key vector, shape (1, 1, 1, d_head)), as floats."""
    scores = []
    for (q, m), (k, n) in inputs["calls"]:
        scores.append(float((obj(q, start_pos=m) * obj(k, start_pos=n)).sum()))
    return {"scores": scores}


# --- chapter 2 ---


@probe
def module_forward_train_and_eval(obj: Any, inputs: dict) -> dict:
    """Build and load ``obj`` like :func:`module_forward`, then run ``forward`` once in train mode
    (after ``torch.manual_seed(inputs["seed"])``) and once in eval mode; both outputs are returned."""
    module = obj(*inputs.get("init_args", ()), **inputs.get("init_kwargs", {}))
    if inputs.get("state") is not None:
        module.load_state_dict(inputs["state"], strict=True)
    outputs = {}
    for mode in ("train", "eval"):
        module.train(mode == "train")
        _seed_global(inputs.get("seed", 0))
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

    # As the guard's operator-level mode (checks/guard.py): without this, PyTorch wraps ``__torch_dispatch__`` in
    # ``torch._disable_dynamo``, whose first call imports the compiler (about 900 modules) under the guard's
    # profile hook (a chapter-1 kernel that had not imported it took 10 s more for this probe), and every later
    # call passes through the compiler's ``disable`` wrapper. Nothing is compiled while a check runs.
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@probe
def call_tracking_size(obj: Any, inputs: dict) -> dict:
    """Like :func:`call`; also ``largest``, the element count of the largest tensor an operator made
    during the call (views count too), so that a judge can tell whether the full score matrix was built."""
    tracker = _LargestOutput()
    with tracker:
        out = obj(*inputs.get("args", ()), **inputs.get("kwargs", {}))
    return {"out": out, "largest": int(tracker.largest)}



# --- chapter 4 ---

from autograder.checks.lookup import LookupDecoder  # noqa: E402  (a plain-data decoder the decoding probes build)


@probe
def call_each(obj: Any, inputs: dict) -> dict:
    """:func:`call_or_error` for each ``(args, kwargs)`` pair of ``inputs["calls"]``; ``{"results": [...]}``."""
    return {"results": [call_or_error(obj, {"args": args, "kwargs": kwargs}) for args, kwargs in inputs["calls"]]}


@probe
def module_forward_each(obj: Any, inputs: dict) -> dict:
    """Build and load ``obj`` like :func:`module_forward` (eval mode, no grad), then ``forward(*args)`` for each
    args tuple of ``inputs["calls"]``; ``{"outs": [...]}``."""
    module = obj(*inputs.get("init_args", ()), **inputs.get("init_kwargs", {}))
    if inputs.get("state") is not None:
        module.load_state_dict(inputs["state"], strict=True)
    module.eval()
    with torch.no_grad():
        return {"outs": [module(*args) for args in inputs["calls"]]}


@probe
def scheduler_lrs(obj: Any, inputs: dict) -> dict:
    """An optimizer over one parameter, one param group per lr of ``inputs["lrs"]`` (with the ``initial_lr`` of
    ``inputs["initial_lrs"]`` when given, as an earlier scheduler leaves it); ``obj(optimizer, *args)``;
    then each group's lr before each of ``inputs["steps"]`` optimizer and scheduler steps. An exception raised
    by ``obj`` is returned (type and message) instead of raised."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in inputs["lrs"]]
    for group, initial in zip(groups, inputs.get("initial_lrs") or ()):
        group["initial_lr"] = initial  # what an earlier scheduler leaves in the group
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


@probe
def scheduler_factors(obj: Any, inputs: dict) -> dict:
    """An optimizer over one parameter with one group per lr of ``inputs["lrs"]``; ``obj(optimizer, *args,
    **kwargs)``; then the factor its LambdaLR's lambda gives each step of ``inputs["factor_steps"]`` (``lr_lambdas[0]``,
    read without stepping). An exception (from ``obj``, or from the lambda) is returned (type and message)."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in inputs["lrs"]]
    optimizer = torch.optim.SGD(groups)
    try:
        scheduler = obj(optimizer, *inputs.get("args", ()), **inputs.get("kwargs", {}))
        lambdas = getattr(scheduler, "lr_lambdas", None)
        if not isinstance(lambdas, list) or not lambdas or not callable(lambdas[0]):
            raise TypeError(f"noam_scheduler returned {type(scheduler).__name__}, not a LambdaLR")
        factors = [lambdas[0](step) for step in inputs["factor_steps"]]
    except NotImplementedError:  # an unsolved stub is not an answer
        raise
    except Exception as err:  # the judge decides whether this error was the expected one
        return {"factors": None, "error": _error(err)}
    return {"factors": factors, "error": None}


@probe
def search_lookup(obj: Any, inputs: dict) -> dict:
    """Build a :class:`~autograder.checks.lookup.LookupDecoder` from ``inputs["decoder"]`` and call
    ``obj(decoder, *args, **kwargs)``; returns the output and what the decoder was asked: the rows of every
    ``log_probs`` call, the calls whose prefixes disagreed with its rows' history and the ``reorder`` calls."""
    decoder = LookupDecoder(**inputs["decoder"])
    out = obj(decoder, *inputs.get("args", ()), **inputs.get("kwargs", {}))
    return {"out": out, "calls": decoder.calls, "mismatches": decoder.mismatches, "reorders": decoder.reorders}


class _FixedDropout(torch.nn.Module):
    """A dropout module with a given mask (training mode only), so that a layer's training-mode output can be
    compared exactly; it counts its calls and refuses a tensor of another shape than its mask's."""

    def __init__(self, name: str, mask: torch.Tensor) -> None:
        super().__init__()
        self.name, self.mask, self.calls = name, mask, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if not self.training or self.mask is None:  # no mask: this dropout is switched off
            return x
        if tuple(x.shape) != tuple(self.mask.shape):
            raise ValueError(f"self.{self.name} was applied to a tensor of shape {tuple(x.shape)}; the sub-layer "
                             f"outputs it drops from are {tuple(self.mask.shape)}")
        return x * self.mask


@probe
def module_forward_fixed_dropout(obj: Any, inputs: dict) -> dict:
    """Build and load ``obj`` like :func:`module_forward`; replace its dropout modules named in ``inputs["masks"]``
    (``"dropout1"``, ``"feed_forward.dropout"``...) by ones with those fixed masks (None: no dropout), switch off the
    attention weights' own dropout (a float ``dropout`` attribute of a submodule), and run ``forward(*args)`` in
    training mode. Returns the output (or the error) and how often each replaced module was called."""
    module = obj(*inputs.get("init_args", ()), **inputs.get("init_kwargs", {}))
    module.load_state_dict(inputs["state"], strict=True)
    fixed = {}
    for name, mask in inputs["masks"].items():
        parent, _, attribute = name.rpartition(".")
        fixed[name] = _FixedDropout(name, mask)
        setattr(module.get_submodule(parent) if parent else module, attribute, fixed[name])
    for sub in module.modules():
        if isinstance(getattr(sub, "dropout", None), float):
            sub.dropout = 0.0
    module.train()
    try:
        with torch.no_grad():
            out = module(*inputs.get("args", ()), **inputs.get("kwargs", {}))
    except NotImplementedError:  # an unsolved stub is not an answer
        raise
    except Exception as err:  # the judge decides whether this error was the expected one
        return {"out": None, "error": _error(err), "calls": {name: m.calls for name, m in fixed.items()}}
    return {"out": out, "error": None, "calls": {name: m.calls for name, m in fixed.items()}}


# --- chapter 5 ---


@probe
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


# --- chapter 6 ---

from autograder.checks.toy_lm import ToyLM  # noqa: E402  (a plain-data model the generation probes build)


def _snapshot(value: Any) -> Any:
    """A copy of the tensors in ``value``: a view into a cache's buffer would change when the cache does."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return [_snapshot(v) for v in value]
    return value


def _raised(call) -> dict | None:
    """None when ``call()`` returns, else its exception as :func:`_error` data (NotImplementedError is re-raised)."""
    try:
        call()
    except NotImplementedError:
        raise
    except Exception as err:  # the judge decides whether this error was the expected one
        return _error(err)
    return None


@probe
def calls_with_dtype(obj: Any, inputs: dict) -> dict:
    """:func:`call_or_error` for each ``(args, kwargs)`` of ``inputs["calls"]``, with ``kwargs["dtype"]`` given by
    name (``"float16"`` -> ``torch.float16``); ``{"results": [...]}``."""
    results = []
    for args, kwargs in inputs["calls"]:
        kwargs = dict(kwargs)
        if "dtype" in kwargs:
            kwargs["dtype"] = getattr(torch, kwargs["dtype"])
        results.append(call_or_error(obj, {"args": args, "kwargs": kwargs}))
    return {"results": results}


def _paged_state(cache: Any, pools: list) -> dict:
    """What a paged cache holds: its length, block tables and free blocks (plain lists), and whether each pool
    tensor is still the one it was built with (same storage, same shape)."""
    tables = getattr(cache, "block_tables", None)
    free = getattr(cache, "free_blocks", None)
    now = list(getattr(cache, "k_pool", [])) + list(getattr(cache, "v_pool", []))
    in_place = len(now) == len(pools) and all(
        isinstance(t, torch.Tensor) and t.data_ptr() == ptr and tuple(t.shape) == shape for t, (ptr, shape) in zip(now, pools))
    return {"length": len(cache), "in_place": in_place,
            "tables": [[int(b) for b in table] for table in tables] if isinstance(tables, (list, tuple)) else None,
            "free": [int(b) for b in free] if isinstance(free, (list, tuple)) else None}


@probe
def paged_cache_steps(obj: Any, inputs: dict) -> dict:
    """Build the cache ``obj(*init_args, **init_kwargs)`` (a ``dtype`` given by name), hand out its blocks in the order ``inputs["free"]`` (its
    ``free_blocks`` list), then run ``inputs["ops"]`` in order:

    * ``{"chunk": [(k, v) per layer]}``: ``write(layer, k, v)`` for every layer, then ``advance(new tokens)``;
    * ``{"truncate": length}``; ``{"retain": rows}``;
    * ``{"overflow": (k, v)}``: one write to layer 0 that does not fit in the pool (its error is recorded).

    Per op: what each ``write`` returned (``returned``), ``len(cache)`` and the number of blocks in the tables right
    after each write, and the cache's state afterwards (:func:`_paged_state`). An exception stops the ops (``error``)."""
    kwargs = dict(inputs.get("init_kwargs", {}))
    if "dtype" in kwargs:
        kwargs["dtype"] = getattr(torch, kwargs["dtype"])
    cache = obj(*inputs["init_args"], **kwargs)
    if inputs.get("free") is not None:
        cache.free_blocks = list(inputs["free"])
    pools = [(t.data_ptr(), tuple(t.shape)) for t in list(cache.k_pool) + list(cache.v_pool)]
    steps: list[dict] = []

    def drive() -> None:
        for op in inputs["ops"]:
            step: dict = {"returned": [], "length_after_write": [], "error": None}
            steps.append(step)
            if "chunk" in op:
                step["blocks_after_write"] = []
                for layer, (k, v) in enumerate(op["chunk"]):
                    step["returned"].append(_snapshot(cache.write(layer, k, v)))
                    step["length_after_write"].append(len(cache))
                    step["blocks_after_write"].append(sum(len(t) for t in getattr(cache, "block_tables", [])))
                cache.advance(int(op["chunk"][0][0].shape[-2]))
            elif "truncate" in op:
                cache.truncate(op["truncate"])
            elif "retain" in op:
                cache.retain(list(op["retain"]))
            else:
                k, v = op["overflow"]
                step["error"] = _raised(lambda: cache.write(0, k, v))
            step.update(_paged_state(cache, pools))

    return {"steps": steps, "error": _raised(drive)}


def _toy(spec: dict) -> ToyLM:
    return ToyLM(spec["tokens"], spec["positions"], spec["out"], spec.get("fail_at", 0))


@probe
def generate_batch_runs(obj: Any, inputs: dict) -> dict:
    """For each of ``inputs["runs"]``: build the toy model ``_toy(run["model"])`` in mode ``run["training"]`` and call
    ``obj(model, prompts, max_new_tokens, **kwargs)`` (with ``generator=torch.Generator().manual_seed(seed)`` when
    the run has a seed); torch's global generator is seeded differently before each run and restored afterwards. Per
    run: the output or the error, the model's calls and its mode afterwards."""
    runs, state = [], torch.get_rng_state()
    for index, run in enumerate(inputs["runs"]):
        _seed_global(1000 + index)  # code drawing from the global generator gives other tokens for the same seed
        model = _toy(run["model"]).train(bool(run.get("training", False)))
        kwargs = dict(run.get("kwargs", {}))
        if run.get("seed") is not None:
            kwargs["generator"] = torch.Generator().manual_seed(run["seed"])
        result: dict = {}
        result["error"] = _raised(lambda: result.update(
            out=obj(model, list(run["prompts"]), run["max_new_tokens"], **kwargs)))
        out = result.get("out")
        runs.append({"out": list(out) if isinstance(out, (list, tuple)) else out, "error": result["error"],
                     "calls": model.calls, "training": model.training})
    torch.set_rng_state(state)
    return {"runs": runs}


@probe
def speculative_runs(obj: Any, inputs: dict) -> dict:
    """For each of ``inputs["runs"]``: build the toy target and draft (``_toy``), each in mode ``run["training"]``,
    and call ``obj(target, draft, idx, max_new_tokens, **kwargs)`` ``run.get("repeat", 1)`` times, the i-th with
    ``generator=torch.Generator().manual_seed(seed + i)`` when the run has a seed (the models are rebuilt each
    time). Torch's global generator is seeded differently before each run (and restored afterwards), so that code
    which draws from it instead of the generator gives other tokens for the same seed. Per run: every output; of the
    first call: its tokens and stats or its error, both models' calls in one log in the order they came (each names
    its ``model``, "target" or "draft"), and their modes afterwards."""
    state = torch.get_rng_state()
    try:
        return {"runs": [_speculative_run(obj, run, 1000 + index) for index, run in enumerate(inputs["runs"])]}
    finally:
        torch.set_rng_state(state)


def _speculative_run(obj: Any, run: dict, global_seed: int) -> dict:
    _seed_global(global_seed)
    outs, first = [], {}
    for i in range(int(run.get("repeat", 1))):
        target = _toy(run["target"]).train(bool(run.get("training", False)))
        draft = _toy(run["draft"]).train(bool(run.get("training", False)))
        target.name, draft.name, draft.calls = "target", "draft", target.calls  # one log, in call order
        kwargs = dict(run.get("kwargs", {}))
        if run.get("seed") is not None:
            kwargs["generator"] = torch.Generator().manual_seed(run["seed"] + i)
        result: dict = {}
        result["error"] = _raised(lambda: result.update(
            answer=obj(target, draft, run["idx"], run["max_new_tokens"], **kwargs)))
        if i == 0:
            first = {"error": result["error"], "answer": result.get("answer"), "calls": target.calls,
                     "training": [target.training, draft.training]}
        if result["error"] is not None:
            break
        answer = result["answer"]
        outs.append(answer[0] if isinstance(answer, (list, tuple)) and answer else answer)
    answer = first.get("answer")
    first["tokens"] = answer[0] if isinstance(answer, (list, tuple)) and len(answer) == 2 else answer
    first["stats"] = answer[1] if isinstance(answer, (list, tuple)) and len(answer) == 2 else None
    first.pop("answer", None)
    return {**first, "outs": outs}


_PROBES = types.MappingProxyType(dict(_DECLARED))  # read-only once the module is loaded
