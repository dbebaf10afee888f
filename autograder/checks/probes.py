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

from autograder.checks.lookup import LookupDecoder  # noqa: E402  (a plain-data decoder the decoding probes build)


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


def _snapshot(value: Any) -> Any:
    """A copy of the tensors in ``value``: a view into a cache buffer would change when the cache does."""
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


def kv_cache_steps(obj: Any, inputs: dict) -> dict:
    """Build the cache ``obj(*init_args)``; for each chunk of ``inputs["chunks"]`` (one ``(k, v)`` per layer) call
    ``write(layer, k, v)`` for every layer, then ``advance(new tokens)``. Per chunk: what each ``write`` returned
    and ``len(cache)`` right after it, then ``len(cache)`` and ``keys(layer)`` / ``values(layer)`` after
    ``advance``. An exception stops the steps (``error``; the steps so far are kept). ``inputs["overflow"]``
    (optional) is one more ``(k, v)`` written to layer 0 at the end: its error and the length afterwards."""
    cache = obj(*inputs["init_args"])
    steps = []

    def drive() -> None:
        for chunk in inputs["chunks"]:
            step = {"returned": [], "length_after_write": []}
            steps.append(step)
            for layer, (k, v) in enumerate(chunk):
                step["returned"].append(_snapshot(cache.write(layer, k, v)))
                step["length_after_write"].append(len(cache))
            cache.advance(int(chunk[0][0].shape[-2]))
            step["length"] = len(cache)
            step["keys"] = [_snapshot(cache.keys(layer)) for layer in range(len(chunk))]
            step["values"] = [_snapshot(cache.values(layer)) for layer in range(len(chunk))]

    error = _raised(drive)
    overflow = None
    if error is None and inputs.get("overflow") is not None:
        k, v = inputs["overflow"]
        overflow = {"error": _raised(lambda: cache.write(0, k, v)), "length": len(cache)}
    return {"steps": steps, "error": error, "overflow": overflow}


class _ReferenceCache:
    """A KV cache that keeps the chapter 6 contract (``len``, ``batch``, ``write``, ``advance``): the learner's
    attention layer and model are probed with a cache known to work, not with their own."""

    def __init__(self, n_layers: int, batch: int, kv_heads: int, max_len: int, d_head: int) -> None:
        shape = (batch, kv_heads, max_len, d_head)
        self.k = [torch.zeros(shape) for _ in range(n_layers)]
        self.v = [torch.zeros(shape) for _ in range(n_layers)]
        self.batch, self.max_len, self.length = batch, max_len, 0
        self.writes: list[list[int]] = []  # [layer, length when written, new tokens] of every write

    def __len__(self) -> int:
        return self.length

    def keys(self, layer: int) -> torch.Tensor:
        return self.k[layer][:, :, : self.length]

    def values(self, layer: int) -> torch.Tensor:
        return self.v[layer][:, :, : self.length]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.writes.append([int(layer), self.length, int(k.shape[-2])])
        end = self.length + k.shape[-2]
        if end > self.max_len:
            raise ValueError(f"{self.length} held + {k.shape[-2]} new positions exceed max_len={self.max_len}")
        self.k[layer][:, :, self.length : end] = k
        self.v[layer][:, :, self.length : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, n_tokens: int) -> None:
        self.length += n_tokens


def _build_with_config(obj: Any, inputs: dict) -> Any:
    """``obj(GPTConfig(**inputs["config"]))`` with the ``GPTConfig`` that ``obj``'s own code sees (the notebook's
    cell, or the module that defines ``obj``), ``inputs["state"]`` loaded, in eval mode."""
    config_class = getattr(getattr(obj, "__init__", None), "__globals__", {}).get("GPTConfig")
    if config_class is None:
        raise NameError("GPTConfig is not defined: run the cell that defines it")
    module = obj(config_class(**inputs["config"]))
    module.load_state_dict(inputs["state"], strict=True)
    return module.eval()


