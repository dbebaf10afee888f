"""Checks for chapter 1, attention by hand (``solutions.attention``).

The references are computed here from plain ``torch`` operations and
``F.scaled_dot_product_attention``, independently of ``solutions``; the judges
then look for the usual mistakes to name them in the hint. What computes an
exercise's answer (the scores, the masks, attention with masks) is in functions
marked ``@core.recorded``: a student edition that withholds this chapter replays
their results on the visible cases and holds none of their code.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from autograder.checks import core
from autograder.checks.core import Case, Check, CheckFailed, expect_close, fail

# Not called here (the answers are computed independently of it): where a student edition withholds it, this is a
# core.Withheld and the @core.recorded functions below replay their recorded results.
reference = core.reference("solutions.attention")


def _randn(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _tol(dtype: torch.dtype) -> dict[str, float]:
    if dtype == torch.float16:
        return {"atol": 2e-2, "rtol": 2e-2}
    if dtype == torch.float64:
        return {"atol": 1e-9, "rtol": 1e-7}
    return {"atol": 1e-5, "rtol": 1e-4}


def _out(outputs: dict[str, Any]) -> Any:
    return outputs["out"]


# --- attention_scores ---------------------------------------------------------


def _scores_inputs(*lead: int, seq_q: int, seq_k: int, d_head: int, dtype: torch.dtype = torch.float32):
    def inputs(gen: torch.Generator) -> dict[str, Any]:
        q = _randn(gen, *lead, seq_q, d_head, dtype=dtype)
        k = _randn(gen, *lead, seq_k, d_head, dtype=dtype)
        return {"args": (q, k)}

    return inputs


@core.recorded
def _scores_of(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q kᵀ / √d_k, computed in float64, in q's dtype."""
    return (q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])).to(q.dtype)


