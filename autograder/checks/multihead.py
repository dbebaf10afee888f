"""Checks for chapter 2, multi-head attention (the reference is :mod:`solutions.multihead`).

Each judge compares with an independent reference (plain ``view``/``transpose``,
``repeat_interleave``, ``nn.MultiheadAttention`` with copied weights,
``F.scaled_dot_product_attention``) and, when the answer is wrong, recomputes the
usual mistakes to name the one that was made. What computes an exercise's answer
(the layouts, attention by hand, the gradient norm) is in functions marked
``@core.recorded``: a student edition that withholds this chapter replays their
results on the visible cases and holds none of their code.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from autograder.checks import core
from autograder.checks.core import (Case, Check, CheckFailed, expect, expect_close, expect_value_error, fail, rand_int,
                                    same)
reference = core.reference("solutions.multihead")  # in a student edition: replayed from a recording


def _bad_calls(*calls: tuple[str, tuple, dict, str]):
    """Inputs for ``call_each``: every call of ``calls`` ((what is wrong, args, kwargs, the argument its ValueError
    must name)) in turn, the same ones whatever the seed; tensors are given by their shape."""

    def inputs(gen: torch.Generator) -> dict:
        made = [(tuple(torch.randn(*a, generator=gen) if isinstance(a, torch.Size) else a for a in args), kwargs)
                for _, args, kwargs, _ in calls]
        return {"calls": made, "rules": [(what, argument) for what, _, _, argument in calls]}

    return inputs


def _judge_value_errors(inputs: dict, outputs: dict) -> None:
    """Each call must raise a ValueError naming its argument; the hint names the first rule that is not checked."""
    for (what, argument), result in zip(inputs["rules"], outputs["results"]):
        expect_value_error(result["error"], what, argument)


def _shape(*sizes: int) -> torch.Size:
    return torch.Size(sizes)


# --- split_heads ---------------------------------------------------------------------------------


def _split_inputs(gen: torch.Generator, heads_range=(2, 6), d_head_range=(2, 6)) -> dict:
    batch, seq = rand_int(gen, 1, 3), rand_int(gen, 2, 5)
    heads, d_head = rand_int(gen, *heads_range), rand_int(gen, *d_head_range)
    if heads == d_head:  # keep the (heads d_head) / (d_head heads) mix-up visible in the shape
        d_head += 1
    return {"args": (torch.randn(batch, seq, heads * d_head, generator=gen), heads)}


@core.recorded
def _split_of(x: Tensor, heads: int) -> Tensor:
    batch, seq, d_model = x.shape
    return x.view(batch, seq, heads, d_model // heads).transpose(1, 2)


def _judge_split(inputs: dict, outputs: dict) -> None:
    x, heads = inputs["args"]
    batch, seq, d_model = x.shape
    d_head = d_model // heads
    expect(
        outputs["out"],
        _split_of(x, heads),
        "head h must hold features h·d_head … (h+1)·d_head - 1 of every token, in shape (batch, heads, seq, d_head)",
        [
            (
                x.view(batch, seq, d_head, heads).permute(0, 3, 1, 2),
                "your heads take every n_heads-th feature: you split the last axis as (d_head heads); "
                "it is (heads d_head) — head h owns a contiguous block of d_head features",
            ),
            (
                x.reshape(batch, heads, seq, d_head),
                "you reshaped straight to (batch, heads, seq, d_head), which mixes tokens across heads: "
                "split the last axis into (heads, d_head) first, then move heads before seq",
            ),
        ],
    )


# --- merge_heads ---------------------------------------------------------------------------------


def _merge_inputs(gen: torch.Generator) -> dict:
    batch, seq, heads, d_head = rand_int(gen, 1, 3), rand_int(gen, 2, 5), rand_int(gen, 2, 5), rand_int(gen, 2, 5)
    if heads == d_head:
        d_head += 1
    return {"args": (torch.randn(batch, heads, seq, d_head, generator=gen),)}


@core.recorded
def _merge_of(x: Tensor) -> Tensor:
    batch, heads, seq, d_head = x.shape
    return x.transpose(1, 2).reshape(batch, seq, heads * d_head)


def _judge_merge(inputs: dict, outputs: dict) -> None:
    (x,) = inputs["args"]
    batch, heads, seq, d_head = x.shape
    expect(
        outputs["out"],
        _merge_of(x),
        "merge_heads must undo split_heads: (batch, heads, seq, d_head) -> (batch, seq, heads·d_head), "
        "head after head",
        [
            (
                x.permute(0, 2, 3, 1).reshape(batch, seq, heads * d_head),
                "your features are interleaved across heads: you merged as (d_head heads); "
                "merge as (heads d_head) so head 0's d_head features come first",
            ),
            (
                x.reshape(batch, seq, heads * d_head),
                "you reshaped without moving the heads axis back after seq, which mixes tokens: "
                "move heads next to d_head first (einops: 'batch heads seq d_head -> batch seq (heads d_head)')",
            ),
        ],
    )


def _judge_merge_roundtrip(inputs: dict, outputs: dict) -> None:
    (x,) = inputs["args"]
    tokens = _merge_of(x)
    out = outputs["out"]
    # split_heads(out, heads) gives x back exactly when out has merge_heads' layout (tokens)
    if isinstance(out, Tensor) and tuple(out.shape) == tuple(tokens.shape) and not same(out, tokens):
        fail("split_heads(merge_heads(x), heads) does not give x back: merge_heads is not the inverse of split_heads")
    expect_close(out, tokens, "merge_heads gives the wrong layout")


# --- MultiHeadAttention ----------------------------------------------------------------------------


@core.recorded
def _state_shapes(init_args: tuple, init_kwargs: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The reference module's state: (name, shape) in order."""
    module = reference.MultiHeadAttention(*init_args, **init_kwargs)
    return [(name, tuple(p.shape)) for name, p in module.state_dict().items()]