def attention_with_cache(obj: Any, inputs: dict) -> dict:
    """Build the attention layer (:func:`_build_with_config`); its output on ``x`` without a cache (``full``), and
    with ``x`` fed in ``chunks`` through one cache (``_ReferenceCache(*inputs["cache"])``, layer ``inputs["layer"]``,
    advanced after each chunk): one output per chunk (``chunked``)."""
    module = _build_with_config(obj, inputs)
    x, layer = inputs["x"], inputs.get("layer", 0)
    with torch.no_grad():
        full = module(x)
        cache = _ReferenceCache(*inputs["cache"])
        chunked, start = [], 0
        for size in inputs["chunks"]:
            chunked.append(module(x[:, start : start + size], cache, layer))
            cache.advance(size)
            start += size
    return {"full": full, "chunked": chunked}


def gpt_chunks(obj: Any, inputs: dict) -> dict:
    """Build the model (:func:`_build_with_config`); its logits for ``idx`` in one pass (``full``) and fed in
    ``chunks`` through one cache (``_ReferenceCache(*inputs["cache"])``): the logits of each chunk (``chunked``) and
    ``len(cache)`` after each (``lengths``), and the cache's log of writes per chunk (``writes``); an exception
    stops the chunks (``error``). Then ``inputs["past"]``
    (optional), tokens that do not fit in the context, is fed to the same cache: its error and the length
    afterwards (``past``); and ``inputs["other_batch"]`` (optional), one sequence more than the cache was made
    for, to a fresh cache (``other_batch``)."""
    model = _build_with_config(obj, inputs)
    idx = inputs["idx"]
    chunked, lengths, writes, past = [], [], [], None
    cache = _ReferenceCache(*inputs["cache"])

    def feed() -> None:
        start = 0
        for size in inputs["chunks"]:
            cache.writes = []
            writes.append(cache.writes)
            chunked.append(model(idx[:, start : start + size], cache=cache))
            lengths.append(len(cache))
            start += size

    with torch.no_grad():
        full = model(idx)
        error = _raised(feed)
        if error is None and inputs.get("past") is not None:
            past = {"error": _raised(lambda: model(inputs["past"], cache=cache)), "length": len(cache)}
        other = None
        if inputs.get("other_batch") is not None:  # a fresh cache for the case's batch, fed one sequence more
            fresh = _ReferenceCache(*inputs["cache"])
            other = {"error": _raised(lambda: model(inputs["other_batch"], cache=fresh)), "length": len(fresh)}
    return {"full": full, "chunked": chunked, "lengths": lengths, "writes": writes, "error": error, "past": past,
            "other_batch": other}


def sample_twice(obj: Any, inputs: dict) -> dict:
    """``obj(*args, generator=torch.Generator().manual_seed(inputs["seed"]), **kwargs)`` twice, with torch's global
    generator seeded differently before each call (and restored afterwards): ``first`` and ``second``. An exception
    is returned as ``error`` (type and message), so that the judge can say what it means for the case."""
    state = torch.get_rng_state()
    outputs = []
    try:
        for global_seed in (1, 2):
            torch.manual_seed(global_seed)
            generator = torch.Generator().manual_seed(inputs["seed"])
            outputs.append(obj(*inputs.get("args", ()), generator=generator, **inputs.get("kwargs", {})))
    except NotImplementedError:  # an unsolved stub is not an answer
        raise
    except Exception as err:  # the judge decides what the error means for this case
        return {"first": None, "second": None, "error": _error(err)}
    finally:
        torch.set_rng_state(state)
    return {"first": outputs[0], "second": outputs[1], "error": None}


def call_with_dtype_or_error(obj: Any, inputs: dict) -> dict:
    """Like :func:`call_or_error`, with ``kwargs["dtype"]`` given by name (``"float16"`` -> ``torch.float16``)."""
    kwargs = dict(inputs.get("kwargs", {}))
    if "dtype" in kwargs:
        kwargs["dtype"] = getattr(torch, kwargs["dtype"])
    return call_or_error(obj, {"args": inputs.get("args", ()), "kwargs": kwargs})