def _judge_scores(inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    q, k = inputs["args"]
    got = _out(outputs)
    d_head = q.shape[-1]
    expected = _scores_of(q, k)
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype != q.dtype:
        fail(f"keep the input dtype: q is {q.dtype}, your scores are {got.dtype}")
    if isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(expected.transpose(-2, -1).shape) and q.shape[-2] != k.shape[-2]:
        fail("scores must be (..., seq_q, seq_k): one row per query, one column per key — compute q @ kᵀ, not k @ qᵀ")
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        for factor, hint in (
            (math.sqrt(d_head), f"your scores are √d_k = {math.sqrt(d_head):.3g}× too large: divide q·k by √d_k"),
            (1 / math.sqrt(d_head), f"your scores are √d_k = {math.sqrt(d_head):.3g}× too small: divide by √d_k, not by d_k"),
        ):
            if torch.allclose(got.double(), expected.double() * factor, **_tol(q.dtype)):
                fail(hint)
    expect_close(got, expected, "scores should be q @ kᵀ / √d_k over the last axis (d_head)", **_tol(q.dtype))


# --- softmax ------------------------------------------------------------------


def _softmax_inputs(*shape: int, dim: int | None = None, dtype: torch.dtype = torch.float32, scale: float = 1.0,
                    offset: float = 0.0, row_offsets: bool = False):
    def inputs(gen: torch.Generator) -> dict[str, Any]:
        x = _randn(gen, *shape, dtype=torch.float64, scale=scale) + offset
        if row_offsets:  # rows on very different scales: a global max underflows the small rows
            x = x + torch.linspace(0, 2000, shape[0], dtype=torch.float64).reshape(-1, *([1] * (len(shape) - 1)))
        return {"args": (x.to(dtype),), "kwargs": {} if dim is None else {"dim": dim}}

    return inputs


def _judge_softmax(inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    (x,) = inputs["args"]
    dim = inputs["kwargs"].get("dim", -1)
    got = _out(outputs)
    expected = torch.softmax(x.double(), dim=dim).to(x.dtype)
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        if got.dtype != x.dtype:
            fail(f"keep the input dtype: x is {x.dtype}, your output is {got.dtype}")
        if not torch.isfinite(got).all():
            fail("your softmax gives NaN or inf: exp overflows on large logits, or a whole slice underflows to 0/0 "
                 "if you subtract one global max. Subtract the max of each slice along `dim` (keepdim=True) "
                 "before exp; the shift cancels in the ratio")
        if not torch.allclose(got.double().sum(dim=dim), torch.ones(()).double(), atol=1e-3):
            other = [d for d in range(x.dim()) if d != dim % x.dim()]
            if any(torch.allclose(got.double().sum(dim=d), torch.ones(()).double(), atol=1e-3) for d in other):
                fail(f"your output sums to 1 along another axis: normalise along dim={dim}, the `dim` argument")
            fail(f"your output does not sum to 1 along dim={dim}: divide exp(x) by its sum along dim (keepdim=True); "
                 "if you subtracted one global max, small rows underflow to 0/0 — subtract the max of each row")
    expect_close(got, expected, f"softmax along dim={dim} differs from exp(x) / sum(exp(x))", **_tol(x.dtype))


# --- causal_mask --------------------------------------------------------------


def _causal_inputs(seq_q: int | None = None, seq_k: int | None = None, *, extra: int | None = None):
    """Sizes fixed, or drawn from ``gen``: seq_q in [1, 8], seq_k = seq_q + extra."""

    def inputs(gen: torch.Generator) -> dict[str, Any]:
        q = seq_q if seq_q is not None else int(torch.randint(1, 9, (), generator=gen))
        if extra is not None:
            return {"args": (q, q + extra)}
        return {"args": (q,) if seq_k is None else (q, seq_k)}

    return inputs


def _bad_calls(*calls: tuple[str, tuple, dict, str]):
    """Every call of ``calls`` ((the call as written, args, kwargs, the argument its ValueError must name)) in
    turn, for the ``call_each`` probe: one case tries every rule it lists, whatever the seed. Tensor
    arguments are given as functions of ``gen``."""

    def inputs(gen: torch.Generator) -> dict[str, Any]:
        made = [(tuple(a(gen) if callable(a) else a for a in args), kwargs) for _, args, kwargs, _ in calls]
        return {"calls": made, "rules": [(what, argument) for what, _, _, argument in calls]}

    return inputs


def _causal_bad(*sizes: tuple[tuple[int, ...], str]):
    return _bad_calls(*((f"causal_mask{args}".replace(",)", ")"), args, {}, argument) for args, argument in sizes))


def _judge_value_errors(inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    """Each call must raise its ValueError; the hint names the first rule that is not checked."""
    for (what, argument), result in zip(inputs["rules"], outputs["results"]):
        core.expect_value_error(result["error"], what, argument)


@core.recorded
def _causal_masks(seq_q: int, seq_k: int) -> dict[str, torch.Tensor]:
    """The end-aligned causal mask ("expected") and the masks of the usual mistakes."""
    i, j, offset = torch.arange(seq_q).unsqueeze(1), torch.arange(seq_k).unsqueeze(0), seq_k - seq_q
    return {"expected": j <= i + offset, "no_diagonal": j < i + offset, "next_visible": j <= i + offset + 1,
            "top_left": j <= i}


def _judge_causal(inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    seq_q = inputs["args"][0]
    seq_k = inputs["args"][1] if len(inputs["args"]) > 1 else seq_q
    got = _out(outputs)
    masks = _causal_masks(seq_q, seq_k)
    expected = masks["expected"]
    if not isinstance(got, torch.Tensor):
        fail(f"expected a torch.Tensor, got {type(got).__name__}")
    if got.dtype != torch.bool:
        fail(f"return a bool tensor (True = may attend), not {got.dtype}: use dtype=torch.bool or a comparison")
    if tuple(got.shape) != (seq_q, seq_k):
        fail(f"wrong shape: got {tuple(got.shape)}, expected (seq_q, seq_k) = {(seq_q, seq_k)}")
    if torch.equal(got, expected):
        return
    if torch.equal(got, ~expected) or (seq_q > 1 and torch.equal(got, ~masks["no_diagonal"])):
        fail("your mask has the wrong polarity: True must mean 'may attend' (the past and the token itself)")
    if torch.equal(got, masks["no_diagonal"]):
        fail("a token must see itself: keep the diagonal (tril with diagonal=0, not -1)")
    if torch.equal(got, masks["next_visible"]):
        fail("your mask lets each token see the next one: the diagonal is off by one")
    if seq_k != seq_q and torch.equal(got, masks["top_left"]):
        fail("with seq_k > seq_q (earlier keys in a cache) align the mask to the end: query i sees keys "
             "j <= i + (seq_k - seq_q), i.e. tril(diagonal=seq_k - seq_q); the last query sees every key")
    expect_close(got, expected, "query i may attend key j iff j <= i + (seq_k - seq_q)")


# --- padding_mask -------------------------------------------------------------


def _padding_inputs(batch: int, seq_k: int, *, pad_id: int = 0, left: bool = False, all_pad_row: bool = False,
                    dtype: torch.dtype = torch.int64):
    def inputs(gen: torch.Generator) -> dict[str, Any]:
        tokens = torch.randint(1, 50, (batch, seq_k), generator=gen)
        tokens = torch.where(tokens == pad_id, tokens + 1, tokens)  # real tokens never equal pad_id
        lengths = torch.randint(1, seq_k + 1, (batch,), generator=gen)
        lengths[0] = seq_k - 1  # at least one row with padding
        if all_pad_row:
            lengths[-1] = 0
        pos = torch.arange(seq_k).unsqueeze(0)
        real = pos >= (seq_k - lengths).unsqueeze(1) if left else pos < lengths.unsqueeze(1)
        tokens = torch.where(real, tokens, torch.full_like(tokens, pad_id)).to(dtype)
        return {"args": (tokens, pad_id)}

    return inputs


@core.recorded
def _padding_masks(tokens: torch.Tensor, pad_id: int) -> dict[str, torch.Tensor]:
    """True on the real tokens, shaped to broadcast over the keys ("expected"), and the same with pad id 0."""
    batch, seq_k = tokens.shape
    return {"expected": (tokens != pad_id).reshape(batch, 1, 1, seq_k),
            "pad_zero": (tokens != 0).reshape(batch, 1, 1, seq_k)}


def _judge_padding(inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    tokens, pad_id = inputs["args"]
    got = _out(outputs)
    batch, seq_k = tokens.shape
    masks = _padding_masks(tokens, pad_id)
    expected = masks["expected"]
    if not isinstance(got, torch.Tensor):
        fail(f"expected a torch.Tensor, got {type(got).__name__}")
    if got.dtype != torch.bool:
        fail(f"return a bool tensor (True = real token), not {got.dtype}")
    if tuple(got.shape) == (batch, seq_k):
        fail("shape (batch, seq_k) does not broadcast against scores (batch, heads, seq_q, seq_k): "
             "return (batch, 1, 1, seq_k)")
    if tuple(got.shape) == (batch, 1, seq_k, 1):
        fail("your mask hides padded queries, not padded keys: the pad axis must be the last one, (batch, 1, 1, seq_k)")
    if tuple(got.shape) != (batch, 1, 1, seq_k):
        fail(f"wrong shape: got {tuple(got.shape)}, expected (batch, 1, 1, seq_k) = {(batch, 1, 1, seq_k)}")
    if torch.equal(got, expected):
        return
    if torch.equal(got, ~expected):
        fail("wrong polarity: True must mean 'real token, may attend', False = padding")
    if pad_id != 0 and torch.equal(got, masks["pad_zero"]):
        fail(f"use the pad_id argument (here {pad_id}), not a hard-coded 0")
    expect_close(got, expected, "True where tokens != pad_id, False on padding")


# --- scaled_dot_product_attention --------------------------------------------


def _sdpa_inputs(batch: int, heads: int, seq_q: int, seq_k: int, d_head: int, *, mask: str | None = None,
                 dtype: torch.dtype = torch.float32, large: bool = False, grad: bool = False):
    """``mask``: None, "causal", "padding" (batch, 1, 1, seq_k), "full_row" (one query sees nothing), "random"."""

    def inputs(gen: torch.Generator) -> dict[str, Any]:
        q = _randn(gen, batch, heads, seq_q, d_head, dtype=torch.float64)
        k = _randn(gen, batch, heads, seq_k, d_head, dtype=torch.float64)
        v = _randn(gen, batch, heads, seq_k, d_head, dtype=torch.float64)
        if large:  # every score around -5e4: a -1e4 fill would then outweigh the real keys
            q, k = -q.abs() * 150, k.abs() * 150
        m = None
        if mask == "causal":
            m = core.end_aligned_causal_mask(seq_q, seq_k)  # PyTorch's own end-aligned mask (see there)
        elif mask == "padding":
            lengths = torch.randint(1, seq_k + 1, (batch,), generator=gen)
            lengths[0] = max(1, seq_k // 2)
            m = (torch.arange(seq_k) < lengths.unsqueeze(1)).reshape(batch, 1, 1, seq_k)
        elif mask in ("full_row", "random"):
            m = torch.rand(batch, heads, seq_q, seq_k, generator=gen) < 0.6
            m[..., 0] |= mask == "random"
            if mask == "full_row":
                m[:, :, 1, :] = False
                m[:, :, 0, 0] = True
        args = (q.to(dtype), k.to(dtype), v.to(dtype), m)
        out: dict[str, Any] = {"args": args}
        if grad:
            out["grad_args"] = [0, 1, 2]
            out["cotangent"] = _randn(gen, batch, heads, seq_q, d_head, dtype=dtype)
        return out

    return inputs


def _sdpa_of(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
    """F.scaled_dot_product_attention in float64, with fully masked rows set to zero; and the weights."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    if mask is None:
        out = F.scaled_dot_product_attention(q, k, v)
    else:
        live = mask.any(dim=-1, keepdim=True)
        safe = mask | ~live  # sdpa would give NaN on rows with no key; compute them on all keys, then zero them
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe) * live
    return out, weights


@core.recorded
def _sdpa_answers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> dict[str, Any]:
    """The output and weights of attention with ``mask``, in float64; the outputs of the scale mistakes and the
    weights with the mask inverted."""
    d_head = q.shape[-1]
    out, weights = _sdpa_of(q, k, v, mask)
    answers = {"out": out, "weights": weights,
               "unscaled_out": _sdpa_of(q.double() * math.sqrt(d_head), k, v, mask)[0],
               "d_k_out": _sdpa_of(q.double() / math.sqrt(d_head), k, v, mask)[0]}
    if mask is not None:
        answers["inverted_weights"] = _sdpa_of(q, k, v, ~mask)[1]
    return answers


@core.recorded
def _sdpa_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                cotangent: torch.Tensor) -> list[torch.Tensor]:
    """The gradients of sum(output · cotangent) with respect to q, k and v, in float64."""
    qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    out, _ = _sdpa_of(qd, kd, vd, mask)
    (out * cotangent.double()).sum().backward()
    return [qd.grad, kd.grad, vd.grad]


_POLARITY = "your mask has the wrong polarity: True = may attend; fill where the mask is False (~mask)"


def _judge_sdpa_mask(w: torch.Tensor, mask: torch.Tensor, answers: dict[str, Any], tol: dict[str, float]) -> None:
    """With a mask: inverted polarity first (the weights of ~mask on the rows that see some keys and not others,
    whatever the fill and the zeroing), then masked keys that keep some weight."""
    ref_w = answers["weights"]
    allowed = mask.expand(ref_w.shape)
    live, mixed = allowed.any(dim=-1), allowed.any(dim=-1) & ~allowed.all(dim=-1)
    if mixed.any() and torch.isfinite(w[mixed]).all() and torch.allclose(w[mixed], answers["inverted_weights"][mixed],
                                                                          **tol):
        fail(_POLARITY)
    if not torch.isfinite(w).all():
        if not live.all():
            fail("a query whose keys are all masked gives NaN: a -inf fill makes softmax 0/0. Fill with "
                 "torch.finfo(scores.dtype).min and set the weights of fully masked rows to 0")
        return
    if torch.equal(w != 0, ~allowed & live.unsqueeze(-1)) or (w * allowed).abs().amax() < 1e-6 < w.abs().amax():
        fail(_POLARITY)
    if ((w.abs() > 1e-3) & ~allowed).any():
        if live.all() and torch.allclose(w.sum(-1), torch.ones(()).double(), atol=1e-3):
            fail("masked keys still get weight: fill the scores where mask is False with a very negative number "
                 "before softmax. -1e4 is not enough when scores are large; use torch.finfo(dtype).min")
        fail("masked keys still get weight, or fully masked rows are not zero: fill the scores where "
             "mask is False before softmax, and zero the weights of rows with no key left")


def _judge_sdpa(inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    q, k, v, mask = inputs["args"]
    got = _out(outputs)
    answers = _sdpa_answers(q, k, v, mask)
    ref_out, ref_w = answers["out"], answers["weights"]
    tol = _tol(q.dtype)
    if "grads" in outputs:  # call_with_grad keeps only the output
        _judge_grads(inputs, outputs, ref_out)
        return
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail("return a tuple (output, weights)")
    out, weights = got
    if not isinstance(weights, torch.Tensor) or not isinstance(out, torch.Tensor):
        fail("return a tuple of two tensors (output, weights)")
    if tuple(weights.shape) != tuple(ref_w.shape):
        fail(f"weights have shape {tuple(weights.shape)}, expected (batch, heads, seq_q, seq_k) = {tuple(ref_w.shape)}")
    if weights.dtype != q.dtype or out.dtype != q.dtype:
        fail(f"keep the input dtype {q.dtype}; got output {out.dtype} and weights {weights.dtype}")
    w = weights.double()
    if mask is not None:
        _judge_sdpa_mask(w, mask, answers, tol)
    if not torch.isfinite(w).all():
        fail("your weights contain NaN or inf: use your stable softmax and a finite fill value "
             "(-1e9 overflows to -inf in float16; torch.finfo(dtype).min does not)")
    live = torch.ones(ref_w.shape[:-1], dtype=torch.bool) if mask is None else mask.expand(ref_w.shape).any(dim=-1)
    if not torch.allclose(w.sum(dim=-1)[live], torch.ones(()).double(), atol=1e-2):
        if mask is not None and (w <= ref_w + 1e-6).all():
            fail("your weights do not sum to 1: apply the mask to the scores BEFORE the softmax, not to the weights after")
        fail("your weights do not sum to 1 over the keys: softmax over dim=-1 (the keys), not dim=-2")
    if (w[~live] != 0).any():
        fail("a query whose keys are all masked must attend to nothing: its weights and output should be 0")
    for key, hint in (("unscaled_out", "the scores are not divided by √d_k: your weights are too peaked"),
                      ("d_k_out", "the scores are divided by d_k instead of √d_k: your weights are too flat")):
        scaled = answers[key]
        if q.dtype != torch.float16 and not torch.allclose(ref_out, scaled, atol=1e-4) and torch.allclose(out.double(), scaled, **tol):
            fail(hint)
    expect_close(weights, ref_w.to(q.dtype), "weights differ from softmax(q kᵀ / √d_k) with the mask", **tol)
    expect_close(out, ref_out.to(q.dtype), "output differs from weights @ v", **tol)


def _judge_grads(inputs: dict[str, Any], outputs: dict[str, Any], ref_out: torch.Tensor) -> None:
    q, k, v, mask = inputs["args"]
    tol = _tol(q.dtype)
    ref_grads = _sdpa_grads(q, k, v, mask, inputs["cotangent"])
    expect_close(outputs["out"], ref_out.to(q.dtype), "output differs from softmax(q kᵀ / √d_k) v", **tol)
    for name, g, r in zip("qkv", outputs["grads"], ref_grads):
        if g is None or (g.abs().amax() == 0 and r.abs().amax() > 0):
            fail(f"no gradient reaches {name}: do not detach, use .data, or compute under torch.no_grad() "
                 "— the model could not learn its projections")
        expect_close(g, r.to(q.dtype), f"the gradient with respect to {name} is wrong", **tol)


# --- tiled_attention ----------------------------------------------------------

# On the large case the full (seq_q, seq_k) scores are 256 MB in float32: the call may add 160 MB to the kernel's
# peak resident memory. A tiled reference adds about 79 MB there, nearly all of it the request and the answer
# (8 MB of encoded inputs, decoded, and the output encoded) and the same whatever the sequence length; the blocks
# of 128 keys take 4 MB. One full score matrix alone is 256 MB.
TILED_PEAK_BYTES = 160 * 2**20
TILED_PEAK_HINT = ("your code held about as much memory at once as the full (seq_q, seq_k) score matrix, whatever "
                   "library computed it: keep only (seq_q, block_size) scores at a time")


def _tiled_inputs(lead: tuple[int, ...], seq_q: int, seq_k: int, d_head: int, block_size: int, *,
                  dtype: torch.dtype = torch.float32, large: bool = False):
    """``large``: scores in the thousands, some rows all positive (exp overflows), some all negative (underflows)."""

    def inputs(gen: torch.Generator) -> dict[str, Any]:
        q = _randn(gen, *lead, seq_q, d_head, dtype=torch.float64)
        k = _randn(gen, *lead, seq_k, d_head, dtype=torch.float64)
        v = _randn(gen, *lead, seq_k, d_head, dtype=torch.float64)
        if large:
            sign = torch.ones(seq_q, 1, dtype=torch.float64)
            sign[1::2] = -1.0  # odd queries: every score around -1000
            q, k = q.abs() * sign * 40, k.abs() * 40
        return {"args": (q.to(dtype), k.to(dtype), v.to(dtype)), "kwargs": {"block_size": block_size}}

    return inputs


def _qkv(gen: torch.Generator) -> torch.Tensor:
    return _randn(gen, 1, 2, 3, 4)


def _tiled_bad(*sizes: Any):
    return _bad_calls(*((f"tiled_attention(q, k, v, block_size={size})", (_qkv, _qkv, _qkv), {"block_size": size},
                         "block_size") for size in sizes))


_SDPA_FLOAT_MASK = _bad_calls(("scaled_dot_product_attention(q, k, v, mask=<a float 0/1 mask>)",
                               # 0/1 floats: added to the scores, such a mask would hide nothing
                               (_qkv, _qkv, _qkv, torch.ones(3, 3).tril()), {}, "mask"))


def _judge_tiled(inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
    q, k, v = inputs["args"]
    block_size = inputs["kwargs"]["block_size"]
    got = _out(outputs)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double()).to(q.dtype)
    tol = _tol(q.dtype)
    if not isinstance(got, torch.Tensor):
        fail(f"return the output tensor, not {type(got).__name__}")
    if tuple(got.shape) != tuple(expected.shape):
        fail(f"wrong shape: got {tuple(got.shape)}, expected (..., seq_q, d_head) = {tuple(expected.shape)}")
    if got.dtype != q.dtype:
        fail(f"keep the input dtype: q is {q.dtype}, your output is {got.dtype}")
    if not torch.isfinite(got).all():
        fail("your output has NaN or inf: exp overflows (or every term underflows to 0/0) when the scores are "
             "large. Keep a running max m per query, start it at -inf, take exp(scores - m_new), and rescale "
             "the running sum and output by exp(m_old - m_new) when the max grows")
    seq_k = k.shape[-2]
    if not torch.allclose(got.double(), expected.double(), **tol):
        whole = seq_k - seq_k % block_size
        qd, kd, vd = q.double(), k.double(), v.double()
        mistakes = [(math.sqrt(q.shape[-1]), "the scores are not divided by √d_k"),
                    (1 / math.sqrt(q.shape[-1]), "the scores are divided by d_k instead of √d_k")]
        for factor, hint in mistakes:
            if torch.allclose(got.double(), F.scaled_dot_product_attention(qd * factor, kd, vd), **tol):
                fail(hint)
        if seq_k % block_size and whole and torch.allclose(
                got.double(), F.scaled_dot_product_attention(qd, kd[..., :whole, :], vd[..., :whole, :]), **tol):
            fail(f"the last {seq_k % block_size} keys are ignored: with seq_k={seq_k} and block_size={block_size} "
                 "the last block is shorter; loop with range(0, seq_k, block_size)")
        expect_close(got, expected, "your output differs from softmax(q kᵀ / √d_k) v: when the running max grows, "
                     "multiply BOTH the running sum and the running output by exp(m_old - m_new), and divide the "
                     "output by the running sum once, at the end", **tol)
    largest, full = outputs.get("largest"), q[..., 0].numel() * seq_k
    if block_size < seq_k and isinstance(largest, int) and largest >= full:
        fail(f"your code built a tensor of {largest} numbers, as large as all the (seq_q, seq_k) scores "
             f"({full}): that is what tiling avoids. Compute the scores of one block of block_size keys at a "
             "time and keep only a running max, sum and output per query")


def _case(name: str, inputs, judge, probe: str = "call") -> Case:
    return Case(name=name, inputs=inputs, probe=probe, judge=judge)


# Visible cases check what each exercise is for (stability, alignment, the fully masked row, the pad id
# argument...); hidden cases are the same properties on fresh seeds, shapes and dtypes, plus edge cases.
_SCORES = (
    _case("q kᵀ / √d_k with heads and seq_q != seq_k", _scores_inputs(2, 2, seq_q=3, seq_k=5, d_head=8), _judge_scores),
    _case("float64 stays float64", _scores_inputs(1, seq_q=4, seq_k=2, d_head=16, dtype=torch.float64), _judge_scores),
)
_SOFTMAX = (
    _case("rows of a (4, 5) matrix", _softmax_inputs(4, 5), _judge_softmax),
    _case("large logits (around 1000) do not overflow", _softmax_inputs(3, 6, scale=10.0, offset=1000.0), _judge_softmax),
    _case("rows on very different scales", _softmax_inputs(4, 5, scale=3.0, row_offsets=True), _judge_softmax),
    _case("dim=0", _softmax_inputs(5, 3, dim=0), _judge_softmax),
)
_CAUSAL = (
    _case("causal_mask(4)", _causal_inputs(4), _judge_causal),
    _case("3 queries after 3 cached keys: causal_mask(3, 6) is aligned to the end", _causal_inputs(3, 6), _judge_causal),
    _case("seq_k < seq_q raises ValueError", _causal_bad(((5, 3), "seq_k")), _judge_value_errors, probe="call_each"),
    _case("sizes below 1 raise ValueError", _causal_bad(((0,), "seq_q"), ((3, 0), "seq_k")), _judge_value_errors,
          probe="call_each"),
)
_PADDING = (
    _case("pad_id = 0, padding on the right", _padding_inputs(3, 6), _judge_padding),
    _case("pad_id = 3, padding on the left", _padding_inputs(4, 7, pad_id=3, left=True), _judge_padding),
)
_SDPA = (
    _case("no mask, against F.scaled_dot_product_attention", _sdpa_inputs(2, 2, 4, 4, 8), _judge_sdpa),
    _case("causal mask", _sdpa_inputs(1, 2, 5, 5, 8, mask="causal"), _judge_sdpa),
    _case("padding mask (batch, 1, 1, seq_k), seq_q != seq_k", _sdpa_inputs(3, 2, 3, 6, 16, mask="padding"), _judge_sdpa),
    _case("a query with every key masked", _sdpa_inputs(2, 2, 4, 5, 8, mask="full_row"), _judge_sdpa),
    # float64: in float32, scores of 5e4 are only exact to ~0.004, so near-ties would make the
    # reference itself disagree with a correct answer now and then.
    _case("large scores (around -5e4) with a mask, float64",
          _sdpa_inputs(1, 2, 4, 6, 4, mask="random", large=True, dtype=torch.float64), _judge_sdpa),
    _case("float16 with a causal mask", _sdpa_inputs(1, 2, 4, 4, 8, mask="causal", dtype=torch.float16), _judge_sdpa),
    _case("gradients flow to q, k and v", _sdpa_inputs(1, 2, 3, 4, 8, mask="causal", grad=True), _judge_sdpa,
          probe="call_with_grad"),
    _case("a float mask raises ValueError (_check_mask)", _SDPA_FLOAT_MASK, _judge_value_errors, probe="call_each"),
)
_TILED = (
    _case("equals F.scaled_dot_product_attention, 8 blocks of 8 keys", _tiled_inputs((1, 2), 6, 64, 4, 8),
          _judge_tiled, probe="call_tracking_size"),
    _case("seq_k = 40 is not a multiple of block_size = 6", _tiled_inputs((2, 1), 5, 40, 4, 6), _judge_tiled,
          probe="call_tracking_size"),
    _case("scores around ±2000 (float64): no overflow, no 0/0", _tiled_inputs((1, 1), 6, 24, 4, 5,
          dtype=torch.float64, large=True), _judge_tiled, probe="call_tracking_size"),
    _case("block_size that is not a positive int (0, -8, 2.5) raises ValueError", _tiled_bad(0, -8, 2.5),
          _judge_value_errors, probe="call_each"),
)

CHECKS: dict[str, Check] = {
    "attention_scores": Check(
        name="attention_scores",
        visible=_SCORES,
        hidden=(
            _case("seq_q != seq_k, d_head = 16", _scores_inputs(2, 3, seq_q=4, seq_k=7, d_head=16), _judge_scores),
            _case("float64 and d_head = 64", _scores_inputs(1, seq_q=5, seq_k=2, d_head=64, dtype=torch.float64), _judge_scores),
            _case("no batch axis", _scores_inputs(seq_q=3, seq_k=5, d_head=4), _judge_scores),
        ),
        forbidden=("*scaled_dot_product*",),
    ),
    "softmax": Check(
        name="softmax",
        visible=_SOFTMAX,
        hidden=(
            _case("logits around -1000 do not underflow to 0/0", _softmax_inputs(2, 7, scale=5.0, offset=-1000.0), _judge_softmax),
            _case("dim=1 of a 3-d tensor, float64", _softmax_inputs(2, 4, 3, dim=1, dtype=torch.float64), _judge_softmax),
            _case("dim=-2 of a 3-d tensor", _softmax_inputs(3, 5, 2, dim=-2), _judge_softmax),
            _case("float16 logits around 100", _softmax_inputs(2, 8, scale=4.0, offset=100.0, dtype=torch.float16), _judge_softmax),
        ),
        forbidden=("*softmax*", "softmin", "logsumexp"),
    ),
    "causal_mask": Check(
        name="causal_mask",
        visible=_CAUSAL,
        hidden=(
            _case("square masks of random size", _causal_inputs(), _judge_causal),
            _case("seq_q < seq_k: aligned to the end (a cache of earlier keys)", _causal_inputs(extra=3), _judge_causal),
            _case("one new query over 6 keys sees them all", _causal_inputs(1, 6), _judge_causal),
            _case("causal_mask(5, 5)", _causal_inputs(5, 5), _judge_causal),
            _case("negative sizes raise ValueError", _causal_bad(((-2, 4), "seq_q"), ((2, -1), "seq_k")),
                  _judge_value_errors, probe="call_each"),
        ),
    ),
    "padding_mask": Check(
        name="padding_mask",
        visible=_PADDING,
        hidden=(
            _case("a row made only of padding", _padding_inputs(3, 5, all_pad_row=True), _judge_padding),
            _case("int32 tokens, batch of one, pad_id = 1", _padding_inputs(1, 4, pad_id=1, dtype=torch.int32), _judge_padding),
            _case("pad_id = 7, padding on the right", _padding_inputs(5, 9, pad_id=7), _judge_padding),
        ),
    ),
    "scaled_dot_product_attention": Check(
        name="scaled_dot_product_attention",
        visible=_SDPA,
        hidden=(
            _case("end-aligned causal mask, float64", _sdpa_inputs(2, 1, 3, 5, 4, mask="causal", dtype=torch.float64), _judge_sdpa),
            _case("a random mask, seq_q != seq_k", _sdpa_inputs(2, 3, 5, 7, 8, mask="random"), _judge_sdpa),
            _case("every key of a query masked, float64", _sdpa_inputs(1, 1, 3, 4, 4, mask="full_row",
                                                                        dtype=torch.float64), _judge_sdpa),
        ),
        forbidden=("*scaled_dot_product*", "*softmax*", "softmin", "logsumexp"),
    ),
    "tiled_attention": Check(
        name="tiled_attention",
        visible=_TILED,
        hidden=(
            _case("one key per block", _tiled_inputs((2, 2), 5, 9, 4, 1), _judge_tiled, probe="call_tracking_size"),
            _case("block_size larger than seq_k", _tiled_inputs((1, 3), 3, 7, 2, 16), _judge_tiled,
                  probe="call_tracking_size"),
            _case("no batch axis, float64", _tiled_inputs((), 7, 33, 4, 6, dtype=torch.float64), _judge_tiled,
                  probe="call_tracking_size"),
            _case("scores around ±2000, seq_k not a multiple of block_size", _tiled_inputs((2, 1), 8, 29, 4, 4,
                  dtype=torch.float64, large=True), _judge_tiled, probe="call_tracking_size"),
            _case("block_size -1 or 3.0 raises ValueError", _tiled_bad(-1, 3.0), _judge_value_errors, probe="call_each"),
            # whatever library computes the scores (numpy too): the peak memory of the call, measured from outside
            Case("seq 8192, the full score matrix would take 256 MB", _tiled_inputs((1, 1), 8192, 8192, 64, 128),
                 "call", _judge_tiled, memory=(TILED_PEAK_BYTES, TILED_PEAK_HINT), seeds=1),
        ),
        forbidden=("*scaled_dot_product*", "*softmax*", "softmin", "logsumexp"),
    ),
}


run = core.runner(__name__)  # run(name, obj, *, level="visible", seed=0): the notebook's entry point


__all__ = ["CHECKS", "CheckFailed", "run"]