def _state(shapes: list[tuple[str, tuple[int, ...]]], gen: torch.Generator) -> dict[str, Tensor]:
    """The reference module's parameter names with random values from ``gen`` (biases non-zero)."""
    return {name: torch.randn(shape, generator=gen) * (0.5 if len(shape) > 1 else 0.2) for name, shape in shapes}


def _mha_inputs(
    gen: torch.Generator,
    *,
    cross: bool = False,
    padding: bool = False,
    causal: bool = False,
    kv_heads: bool = False,
    bias: bool = True,
) -> dict:
    n_heads = [2, 4][rand_int(gen, 0, 1)] if not kv_heads else 4
    d_head = rand_int(gen, 2, 5)
    if d_head == n_heads:
        d_head += 1
    d_model = n_heads * d_head
    init_kwargs: dict[str, Any] = {"bias": bias}
    if kv_heads:
        init_kwargs["n_kv_heads"] = 2  # with 1 (MQA) the grouping mistakes would not show
    shapes = _state_shapes((d_model, n_heads), init_kwargs)
    batch, seq_q = rand_int(gen, 1, 3), rand_int(gen, 3, 6)
    seq_k = seq_q + rand_int(gen, 1, 3) if cross else seq_q
    x = torch.randn(batch, seq_q, d_model, generator=gen)
    args: list[Any] = [x]
    if cross or padding:
        args.append(torch.randn(batch, seq_k, d_model, generator=gen) if cross else None)
    if padding:
        lengths = torch.randint(1, seq_k + 1, (batch,), generator=gen)
        lengths[0] = seq_k - 1  # at least one padded key
        args.append((torch.arange(seq_k) < lengths[:, None])[:, None, None, :])
    return {
        "init_args": (d_model, n_heads),
        "init_kwargs": init_kwargs,
        "state": _state(shapes, gen),
        "args": tuple(args),
        "kwargs": {"is_causal": True} if causal else {},
    }


def _call_parts(inputs: dict) -> tuple:
    args = inputs["args"]
    x = args[0]
    context = args[1] if len(args) > 1 else None
    mask = args[2] if len(args) > 2 else None
    return x, context, mask, bool(inputs["kwargs"].get("is_causal", False))