class _ToyConfig:
    def __init__(self, vocab: int, max_len: int) -> None:
        self.vocab, self.max_len = vocab, max_len


class _ToyCache:
    """The toy model's cache: the running sum of its inputs, and how many tokens it holds."""

    def __init__(self, batch: int) -> None:
        self.batch, self.length, self.total = batch, 0, None

    def __len__(self) -> int:
        return self.length


class _ToyLM(torch.nn.Module):
    """A tiny causal language model with the chapter 6 interface (``config.vocab``, ``config.max_len``,
    ``new_cache(batch)``, ``forward(idx, cache=None)``): the logits at position p depend on token p, on p itself
    and on the mean of every input up to p. It logs each call as [first position, tokens fed, autograd on,
    training mode], and refuses positions past ``max_len`` with a ValueError."""

    def __init__(self, tokens: torch.Tensor, positions: torch.Tensor, out: torch.Tensor) -> None:
        super().__init__()
        self.tokens = torch.nn.Parameter(tokens.double())  # (vocab, d)
        self.positions = torch.nn.Parameter(positions.double())  # (max_len, d)
        self.out = torch.nn.Parameter(out.double())  # (d, vocab)
        self.config = _ToyConfig(int(tokens.shape[0]), int(positions.shape[0]))
        self.calls: list[list] = []

    def new_cache(self, batch: int = 1) -> _ToyCache:
        return _ToyCache(batch)

    def forward(self, idx: torch.Tensor, cache: _ToyCache | None = None) -> torch.Tensor:
        start, seq = (0 if cache is None else len(cache)), int(idx.shape[1])
        self.calls.append([start, seq, torch.is_grad_enabled(), self.training])
        if start + seq > self.config.max_len:
            raise ValueError(f"positions {start}..{start + seq - 1} go past the context limit "
                             f"max_len={self.config.max_len}")
        if cache is not None and cache.batch != idx.shape[0]:
            raise ValueError(f"the cache was made for batch={cache.batch}, idx has batch {idx.shape[0]}")
        x = self.tokens[idx] + self.positions[start : start + seq]
        running = x.cumsum(dim=1)
        if cache is not None and cache.total is not None:
            running = running + cache.total[:, None]
        count = torch.arange(start + 1, start + seq + 1, dtype=x.dtype)[:, None]
        logits = torch.tanh(x + running / count) @ self.out
        if cache is not None:
            cache.total, cache.length = running[:, -1].detach(), start + seq
        return logits


def generate_runs(obj: Any, inputs: dict) -> dict:
    """Build the toy model ``_ToyLM(*inputs["model"])`` in mode ``inputs["training"]``, then, one after the other on
    the same model, call ``obj(model, idx, max_new_tokens, **kwargs)`` for each of ``inputs["runs"]`` (with
    ``generator=torch.Generator().manual_seed(seed)`` when the run has a seed). Per run: the output or the error,
    the model's call log and whether it is in training mode afterwards."""
    model = _ToyLM(*inputs["model"])
    model.train(bool(inputs.get("training", False)))
    runs = []
    for run in inputs["runs"]:
        model.calls = []
        kwargs = dict(run.get("kwargs", {}))
        if run.get("seed") is not None:
            kwargs["generator"] = torch.Generator().manual_seed(run["seed"])
        result = {}
        result["error"] = _raised(lambda: result.update(out=obj(model, run["idx"], run["max_new_tokens"], **kwargs)))
        runs.append({"out": result.get("out"), "error": result["error"], "calls": model.calls,
                     "training": model.training})
    return {"runs": runs}


_PROBES = types.MappingProxyType({name: value for name, value in dict(globals()).items()
                                  if isinstance(value, types.FunctionType) and not name.startswith("_")
                                  and name != "execute" and value.__module__ == __name__})
