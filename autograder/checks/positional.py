"""Checks for chapter 3 (positional encodings), written once for the notebook, the grader and pytest.

Each judge compares with :mod:`solutions.positional` and with properties; when
the learner's output matches a known mistake (sin/cos swapped, exponent i/d,
half-split RoPE pairs, ...) the hint names that mistake.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from autograder.checks import core
from autograder.checks.core import (Case, Check, CheckFailed, expect_close, expect_value_error, fail, rand_int,
                                    same)
ref = core.reference("solutions.positional")  # in a student edition: replayed from a recording


# The reference, and the known mistakes one edit away from it, on case inputs only. Each is a function of the
# inputs marked @core.recorded and called on the visible cases' pass path too (before the early return), so that a
# student edition, which withholds chapter 3's answers, replays the results and holds no code that computes them.
@core.recorded
def _ref_sinusoid(seq_len: int, d_model: int) -> torch.Tensor:
    return ref.sinusoidal_encoding(seq_len, d_model).double()


@core.recorded
def _ref_rope(x: torch.Tensor, start_pos: int, base: float) -> torch.Tensor:
    return ref.apply_rope(x, start_pos, base)


@core.recorded
def _ref_slopes(n: int) -> torch.Tensor:
    return ref.alibi_slopes(n).double()


@core.recorded
def _ref_bias(heads: int, seq_q: int, seq_k: int) -> torch.Tensor:
    return ref.alibi_bias(heads, seq_q, seq_k).double()


def _sinusoid_variant(seq_len: int, d_model: int, *, swap=False, exponent=2.0, base=10000.0, first=0) -> torch.Tensor:
    """The encoding with one of the usual mistakes (exponent 2 is the correct 2i/d); only for _sinusoid_mistakes."""
    position = torch.arange(first, first + seq_len, dtype=torch.float64)[:, None]
    i = torch.arange(0, (d_model + 1) // 2, dtype=torch.float64)
    angle = position / base ** (exponent * i / d_model)
    first_fn, second_fn = (torch.cos, torch.sin) if swap else (torch.sin, torch.cos)
    pe = torch.zeros(seq_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = first_fn(angle)
    pe[:, 1::2] = second_fn(angle[:, : d_model // 2])
    return pe


@core.recorded
def _sinusoid_mistakes(seq_len: int, d_model: int) -> dict:
    """The output of each mistake of _SINUSOID_MISTAKES (stacked)."""
    right = _sinusoid_variant(seq_len, d_model)
    return core.stacked({"swap": _sinusoid_variant(seq_len, d_model, swap=True),
                         "exponent": _sinusoid_variant(seq_len, d_model, exponent=1.0),
                         "base": _sinusoid_variant(seq_len, d_model, base=1000.0),
                         "first": _sinusoid_variant(seq_len, d_model, first=1),
                         "concatenated": torch.cat([right[:, 0::2], right[:, 1::2]], dim=-1)})


@core.recorded
def _learned_outputs(x: torch.Tensor, weight: torch.Tensor, start_pos: int) -> dict:
    """The right output ("expected") and each mistake of _LEARNED_MISTAKES that these sizes allow (stacked)."""
    seq = x.shape[1]
    outputs = {"expected": x + weight[start_pos : start_pos + seq], "start_ignored": x + weight[:seq],
               "alone": weight[start_pos : start_pos + seq].expand_as(x)}
    if start_pos + seq + 1 <= weight.shape[0]:
        outputs["off_by_one"] = x + weight[start_pos + 1 : start_pos + seq + 1]
    return core.stacked(outputs)


def _rope_variant(x: torch.Tensor, start_pos: int, base: float, *, sign: float = 1.0, halves: bool = False):
    """The rotation with one of the usual mistakes; only for _rope_mistakes."""
    angle = sign * ref.rope_angles(x.shape[-2], x.shape[-1], start_pos, base)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    if halves:
        a, b = x.chunk(2, dim=-1)
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    if halves:
        return torch.cat((ra, rb), dim=-1)
    return torch.stack((ra, rb), dim=-1).flatten(-2)


@core.recorded
def _rope_mistakes(x: torch.Tensor, start_pos: int, base: float) -> dict:
    """The output of each mistake of _ROPE_MISTAKES and _ROPE_COMPLEX_MISTAKES (stacked, in float32: they only
    name a wrong answer, compared with rtol 1e-4, and float64 would double the recording)."""
    right = _rope_variant(x, start_pos, base)
    return core.stacked({"transposed": _rope_variant(x, start_pos, base, sign=-1.0),
                         "halves": _rope_variant(x, start_pos, base, halves=True),
                         "start_ignored": _rope_variant(x, 0, base),
                         "base_ignored": _rope_variant(x, start_pos, 10000.0),
                         "exponent": _rope_variant(x, start_pos, base ** 0.5),
                         "concatenated": torch.cat([right[..., 0::2], right[..., 1::2]], dim=-1)}, torch.float32)


@core.recorded
def _slopes_mistakes(n: int) -> dict:
    """The output of each mistake of _slopes_hints (stacked)."""
    right, start = ref.alibi_slopes(n).double(), 2.0 ** (-8.0 / n)
    return core.stacked({"negative": -right, "naive": torch.tensor([start ** (i + 1) for i in range(n)],
                                                                  dtype=torch.float64), "reversed": right.flip(0)})


@core.recorded
def _bias_mistakes(heads: int, seq_q: int, seq_k: int) -> dict:
    """The output of each mistake of _BIAS_MISTAKES (stacked)."""
    slopes = ref.alibi_slopes(heads).double()[:, None, None]
    query, key = torch.arange(seq_q)[:, None], torch.arange(seq_k)[None, :]
    return core.stacked({"positive": slopes * (query + (seq_k - seq_q) - key).abs(),
                         "start_aligned": -slopes * (query - key).abs(),
                         "signed": -slopes * (query + (seq_k - seq_q) - key).double()})


def _diagnose(actual: Any, hints: dict[str, str], mistakes: dict[str, torch.Tensor], atol: float = 1e-5) -> None:
    """Fail with the hint of the first known mistake (in the order of ``hints``) that ``actual`` reproduces."""
    for key, hint in hints.items():
        if key in mistakes and same(actual, mistakes[key], atol, dtype="cast"):
            fail(hint)


def _no_error(outputs: dict) -> None:
    got = outputs.get("error")
    if got is not None:
        fail(f"your code raised {got.get('type')}: {got.get('message')}")


def _bad_inputs(function: str, *rules: tuple[str, tuple, dict, str]):
    """Every rule of ``rules`` in turn, one call each: (the rule in words, args, kwargs, the argument the
    ValueError must name); a tensor argument is given as a shape and drawn from ``gen``."""

    def inputs(gen: torch.Generator) -> dict:
        calls, expected = [], []
        for rule, args, kwargs, argument in rules:
            args = tuple(torch.randn(*a, generator=gen) if isinstance(a, list) else a for a in args)
            shown = ", ".join([f"x of shape {tuple(a.shape)}" if isinstance(a, torch.Tensor) else repr(a) for a in args]
                              + [f"{k}={v!r}" for k, v in kwargs.items()])
            calls.append((args, kwargs))
            expected.append({"rule": rule, "argument": argument, "call": f"{function}({shown})"})
        return {"calls": calls, "expected": expected}

    return inputs


def _judge_value_error(inputs: dict, outputs: dict) -> None:
    """The call must raise ValueError, and its message must name ``inputs["argument"]``."""
    expect_value_error(outputs.get("error"), f"{inputs['call']} ({inputs['rule']})", inputs["argument"], word=False)


def _judge_value_errors(inputs: dict, outputs: dict) -> None:
    """Every call of :func:`_bad_inputs` must raise its ValueError; the first that does not decides the hint."""
    for expected, result in zip(inputs["expected"], outputs["results"], strict=True):
        _judge_value_error(expected, result)


# --- sinusoidal_encoding ---


def _sinusoid_inputs(seq_range: tuple[int, int], d_range: tuple[int, int], odd: bool = False):
    def inputs(gen: torch.Generator) -> dict:
        seq_len = rand_int(gen, *seq_range)
        d_model = 2 * rand_int(gen, d_range[0] // 2, d_range[1] // 2) + (1 if odd else 0)
        return {"args": (seq_len, d_model)}

    return inputs


_SINUSOID_MISTAKES = {
    "swap": "sin and cos are swapped: even columns 2i are sin, odd columns 2i+1 are cos (row 0 must be 0, 1, 0, 1, "
    "...)",
    "exponent": "the exponent is i/d instead of 2i/d: pair i (columns 2i and 2i+1) uses 10000^(2i/d_model)",
    "base": "the base must be 10000 (you used 1000)",
    "first": "positions start at 0, not 1: row 0 is the encoding of position 0 (sin 0 = 0, cos 0 = 1)",
    "concatenated": "the columns are not interleaved: put sin in the even columns 0, 2, 4, ... and cos in the odd "
    "columns, not all sines first and then all cosines",
}


def _judge_sinusoid(inputs: dict, outputs: dict) -> None:
    seq_len, d_model = inputs["args"]
    out = outputs["out"]
    expected, mistakes = _ref_sinusoid(seq_len, d_model), core.unstacked(_sinusoid_mistakes(seq_len, d_model))
    if same(out, expected, dtype="cast"):
        return
    _diagnose(out, _SINUSOID_MISTAKES, mistakes)
    expect_close(out, expected, "PE[p, 2i] = sin(p / 10000^(2i/d_model)), PE[p, 2i+1] = cos(p / 10000^(2i/d_model))",
                 atol=1e-5)


def _judge_sinusoid_first_row(inputs: dict, outputs: dict) -> None:
    seq_len, d_model = inputs["args"]
    out = outputs["out"]
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (seq_len, d_model):
        fail(f"expected a tensor of shape (seq_len, d_model) = {(seq_len, d_model)}")
    row0 = torch.tensor([0.0, 1.0] * d_model)[:d_model]
    expect_close(out[0].double(), row0.double(),
                 "row 0 (position 0) must be 0, 1, 0, 1, ...: sin(0) in even columns, cos(0) in odd ones")
    _judge_sinusoid(inputs, outputs)


def _judge_sinusoid_shift(inputs: dict, outputs: dict) -> None:
    """PE(p + k) = M_k PE(p) with M_k block-diagonal rotations: check it on the learner's output."""
    _judge_sinusoid(inputs, outputs)
    seq_len, d_model = inputs["args"]
    pe = outputs["out"].double()
    k = inputs["shift"]
    freq = 10000.0 ** (-torch.arange(0, d_model // 2, dtype=torch.float64) * 2 / d_model)
    c, s = torch.cos(k * freq), torch.sin(k * freq)
    sin_p, cos_p = pe[:-k, 0 : 2 * (d_model // 2) : 2], pe[:-k, 1::2]
    shifted = torch.stack((sin_p * c + cos_p * s, cos_p * c - sin_p * s), dim=-1).flatten(-2)
    expect_close(pe[k:, : 2 * (d_model // 2)], shifted, "PE(p + k) is not a rotation of PE(p) pair by pair", atol=1e-6)


def _sinusoid_shift_inputs(gen: torch.Generator) -> dict:
    return {"args": (rand_int(gen, 20, 60), 2 * rand_int(gen, 4, 16)), "shift": rand_int(gen, 1, 7)}


# --- LearnedPositionalEmbedding ---


def _learned_inputs(start: str, *, batch_max: int = 3):
    """``start``: "zero", "inside" (start_pos > 0, fits), "edge" (ends exactly at max_len), "past" (one too far)."""

    def inputs(gen: torch.Generator) -> dict:
        max_len, d_model = rand_int(gen, 8, 24), rand_int(gen, 2, 12)
        seq = rand_int(gen, 1, max_len // 2)
        start_pos = {
            "zero": 0,
            "inside": rand_int(gen, 1, max_len - seq),
            "edge": max_len - seq,
            "past": max_len - seq + rand_int(gen, 1, 3),
        }[start]
        x = torch.randn(rand_int(gen, 1, batch_max), seq, d_model, generator=gen)
        weight = torch.randn(max_len, d_model, generator=gen)
        return {"init_args": (max_len, d_model), "state": {"embedding.weight": weight},
                "args": (x,), "kwargs": {"start_pos": start_pos}}

    return inputs


_LEARNED_MISTAKES = {
    "start_ignored": "start_pos is ignored: the tokens sit at positions start_pos … start_pos + seq - 1, not 0 … "
    "seq - 1",
    "alone": "return x PLUS the position vectors, not the position vectors alone",
    "off_by_one": "the positions are off by one: the first token is at position start_pos",
}


def _judge_learned(inputs: dict, outputs: dict) -> None:
    _no_error(outputs)
    (x,), start_pos = inputs["args"], inputs["kwargs"]["start_pos"]
    outputs_of = core.unstacked(_learned_outputs(x, inputs["state"]["embedding.weight"], start_pos))
    expected, out = outputs_of["expected"], outputs["out"]
    if same(out, expected, dtype="cast"):
        return
    if same(out, x, dtype="cast"):
        fail("x is returned unchanged: add the position vectors embedding(positions)")
    _diagnose(out, _LEARNED_MISTAKES, outputs_of)
    expect_close(out, expected, "the output must be x + embedding(positions start_pos … start_pos + seq - 1)")


def _learned_bad_inputs(rule: str, argument: str, *, shape: Any = lambda d_model: (1, 3, d_model),
                        start_pos: int | float | str = 0):
    """A forward call that breaks one rule: x of ``shape(d_model)`` at ``start_pos`` ("negative": drawn below 0);
    the ValueError must name ``argument``."""

    def inputs(gen: torch.Generator) -> dict:
        max_len, d_model = rand_int(gen, 8, 16), rand_int(gen, 2, 6)
        weight = torch.randn(max_len, d_model, generator=gen)
        x = torch.randn(*shape(d_model), generator=gen)
        start = -rand_int(gen, 1, 3) if start_pos == "negative" else start_pos
        return {"init_args": (max_len, d_model), "state": {"embedding.weight": weight}, "args": (x,),
                "kwargs": {"start_pos": start}, "argument": argument, "rule": rule,
                "call": f"forward(x of shape {tuple(x.shape)}, start_pos={start!r}) with d_model={d_model}"}

    return inputs


def _judge_learned_past(inputs: dict, outputs: dict) -> None:
    (x,), start_pos = inputs["args"], inputs["kwargs"]["start_pos"]
    max_len = inputs["init_args"][0]
    what = f"positions {start_pos}..{start_pos + x.shape[1] - 1} with max_len={max_len}"
    if outputs.get("error") is None:
        fail(f"{what}: your code returned a result, but past max_len there is no trained vector, so a wrapped or "
             "clamped index is garbage; check start_pos + seq > max_len first and raise a ValueError naming max_len")
    expect_value_error(outputs["error"], what, "max_len", word=False)


# --- apply_rope ---


def _rope_inputs(*, start: bool, base: bool = False, dtype=torch.float32, long: bool = False):
    def inputs(gen: torch.Generator) -> dict:
        seq = rand_int(gen, 40, 80) if long else rand_int(gen, 3, 9)
        d_head = 2 * rand_int(gen, 2, 8)
        x = torch.randn(rand_int(gen, 1, 2), rand_int(gen, 1, 3), seq, d_head, generator=gen, dtype=dtype)
        kwargs = {}
        if start:
            kwargs["start_pos"] = rand_int(gen, 1, 50)
        if base:
            kwargs["base"] = float(rand_int(gen, 50, 500))
        return {"args": (x,), "kwargs": kwargs}

    return inputs


_ROPE_MISTAKES = {
    "transposed": "you rotate the wrong way (the transpose): the rotated pair is (a·cos θ - b·sin θ, "
    "a·sin θ + b·cos θ)",
    "halves": "you rotate the two halves (x[i], x[i + d/2]) together; this chapter's convention rotates interleaved "
    "pairs (x[2i], x[2i+1]) — mixing the two conventions between a model's q and k breaks RoPE",
    "start_ignored": "start_pos is ignored: the tokens sit at positions start_pos … start_pos + seq - 1",
    "base_ignored": "the frequencies ignore base: θ_i = base^(-2i/d_head)",
    "exponent": "the exponent is i/d instead of 2i/d: pair i turns at base^(-2i/d_head) radians per position",
}


def _judge_rope(inputs: dict, outputs: dict) -> None:
    (x,) = inputs["args"]
    start_pos, base = inputs["kwargs"].get("start_pos", 0), inputs["kwargs"].get("base", 10000.0)
    out = outputs["out"]
    expected, mistakes = _ref_rope(x, start_pos, base), core.unstacked(_rope_mistakes(x, start_pos, base))
    atol = 1e-5 if x.dtype == torch.float32 else 1e-10
    if same(out, expected, atol, dtype="cast"):
        return
    if isinstance(out, torch.Tensor) and out.shape == x.shape:
        norms = out.to(x.dtype).norm(dim=-1)
        if not torch.allclose(norms, x.norm(dim=-1), atol=1e-4 if x.dtype == torch.float32 else 1e-10, rtol=1e-4):
            fail("a rotation preserves the norm of every (batch, head, position) vector, yours does not: "
                 "rotate each pair (x[2i], x[2i+1]) as (a·cos - b·sin, a·sin + b·cos)")
    _diagnose(out, _ROPE_MISTAKES, mistakes, atol)
    expect_close(out, expected, "rotate pair (x[2i], x[2i+1]) at position p by the angle p · base^(-2i/d_head)",
                 atol=atol)


def _rope_relative_inputs(gen: torch.Generator) -> dict:
    d_head = 2 * rand_int(gen, 2, 8)
    q = torch.randn(1, 1, 1, d_head, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, 1, d_head, generator=gen, dtype=torch.float64)
    offset = rand_int(gen, 0, 5)
    starts = [rand_int(gen, 0, 40) for _ in range(3)]
    # Each call places q at position start + offset and k at start.
    return {"calls": [((q, start + offset), (k, start)) for start in starts], "q": q, "k": k, "offset": offset}


def _judge_rope_relative(inputs: dict, outputs: dict) -> None:
    scores = outputs["scores"]
    if not all(isinstance(s, float) and math.isfinite(s) for s in scores):
        fail("apply_rope must return finite tensors")
    if max(scores) - min(scores) > 1e-9:
        fail(f"<rope(q, m), rope(k, n)> must depend only on m - n = {inputs['offset']}; with the same offset at "
             f"different positions you gave {[round(s, 6) for s in scores]}: use the same rotation for q and k, "
             "angle = position · θ_i")


# --- apply_rope_complex ---


_ROPE_COMPLEX_MISTAKES = {
    "transposed": "you multiply by e^(-iθ) (the conjugate): the rotation by +θ is the product with e^(+iθ) = "
    "cos θ + i·sin θ",
    "halves": "your complex numbers pair x[i] with x[i + d/2] (the halves); here a pair is two neighbours, "
    "x[2i] + i·x[2i+1]: reshape the last axis to (d_head/2, 2) before torch.view_as_complex",
    "start_ignored": "start_pos is ignored: the angles are those of positions start_pos … start_pos + seq - 1",
    "concatenated": "the real and imaginary parts are not interleaved back: torch.view_as_real gives (..., d_head/2, "
    "2), flatten those two axes, do not concatenate all real parts then all imaginary parts",
}


def _judge_rope_complex(inputs: dict, outputs: dict) -> None:
    (x,) = inputs["args"]
    start_pos, base = inputs["kwargs"].get("start_pos", 0), inputs["kwargs"].get("base", 10000.0)
    out = outputs["out"]
    # the pairwise rotation (the other exercise), in float64
    expected = _ref_rope(x.double(), start_pos, base)
    mistakes = core.unstacked(_rope_mistakes(x.double(), start_pos, base))
    atol = 1e-5 if x.dtype == torch.float32 else 1e-10
    if isinstance(out, torch.Tensor) and out.shape == x.shape and out.dtype != x.dtype:
        fail(f"return the dtype of x ({x.dtype}), not {out.dtype}: convert back after torch.view_as_real")
    if same(out, expected, atol, dtype="cast"):
        if x.dtype == torch.float64 and not torch.allclose(out, expected, atol=1e-10, rtol=1e-10):
            fail("a float64 x lost precision: its pairs must become complex128 numbers (torch.view_as_complex of "
                 "the float64 tensor, and e^(iθ) in complex128), not complex64")
        return
    _diagnose(out, _ROPE_COMPLEX_MISTAKES, mistakes, atol)
    expect_close(out, expected, "the complex product must equal the pairwise rotation: (a + ib)·e^(iθ) = "
                 "(a·cos θ - b·sin θ) + i·(a·sin θ + b·cos θ)", atol=atol)


# --- alibi_slopes ---


def _slopes_inputs(choices: tuple[int, ...]):
    def inputs(gen: torch.Generator) -> dict:
        return {"args": (choices[rand_int(gen, 0, len(choices) - 1)],)}

    return inputs


def _slopes_hints(n: int) -> dict[str, str]:
    return {
        "negative": "slopes must be positive (the bias is -slope · distance)",
        "naive": f"for n_heads={n}, not a power of two, the paper does not use 2^(-8/n): take the slopes of the power "
        "of two below n, then every other slope (0, 2, 4, ...) of the next power of two until you have n",
        "reversed": "the slopes are in reverse order: head 0 has the largest slope 2^(-8/n)",
    }


def _judge_slopes(inputs: dict, outputs: dict) -> None:
    (n,) = inputs["args"]
    out = outputs["out"]
    expected, mistakes = _ref_slopes(n), core.unstacked(_slopes_mistakes(n))
    if same(out, expected, 1e-7, dtype="cast"):
        return
    _diagnose(out, _slopes_hints(n), mistakes, 1e-7)
    expect_close(out, expected, f"for n_heads={n} (a power of two) the slopes are 2^(-8/n), 2^(-16/n), …, 2^(-8)"
                 if n & (n - 1) == 0 else f"wrong slopes for n_heads={n}", atol=1e-7)


# --- alibi_bias ---


def _bias_inputs(*, square: bool, power_of_two: bool = True):
    def inputs(gen: torch.Generator) -> dict:
        heads = 2 ** rand_int(gen, 0, 4) if power_of_two else (3, 5, 6, 7, 12)[rand_int(gen, 0, 4)]
        seq_k = rand_int(gen, 2, 10)
        seq_q = seq_k if square else rand_int(gen, 1, seq_k - 1)
        return {"args": (heads, seq_q, seq_k)}

    return inputs


_BIAS_MISTAKES = {
    "positive": "the bias must be a penalty: -slope · distance (≤ 0, 0 on the diagonal), yours is positive",
    "start_aligned": "the queries are not end-aligned: with seq_q < seq_k the last query sits at key position "
    "seq_k - 1 (query i is at position i + seq_k - seq_q, as in causal_mask)",
    "signed": "use the distance |i - j|, not the signed difference",
}


def _judge_bias(inputs: dict, outputs: dict) -> None:
    heads, seq_q, seq_k = inputs["args"]
    out = outputs["out"]
    expected, mistakes = _ref_bias(heads, seq_q, seq_k), core.unstacked(_bias_mistakes(heads, seq_q, seq_k))
    if same(out, expected, 1e-6, dtype="cast"):
        return
    _diagnose(out, _BIAS_MISTAKES, mistakes, 1e-6)
    expect_close(out, expected, "bias[h, i, j] = -slope_h · |i + (seq_k - seq_q) - j| with slope_h = alibi_slopes(n_heads)[h] "
                 "(if your alibi_slopes fails its check, fix it first)", atol=1e-6)


_LEARNED = "module_forward_or_error"

# Visible cases check what each exercise is for (position 0, odd d_model, the errors the text asks for,
# start_pos, end alignment, non-power-of-two slopes...); hidden cases are the same properties on fresh seeds,
# sizes and dtypes, plus edge cases.
CHECKS: dict[str, Check] = {
    "sinusoidal_encoding": Check(
        name="sinusoidal_encoding",
        visible=(
            Case("position 0 is 0, 1, 0, 1, …", _sinusoid_inputs((2, 6), (4, 8)), "call", _judge_sinusoid_first_row),
            Case("matches the formula", _sinusoid_inputs((4, 12), (4, 16)), "call", _judge_sinusoid),
            Case("odd d_model: the last column is a sine", _sinusoid_inputs((3, 10), (4, 12), odd=True), "call",
                 _judge_sinusoid),
            Case("seq_len not a non-negative int, or d_model < 1, raises ValueError (each rule in turn)",
                 _bad_inputs("sinusoidal_encoding", ("seq_len is negative", (-3, 8), {}, "seq_len"),
                             ("seq_len is not an int", (2.5, 4), {}, "seq_len"),
                             ("d_model is below 1", (5, 0), {}, "d_model")),
                 "call_each", _judge_value_errors),
        ),
        hidden=(
            Case("long sequences", _sinusoid_inputs((200, 400), (32, 64)), "call", _judge_sinusoid),
            Case("PE(p + k) is a rotation of PE(p)", _sinusoid_shift_inputs, "call", _judge_sinusoid_shift),
            Case("other bad arguments raise ValueError",
                 _bad_inputs("sinusoidal_encoding", ("seq_len is negative", (-1, 4), {}, "seq_len"),
                             ("seq_len is not an int", (4.0, 6), {}, "seq_len"),
                             ("d_model is below 1", (4, -2), {}, "d_model")),
                 "call_each", _judge_value_errors),
        ),
    ),
    "LearnedPositionalEmbedding": Check(
        name="LearnedPositionalEmbedding",
        visible=(
            Case("start_pos = 0", _learned_inputs("zero"), _LEARNED, _judge_learned),
            Case("start_pos > 0", _learned_inputs("inside"), _LEARNED, _judge_learned),
            Case("ending exactly at max_len is allowed", _learned_inputs("edge"), _LEARNED, _judge_learned),
            Case("past max_len raises ValueError", _learned_inputs("past"), _LEARNED, _judge_learned_past),
            Case("a 2-D x raises ValueError naming x",
                 _learned_bad_inputs("x is not (batch, seq, d_model)", "x", shape=lambda d: (3, d)), _LEARNED,
                 _judge_value_error),
            Case("x whose last size is not d_model raises ValueError naming x",
                 _learned_bad_inputs("x is not (batch, seq, d_model)", "x", shape=lambda d: (2, 3, 1)), _LEARNED,
                 _judge_value_error),
            Case("a negative start_pos raises ValueError naming start_pos",
                 _learned_bad_inputs("start_pos is negative", "start_pos", start_pos="negative"), _LEARNED,
                 _judge_value_error),
            Case("a start_pos that is not an int raises ValueError naming start_pos",
                 _learned_bad_inputs("start_pos is not an int", "start_pos", start_pos=1.5), _LEARNED,
                 _judge_value_error),
        ),
        hidden=(
            Case("start_pos > 0, larger batch", _learned_inputs("inside", batch_max=6), _LEARNED, _judge_learned),
            Case("a 4-D x raises ValueError naming x",
                 _learned_bad_inputs("x is not (batch, seq, d_model)", "x", shape=lambda d: (1, 1, 3, d)), _LEARNED,
                 _judge_value_error),
            Case("x one wider than d_model raises ValueError naming x",
                 _learned_bad_inputs("x is not (batch, seq, d_model)", "x", shape=lambda d: (1, 2, d + 1)),
                 _LEARNED, _judge_value_error),
            Case("a float start_pos raises ValueError naming start_pos",
                 _learned_bad_inputs("start_pos is not an int", "start_pos", start_pos=2.0), _LEARNED,
                 _judge_value_error),
        ),
    ),
    "apply_rope": Check(
        name="apply_rope",
        visible=(
            Case("rotates pairs (start_pos = 0)", _rope_inputs(start=False), "call", _judge_rope),
            Case("start_pos > 0", _rope_inputs(start=True), "call", _judge_rope),
            Case("another base", _rope_inputs(start=True, base=True), "call", _judge_rope),
            Case("score depends only on m - n", _rope_relative_inputs, "rope_scores", _judge_rope_relative),
            Case("x not 4-D, odd d_head, or start_pos not a non-negative int raises ValueError (each rule in turn)",
                 _bad_inputs("apply_rope", ("x is not 4-D", ([2, 3, 4],), {}, "x"),
                             ("d_head is odd", ([1, 2, 3, 5],), {}, "d_head"),
                             ("start_pos is negative", ([1, 1, 3, 4],), {"start_pos": -1}, "start_pos"),
                             ("start_pos is not an int", ([1, 1, 3, 4],), {"start_pos": 1.5}, "start_pos")),
                 "call_each", _judge_value_errors),
        ),
        hidden=(
            Case("other bad arguments raise ValueError",
                 _bad_inputs("apply_rope", ("x is not 4-D", ([1, 2, 1, 3, 4],), {}, "x"),
                             ("d_head is odd", ([2, 1, 4, 7],), {}, "d_head"),
                             ("start_pos is negative", ([1, 2, 2, 6],), {"start_pos": -5}, "start_pos"),
                             ("start_pos is not an int", ([1, 1, 2, 4],), {"start_pos": 2.0}, "start_pos")),
                 "call_each", _judge_value_errors),
            Case("float64, long sequences", _rope_inputs(start=True, dtype=torch.float64, long=True), "call",
                 _judge_rope),
        ),
    ),
    "apply_rope_complex": Check(
        name="apply_rope_complex",
        visible=(
            Case("equals the pairwise rotation (start_pos = 0)", _rope_inputs(start=False), "call",
                 _judge_rope_complex),
            Case("start_pos > 0 and another base", _rope_inputs(start=True, base=True), "call", _judge_rope_complex),
            Case("float64 stays exact", _rope_inputs(start=True, dtype=torch.float64, long=True), "call",
                 _judge_rope_complex),
        ),
        hidden=(
            Case("start_pos > 0", _rope_inputs(start=True), "call", _judge_rope_complex),
            Case("score depends only on m - n", _rope_relative_inputs, "rope_scores", _judge_rope_relative),
        ),
        # Multiply by e^(iθ): the pairwise rotation with cos and sin is the other exercise.
        forbidden=("cos", "cos_", "sin", "sin_"),
    ),
    "alibi_slopes": Check(
        name="alibi_slopes",
        visible=(
            Case("8 heads: 1/2, 1/4, …, 1/256", _slopes_inputs((8,)), "call", _judge_slopes),
            Case("powers of two", _slopes_inputs((1, 2, 4, 16, 32)), "call", _judge_slopes),
            Case("6 heads, not a power of two", _slopes_inputs((6,)), "call", _judge_slopes),
            Case("n_heads not a positive int raises ValueError (0, negative, not an int)",
                 _bad_inputs("alibi_slopes", ("n_heads is 0", (0,), {}, "n_heads"),
                             ("n_heads is negative", (-4,), {}, "n_heads"),
                             ("n_heads is not an int", (2.5,), {}, "n_heads")),
                 "call_each", _judge_value_errors),
        ),
        hidden=(
            Case("other head counts that are not positive ints raise ValueError",
                 _bad_inputs("alibi_slopes", ("n_heads is negative", (-1,), {}, "n_heads"),
                             ("n_heads is not an int", (4.0,), {}, "n_heads")),
                 "call_each", _judge_value_errors),
            Case("head counts that are not powers of two", _slopes_inputs((3, 5, 7, 12, 20, 24, 28)), "call",
                 _judge_slopes),
            Case("more non-powers of two", _slopes_inputs((9, 10, 11, 13, 14, 15, 17, 30)), "call", _judge_slopes),
        ),
    ),
    "alibi_bias": Check(
        name="alibi_bias",
        visible=(
            Case("square, power-of-two heads", _bias_inputs(square=True), "call", _judge_bias),
            Case("seq_q < seq_k: end-aligned", _bias_inputs(square=False), "call", _judge_bias),
            Case("head counts that are not powers of two", _bias_inputs(square=True, power_of_two=False), "call",
                 _judge_bias),
            Case("seq_q or seq_k not a positive int raises ValueError (each rule in turn)",
                 _bad_inputs("alibi_bias", ("seq_q is below 1", (4, 0, 3), {}, "seq_q"),
                             ("seq_k is below 1", (4, 2, 0), {}, "seq_k"),
                             ("seq_q is not an int", (4, 1.5, 3), {}, "seq_q"),
                             ("seq_k is not an int", (2, 2, 3.0), {}, "seq_k")),
                 "call_each", _judge_value_errors),
        ),
        hidden=(
            Case("negative sizes raise ValueError",
                 _bad_inputs("alibi_bias", ("seq_q is below 1", (2, -2, 4), {}, "seq_q"),
                             ("seq_k is below 1", (8, 1, -1), {}, "seq_k")),
                 "call_each", _judge_value_errors),
            Case("end-aligned, any head count", _bias_inputs(square=False, power_of_two=False), "call", _judge_bias),
        ),
    ),
}


run = core.runner(__name__)  # run(name, obj, *, level="visible", seed=0): the notebook's entry point


__all__ = ["CHECKS", "run", "CheckFailed"]