def _torch_reference(inputs: dict) -> Tensor:
    """nn.MultiheadAttention (batch_first) with the same weights; PyTorch's masks mean True = NOT allowed."""
    d_model, n_heads = inputs["init_args"]
    state, bias = inputs["state"], inputs["init_kwargs"].get("bias", True)
    x, context, mask, is_causal = _call_parts(inputs)
    module = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True)
    with torch.no_grad():
        module.in_proj_weight.copy_(state["in_proj.weight"])
        module.out_proj.weight.copy_(state["out_proj.weight"])
        if bias:
            module.in_proj_bias.copy_(state["in_proj.bias"])
            module.out_proj.bias.copy_(state["out_proj.bias"])
    module.eval()
    kv = x if context is None else context
    attn_mask = None
    if is_causal:  # PyTorch's own end-aligned mask, inverted: here True = NOT allowed
        attn_mask = ~core.end_aligned_causal_mask(x.shape[1], kv.shape[1])
    key_padding_mask = None if mask is None else ~mask[:, 0, 0, :]
    with torch.no_grad():
        out, _ = module(x, kv, kv, key_padding_mask=key_padding_mask, attn_mask=attn_mask, need_weights=False)
    return out


def _by_hand(inputs: dict, bug: str | None = None) -> Tensor:
    """Multi-head attention written out with F.scaled_dot_product_attention, optionally with one known bug."""
    d_model, n_heads = inputs["init_args"]
    n_kv_heads = inputs["init_kwargs"].get("n_kv_heads") or n_heads
    state = inputs["state"]
    x, context, mask, is_causal = _call_parts(inputs)
    d_head = d_model // n_heads
    sizes = [d_model, n_kv_heads * d_head, n_kv_heads * d_head]
    w_q, w_k, w_v = state["in_proj.weight"].split(sizes)
    b_q, b_k, b_v = (None, None, None)
    if "in_proj.bias" in state and bug != "no_in_proj_bias":
        b_q, b_k, b_v = state["in_proj.bias"].split(sizes)
    source = x if context is None or bug == "context_ignored" else context
    q = F.linear(source if bug == "query_from_context" else x, w_q, b_q)
    k, v = F.linear(source, w_k, b_k), F.linear(source, w_v, b_v)
    if bug == "kv_swapped":
        k, v = v, k
    layout = "batch seq (d_head heads) -> batch heads seq d_head" if bug == "split_transposed" else (
        "batch seq (heads d_head) -> batch heads seq d_head"
    )
    q = rearrange(q, layout, d_head=d_head)
    k, v = (rearrange(t, layout, d_head=d_head) for t in (k, v))
    if bug == "kv_heads_tiled":
        k, v = k.repeat(1, n_heads // n_kv_heads, 1, 1), v.repeat(1, n_heads // n_kv_heads, 1, 1)
    else:
        k = k.repeat_interleave(n_heads // n_kv_heads, dim=1)
        v = v.repeat_interleave(n_heads // n_kv_heads, dim=1)
    if bug == "scaled_twice":
        q = q / math.sqrt(d_head)
    if bug == "mask_inverted" and mask is not None:
        mask = ~mask
    seq_q, seq_k = q.shape[2], k.shape[2]
    if is_causal:
        causal = torch.ones(seq_q, seq_k, dtype=torch.bool).tril(seq_k - seq_q)
        mask = causal if mask is None else mask & causal
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).nan_to_num(0.0)
    merge = "batch heads seq d_head -> batch seq (d_head heads)" if bug in ("split_transposed", "merge_transposed") else (
        "batch heads seq d_head -> batch seq (heads d_head)"
    )
    merged = rearrange(out, merge)
    if bug == "no_out_proj":
        return merged
    return F.linear(merged, state["out_proj.weight"], state.get("out_proj.bias"))


_MHA_MISTAKES = {
    "split_transposed": "your heads take every n_heads-th feature: split the projections as (heads d_head), not (d_head heads)",
    "merge_transposed": "the heads are merged in (d_head heads) order: merge as (heads d_head), the inverse of the split",
    "no_out_proj": "the output is the concatenated heads without W_O: finish with self.out_proj(...)",
    "scaled_twice": "your scores are √d_head too small: attention(...) / F.scaled_dot_product_attention already divide "
    "by √d_head, do not scale q yourself as well",
    "kv_swapped": "keys and values are swapped: in_proj packs [W_Q; W_K; W_V] in that order",
    "query_from_context": "in cross-attention the queries come from x; only keys and values come from context",
    "context_ignored": "your module ignores context: forward(x, context) is cross-attention, with the keys and values "
    "projected from context (the K/V rows of in_proj applied to it) and only the queries from x; yours attends over x",
    "no_in_proj_bias": "the in_proj bias is missing: project with self.in_proj (weight and bias)",
    "kv_heads_tiled": "your K/V heads are tiled (0, 1, 0, 1, …): query head i must use K/V head i // group "
    "(repeat_interleave), not i % n_kv_heads",
    "mask_inverted": "your mask polarity is inverted: here True = may attend (like F.scaled_dot_product_attention's "
    "boolean attn_mask); nn.MultiheadAttention's key_padding_mask is the opposite",
}


@core.recorded
def _mha_variants(inputs: dict) -> dict[str, Tensor]:
    """The output of multi-head attention by hand ("reference") and of each known mistake of _MHA_MISTAKES."""
    variants = {"reference": _by_hand(inputs)}
    for bug in _MHA_MISTAKES:
        try:
            variants[bug] = _by_hand(inputs, bug)
        except RuntimeError:  # a mistake these shapes cannot even make
            continue
    return variants


def _judge_mha(inputs: dict, outputs: dict, *, what: str) -> None:
    variants = _mha_variants(inputs)
    expected = variants["reference"] if inputs["init_kwargs"].get("n_kv_heads") else _torch_reference(inputs)
    if not same(outputs["out"], expected, 1e-4):
        for bug, message in _MHA_MISTAKES.items():
            if bug in variants and same(outputs["out"], variants[bug], 1e-4):
                fail(message)
    expect_close(outputs["out"], expected, what, atol=1e-4)


def _dropout_inputs(gen: torch.Generator) -> dict:
    n_heads, d_head = 4, rand_int(gen, 3, 5)
    d_model = n_heads * d_head
    state = _state(_state_shapes((d_model, n_heads), {"dropout": 0.5}), gen)
    # W_O = identity, so each head's output block is visible in the module output.
    state["out_proj.weight"] = torch.eye(d_model)
    state["out_proj.bias"] = torch.zeros(d_model)
    batch, seq_q = 2, 8
    return {
        "init_args": (d_model, n_heads),
        "init_kwargs": {"dropout": 0.5},
        "state": state,
        # One key: softmax gives it weight 1, so dropping that weight zeroes a whole head block.
        "args": (torch.randn(batch, seq_q, d_model, generator=gen), torch.randn(batch, 1, d_model, generator=gen)),
        "kwargs": {},
        "seed": rand_int(gen, 0, 10_000),
    }


@core.recorded
def _dropout_values(inputs: dict) -> Tensor:
    """Each head's value of the one context token, (batch, 1, heads, d_head): with W_O = identity, what every query
    of that head outputs without dropout."""
    d_model, n_heads = inputs["init_args"]
    state, (_, context) = inputs["state"], inputs["args"]
    w_v, b_v = state["in_proj.weight"][-d_model:], state["in_proj.bias"][-d_model:]
    return rearrange(F.linear(context, w_v, b_v), "batch 1 (heads d_head) -> batch 1 heads d_head", heads=n_heads)


def _judge_dropout(inputs: dict, outputs: dict) -> None:
    d_model, n_heads = inputs["init_args"]
    x = inputs["args"][0]
    v = _dropout_values(inputs)
    kept_eval = v.expand(-1, x.shape[1], -1, -1).reshape(x.shape)
    expect_close(outputs["eval"], kept_eval, "in eval mode (module.eval()) there must be no dropout", atol=1e-4)
    train = outputs["train"]
    if not isinstance(train, Tensor) or tuple(train.shape) != tuple(x.shape):
        fail(f"train-mode output should have shape {tuple(x.shape)}")
    blocks = rearrange(train, "batch seq (heads d_head) -> batch seq heads d_head", heads=n_heads)
    kept = torch.isclose(blocks, v / 0.5, atol=1e-4).all(-1)
    dropped = (blocks.abs() < 1e-6).all(-1)
    if not (kept | dropped).all():
        fail(
            "in train mode some head outputs are partly zeroed or not rescaled: dropout belongs on the attention "
            "weights (dropout_p=self.dropout in training), not on Q, K, V or the output features"
        )
    if not dropped.any():
        fail("in train mode with dropout=0.5 no attention weight was dropped: pass dropout_p=self.dropout when self.training")
    if not kept.any():
        fail("in train mode every attention weight was dropped: dropout_p should be self.dropout, not 1")


# --- attention_parameter_count ---------------------------------------------------------------------


def _count_inputs(gen: torch.Generator, *, bias: bool = True, gqa: bool = False, big: bool = False) -> dict:
    if big:
        d_model, n_heads = [(768, 12), (12288, 96), (8192, 64)][rand_int(gen, 0, 2)]
    else:
        n_heads = [2, 4, 8][rand_int(gen, 0, 2)]
        d_model = n_heads * rand_int(gen, 2, 16)
    fewer = [d for d in range(1, n_heads) if n_heads % d == 0]
    n_kv_heads = fewer[rand_int(gen, 0, len(fewer) - 1)] if gqa else None
    return {"args": (d_model, n_heads), "kwargs": {"n_kv_heads": n_kv_heads, "bias": bias}}


@core.recorded
def _count_of(d_model: int, n_heads: int, n_kv_heads: int | None, bias: bool) -> int:
    if n_kv_heads is None:
        module = nn.MultiheadAttention(d_model, n_heads, bias=bias, device="meta")
    else:
        module = reference.MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads, bias=bias)
    return sum(p.numel() for p in module.parameters())


# n_kv_heads that does not divide n_heads: fewer K/V heads, more, and one that shares a factor with n_heads
_COUNT_BAD_KV_HEADS = _bad_calls(*((f"n_kv_heads={kv} does not divide n_heads={heads}", (heads * 16, heads),
                                    {"n_kv_heads": kv}, "n_kv_heads")
                                   for heads, kv in ((8, 3), (6, 4), (4, 8))))


def _judge_count(inputs: dict, outputs: dict) -> None:
    d_model, n_heads = inputs["args"]
    n_kv_heads, bias = inputs["kwargs"]["n_kv_heads"], inputs["kwargs"]["bias"]
    with torch.device("meta"):
        expected = _count_of(d_model, n_heads, n_kv_heads, bias)
    got = outputs["out"]
    if isinstance(got, bool) or not isinstance(got, int):
        fail(f"return a Python int; got {type(got).__name__}")
    if got == expected:
        return
    kv = n_kv_heads or n_heads
    kv_dim = kv * (d_model // n_heads)
    where = f"d_model={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads}, bias={bias}"
    if got == 4 * d_model * d_model + (4 * d_model if bias else 0) and kv != n_heads:
        fail(f"{where}: you counted full-width K and V projections; with GQA they are d_model × n_kv_heads·d_head")
    if bias and got == expected - (d_model + 2 * kv_dim) - d_model:
        fail(f"{where}: the biases are missing (one per output feature of in_proj and out_proj)")
    if got == expected - d_model * d_model - (d_model if bias else 0):
        fail(f"{where}: the output projection W_O (d_model × d_model, plus its bias) is missing")
    fail(f"{where}: expected {expected:,} parameters, got {got:,}")


# --- repeat_kv_heads ------------------------------------------------------------------------------


def _repeat_inputs(gen: torch.Generator, kv_heads: int | None = None, group: int | None = None) -> dict:
    kv_heads = kv_heads or rand_int(gen, 2, 3)
    group = group or rand_int(gen, 2, 3)
    x = torch.randn(rand_int(gen, 1, 2), kv_heads, rand_int(gen, 2, 4), rand_int(gen, 2, 4), generator=gen)
    return {"args": (x, kv_heads * group)}


@core.recorded
def _repeat_of(x: Tensor, n_heads: int) -> Tensor:
    return x.repeat_interleave(n_heads // x.shape[1], dim=1)


def _judge_repeat(inputs: dict, outputs: dict) -> None:
    x, n_heads = inputs["args"]
    group = n_heads // x.shape[1]
    expect(
        outputs["out"],
        _repeat_of(x, n_heads),
        f"query head i must use K/V head i // {group}: shape (batch, {n_heads}, seq, d_head)",
        [
            (
                x.repeat(1, group, 1, 1),
                "your K/V heads are tiled (0, 1, 0, 1, …): query head i must use K/V head i // group, so "
                "consecutive query heads share one K/V head (0, 0, 1, 1, …) — use repeat_interleave, or "
                "einops 'kv_heads -> (kv_heads group)', not '(group kv_heads)'",
            )
        ],
    )


# --- query_gradient_norm -------------------------------------------------------------------------


def _grad_inputs(d_heads: tuple[int, ...], *, scaled: bool, dtype: torch.dtype = torch.float64):
    def inputs(gen: torch.Generator) -> dict:
        d_head = d_heads[rand_int(gen, 0, len(d_heads) - 1)]
        d_model, batch, seq = 4 * rand_int(gen, 2, 6), rand_int(gen, 1, 3), rand_int(gen, 4, 8)
        x = torch.randn(batch, seq, d_model, generator=gen, dtype=torch.float64)
        # Unit-variance q and k entries: the raw scores then have variance d_head.
        w_q, w_k, w_v = (torch.randn(d_model, d_head, generator=gen, dtype=torch.float64) / math.sqrt(d_model)
                         for _ in range(3))
        target = torch.randn(batch, seq, d_head, generator=gen, dtype=torch.float64)
        return {"args": tuple(t.to(dtype) for t in (x, w_q, w_k, w_v, target)), "kwargs": {"scaled": scaled}}

    return inputs


def _grad_norm_of(args: tuple, *, scale: float, wrt: int = 1, reduction: str = "mean") -> float:
    """‖∂L/∂W‖ in float64 for the weight ``args[wrt]`` (1 = W_Q, 2 = W_K), recomputed here with plain torch."""
    x, w_q, w_k, w_v, target = (t.double() for t in args)
    leaf = (w_q, w_k)[wrt - 1].clone().requires_grad_(True)
    w_q, w_k = (leaf, w_k) if wrt == 1 else (w_q, leaf)
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    weights = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
    error = (weights @ v - target).pow(2)
    loss = error.mean() if reduction == "mean" else error.sum()
    (grad,) = torch.autograd.grad(loss, leaf)
    return grad.norm().item()


@core.recorded
def _grad_norms(args: tuple, scaled: bool) -> dict[str, float]:
    """‖∂L/∂W_Q‖ ("expected") and the norms the usual slips give."""
    d_head = args[1].shape[-1]
    scale = 1 / math.sqrt(d_head) if scaled else 1.0
    return {"expected": _grad_norm_of(args, scale=scale),
            "unscaled": _grad_norm_of(args, scale=1.0),
            "scaled": _grad_norm_of(args, scale=1 / math.sqrt(d_head)),
            "by_d_head": _grad_norm_of(args, scale=1 / d_head),
            "summed": _grad_norm_of(args, scale=scale, reduction="sum"),
            "w_k": _grad_norm_of(args, scale=scale, wrt=2)}


def _judge_grad(inputs: dict, outputs: dict) -> None:
    args, scaled = inputs["args"], inputs["kwargs"]["scaled"]
    d_head = args[1].shape[-1]
    norms = _grad_norms(args, scaled)
    got = outputs["out"]
    if isinstance(got, Tensor):
        fail(f"return a Python float (grad.norm().item()), not a tensor of shape {tuple(got.shape)}")
    if isinstance(got, bool) or not isinstance(got, (float, int)):
        fail(f"return a Python float, got {type(got).__name__}")
    rtol = 1e-6 if args[0].dtype == torch.float64 else 1e-3
    expected = norms["expected"]

    def near(value: float) -> bool:
        return abs(got - value) <= rtol * abs(value) + 1e-12

    if near(expected):
        return
    flag = f"scaled={scaled}, d_head={d_head}"
    for key, hint in (
        ("unscaled", "the scores are not divided by √d_head, but scaled=True asks for it"),
        ("scaled", "the scores are divided by √d_head although scaled=False: only scale when `scaled` is True"),
        ("by_d_head", "the scores are divided by d_head instead of √d_head"),
        ("summed", "your loss is a sum: use the mean of the squared error, (out - target).pow(2).mean()"),
        ("w_k", "that is the gradient reaching W_K; measure the one reaching W_Q"),
    ):
        if near(norms[key]) and not near(expected):
            fail(f"{flag}: {hint}")
    if got == 0:
        fail(f"{flag}: no gradient reached W_Q: do not detach q or the weights, and do not compute them under "
             "torch.no_grad()")
    fail(f"{flag}: ‖∂L/∂W_Q‖ should be {expected:.6g}, you returned {got:.6g}; L = mean((softmax(q kᵀ · s) v - "
         "target)²) with q = x W_Q, k = x W_K, v = x W_V")


def _mha_case(name: str, what: str, **kwargs) -> Case:
    return Case(name, lambda g: _mha_inputs(g, **kwargs), "module_forward", lambda i, o: _judge_mha(i, o, what=what))


# Visible cases check what each exercise is for (the layout, the errors the text asks for, cross-attention,
# dropout, the grouping); hidden cases are the same properties on fresh seeds and sizes, plus edge cases.
CHECKS: dict[str, Check] = {
    "split_heads": Check(
        name="split_heads",
        visible=(
            Case("split (batch, seq, heads·d_head) into heads", _split_inputs, "call", _judge_split),
            Case("d_model not divisible by n_heads raises ValueError", _bad_calls(
                ("d_model=21 is not divisible by n_heads=5", (_shape(2, 3, 21), 5), {}, "n_heads")),
                "call_each", _judge_value_errors),
            Case("x that is not 3-D raises ValueError", _bad_calls(
                ("x of shape (2, 3, 4, 8) is not (batch, seq, d_model)", (_shape(2, 3, 4, 8), 2), {}, "x"),
                ("x of shape (3, 8) is not (batch, seq, d_model)", (_shape(3, 8), 2), {}, "x")),
                "call_each", _judge_value_errors),
        ),
        hidden=(
            Case("one head, or one feature per head", lambda g: _split_inputs(g, (1, 1), (1, 1)), "call", _judge_split),
            Case("larger sizes", lambda g: _split_inputs(g, (6, 12), (4, 8)), "call", _judge_split),
        ),
    ),
    "merge_heads": Check(
        name="merge_heads",
        visible=(
            Case("merge heads back to (batch, seq, d_model)", _merge_inputs, "call", _judge_merge),
            Case("x that is not 4-D raises ValueError", _bad_calls(
                ("x of shape (2, 3, 8) is not (batch, heads, seq, d_head)", (_shape(2, 3, 8),), {}, "x"),
                ("x of shape (1, 2, 3, 4, 5) is not (batch, heads, seq, d_head)", (_shape(1, 2, 3, 4, 5),), {}, "x")),
                "call_each", _judge_value_errors),
        ),
        hidden=(Case("merge_heads inverts split_heads", _merge_inputs, "call", _judge_merge_roundtrip),),
    ),
    "MultiHeadAttention": Check(
        name="MultiHeadAttention",
        visible=(
            _mha_case("self-attention equals nn.MultiheadAttention with the same weights",
                      "self-attention differs from nn.MultiheadAttention with the same weights"),
            _mha_case("cross-attention to a longer context",
                      "cross-attention (queries from x, keys and values from context) is wrong", cross=True),
            _mha_case("cross-attention to a longer context, with a key padding mask",
                      "cross-attention (queries from x, keys/values from context, mask True = may attend) is wrong",
                      cross=True, padding=True),
            _mha_case("causal self-attention", "with is_causal=True, a token may only attend to itself and the past",
                      causal=True),
            Case("dropout on the attention weights", _dropout_inputs, "module_forward_train_and_eval", _judge_dropout),
            _mha_case("grouped-query attention (n_kv_heads < n_heads)",
                      "with n_kv_heads < n_heads, query head i must use K/V head i // (n_heads // n_kv_heads)",
                      kv_heads=True, cross=True),
        ),
        hidden=(
            _mha_case("no biases", "with bias=False the output differs from nn.MultiheadAttention(bias=False)",
                      bias=False),
            _mha_case("causal cross-attention over a cache (seq_k > seq_q)",
                      "with is_causal=True and seq_k > seq_q the causal mask is aligned to the end",
                      cross=True, causal=True),
            _mha_case("grouped-query self-attention with padding",
                      "grouped-query self-attention with a key padding mask is wrong", kv_heads=True, padding=True),
        ),
        # nn.MultiheadAttention's own forward (the given from_torch only reads its weights).
        forbidden=("multi_head_attention_forward", "_native_multi_head_attention"),
    ),
    "attention_parameter_count": Check(
        name="attention_parameter_count",
        visible=(
            Case("count of multi-head attention", _count_inputs, "call", _judge_count),
            Case("grouped-query attention", lambda g: _count_inputs(g, gqa=True), "call", _judge_count),
            Case("d_model not divisible by n_heads raises ValueError", _bad_calls(
                ("d_model=50 is not divisible by n_heads=6", (50, 6), {}, "n_heads")),
                "call_each", _judge_value_errors),
            Case("n_kv_heads that does not divide n_heads raises ValueError", _COUNT_BAD_KV_HEADS, "call_each",
                 _judge_value_errors),
        ),
        hidden=(
            Case("without biases", lambda g: _count_inputs(g, bias=False), "call", _judge_count),
            Case("real model sizes", lambda g: _count_inputs(g, big=True, gqa=True), "call", _judge_count),
        ),
    ),
    "repeat_kv_heads": Check(
        name="repeat_kv_heads",
        visible=(
            Case("groups of query heads share a K/V head", _repeat_inputs, "call", _judge_repeat),
            Case("n_heads not a multiple of the K/V heads raises ValueError", _bad_calls(
                ("n_heads=7 is not a multiple of the 3 K/V heads", (_shape(1, 3, 2, 2), 7), {}, "n_heads")),
                "call_each", _judge_value_errors),
        ),
        hidden=(
            Case("multi-query: one K/V head", lambda g: _repeat_inputs(g, kv_heads=1, group=4), "call", _judge_repeat),
            Case("as many K/V heads as query heads", lambda g: _repeat_inputs(g, group=1), "call", _judge_repeat),
        ),
    ),
    "query_gradient_norm": Check(
        name="query_gradient_norm",
        visible=(
            Case("scaled=True, d_head = 16, against torch.autograd", _grad_inputs((16,), scaled=True), "call",
                 _judge_grad),
            Case("scaled=False, d_head = 64", _grad_inputs((64,), scaled=False), "call", _judge_grad),
        ),
        hidden=(
            Case("scaled, any d_head", _grad_inputs((2, 8, 32, 128), scaled=True), "call", _judge_grad),
            Case("unscaled, any d_head", _grad_inputs((4, 32, 256), scaled=False), "call", _judge_grad),
            Case("float32", _grad_inputs((8, 64), scaled=True, dtype=torch.float32), "call", _judge_grad),
        ),
    ),
}


run = core.runner(__name__)  # run(name, obj, *, level="visible", seed=0): the notebook's entry point


__all__ = ["CHECKS", "run", "CheckFailed"]
