"""The wire protocol between the grader and the learner's kernel: one module, one size cap.

A message is an 8-byte big-endian length followed by that many bytes of UTF-8 JSON
holding one object. Values inside (check inputs, probe outputs) are encoded with
:func:`encode_value`: plain JSON plus tensors as raw bytes, never pickle. Everything
that comes from the learner's process is untrusted: :func:`parse` and
:func:`decode_value` accept only what they expect (sizes, types, nesting depth) and
raise :class:`ProtocolError` otherwise.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import struct
from typing import Any

from autograder import limits  # constants only: the standard library

# Framing needs only the standard library; values need PyTorch, imported on first use, so that
# the kernel can answer before it has loaded PyTorch (e.g. that it cannot, within its memory limit).

MAX_MESSAGE = 64 * 2**20  # bytes of one message, either way
MAX_DEPTH = 32  # nesting of lists/dicts inside a value
MAX_TENSOR_DIMS = limits.MAX_TENSOR_DIMS
MAX_TENSOR_ELEMENTS = limits.MAX_TENSOR_ELEMENTS
HEADER = struct.Struct(">Q")


class ProtocolError(ValueError):
    """A message or value that is not what the protocol allows (size, type, shape, depth)."""


class Unsendable(TypeError):
    """A value this protocol cannot carry (another type, nested too deep)."""


# --- framing -------------------------------------------------------------------------


def pack(message: dict) -> bytes:
    """The bytes on the wire for ``message``; ProtocolError when it is larger than the cap."""
    data = json.dumps(message).encode("utf-8")
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"a message of {len(data)} bytes is larger than the {MAX_MESSAGE}-byte limit")
    return HEADER.pack(len(data)) + data


def body_size(header: bytes) -> int:
    """The body length announced by an 8-byte header; ProtocolError past the cap."""
    (size,) = HEADER.unpack(header)
    if size > MAX_MESSAGE:
        raise ProtocolError(f"announced a message of {size} bytes, more than the {MAX_MESSAGE}-byte limit")
    return size


def parse(body: bytes) -> dict:
    """The JSON object in ``body``; ProtocolError for anything else."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise ProtocolError(f"not a JSON message ({type(err).__name__})") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message must be a JSON object")
    return message


# --- values: tensors, numbers, strings, None, lists, tuples, str-keyed dicts ----------

@functools.cache
def _dtypes() -> dict:
    import torch

    return {str(t).removeprefix("torch."): t for t in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
    )}


def _to_json(obj: Any, depth: int) -> Any:
    import torch

    if depth > MAX_DEPTH:
        raise Unsendable(f"values nested deeper than {MAX_DEPTH} levels cannot be sent")
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        if type(t) is not torch.Tensor:  # a subclass: its own values, as a plain tensor (computed here, in sight)
            t = t.as_subclass(torch.Tensor).clone()
        name = str(t.dtype).removeprefix("torch.")
        if name not in _dtypes():
            raise Unsendable(f"cannot send tensors of dtype {t.dtype}")
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""  # reshape: 0-dim too
        sent = {"__tensor__": name, "shape": list(t.shape), "data": base64.b64encode(raw).decode("ascii")}
        if obj.is_leaf and obj.requires_grad:  # autograd state of a tensor the learner was given (and may change)
            sent["requires_grad"] = True
        if obj.is_leaf and obj.grad is not None:
            sent["grad"] = _to_json(obj.grad, depth + 1)
        return sent
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return {"__float__": repr(obj)}  # keeps nan and inf
    if isinstance(obj, (list, tuple)):
        return {"__list__": [_to_json(x, depth + 1) for x in obj], "tuple": isinstance(obj, tuple)}
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise Unsendable("only dicts with str keys can be sent")
        return {"__dict__": {k: _to_json(v, depth + 1) for k, v in obj.items()}}
    raise Unsendable(f"cannot send a {type(obj).__name__}")


def _tensor_from_json(obj: dict):
    import torch

    dtype = _dtypes().get(obj.get("__tensor__")) if isinstance(obj.get("__tensor__"), str) else None
    shape, data = obj.get("shape"), obj.get("data")
    if (dtype is None or not isinstance(shape, list) or not isinstance(data, str) or len(shape) > MAX_TENSOR_DIMS
            or not all(type(n) is int and 0 <= n <= MAX_TENSOR_ELEMENTS for n in shape)):
        raise ProtocolError("malformed tensor")
    if math.prod(shape) > MAX_TENSOR_ELEMENTS:
        raise ProtocolError(f"a tensor of more than {MAX_TENSOR_ELEMENTS} elements")
    try:
        raw = bytearray(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        raise ProtocolError("malformed tensor data") from None
    count = math.prod(shape)
    if len(raw) != count * torch.empty((), dtype=dtype).element_size():
        raise ProtocolError("tensor data does not match its shape and dtype")
    t = torch.empty(shape, dtype=dtype) if count == 0 else (
        torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape).clone())
    if obj.get("requires_grad") is True:
        if not t.is_floating_point():
            raise ProtocolError("only a float tensor can require a gradient")
        t.requires_grad_(True)
    if "grad" in obj:
        grad = _tensor_from_json(obj["grad"]) if isinstance(obj["grad"], dict) else None
        if grad is None or grad.shape != t.shape or grad.dtype != t.dtype or "grad" in obj["grad"]:
            raise ProtocolError("malformed gradient")
        t.grad = grad
    return t


def _from_json(obj: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ProtocolError(f"a value nested deeper than {MAX_DEPTH} levels")
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if not isinstance(obj, dict):
        raise ProtocolError("malformed value")
    if "__tensor__" in obj:
        return _tensor_from_json(obj)
    if "__float__" in obj:
        if not isinstance(obj["__float__"], str):
            raise ProtocolError("malformed float")
        try:
            return float(obj["__float__"])
        except ValueError:
            raise ProtocolError("malformed float") from None
    if "__list__" in obj:
        if not isinstance(obj["__list__"], list):
            raise ProtocolError("malformed list")
        items = [_from_json(x, depth + 1) for x in obj["__list__"]]
        return tuple(items) if obj.get("tuple") is True else items
    if "__dict__" in obj:
        if not isinstance(obj["__dict__"], dict):
            raise ProtocolError("malformed dict")
        return {str(k): _from_json(v, depth + 1) for k, v in obj["__dict__"].items()}
    raise ProtocolError("malformed value")


def encode_value(obj: Any) -> str:
    """A JSON string for ``obj``; :class:`Unsendable` for what cannot be sent (other types, too deep)."""
    try:
        return json.dumps(_to_json(obj, 0))
    except Unsendable:
        raise
    except (TypeError, ValueError, RecursionError) as err:
        raise Unsendable(str(err)[:300]) from None


def decode_value(text: Any) -> Any:
    """The inverse of :func:`encode_value`; ProtocolError on anything malformed. Never unpickles."""
    if not isinstance(text, (str, bytes)):
        raise ProtocolError("a value must be sent as a JSON string")
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ProtocolError(f"malformed value ({type(err).__name__})") from None
    return _from_json(parsed, 0)
