"""Planted bugs for chapter 2 (multi-head attention): each must FAIL the hidden checks of its exercise.

Each mutant is a copy of the ``solutions.multihead`` code with one realistic change. The copies never
call ``solutions.multihead`` itself: that would be delegation, refused before the judge looks at the answer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
from torch import nn

from mutants import Mutant
from solutions.attention import attention  # chapter 1: allowed in chapter 2


# --- split_heads / merge_heads ---


def split_heads_transposed(x, n_heads):
    if x.shape[-1] % n_heads:
        raise ValueError(f"d_model={x.shape[-1]} is not divisible by n_heads={n_heads}")
    return rearrange(x, "batch seq (d_head heads) -> batch heads seq d_head", heads=n_heads)


def split_heads_plain_reshape(x, n_heads):
    if x.shape[-1] % n_heads:
        raise ValueError(f"d_model={x.shape[-1]} is not divisible by n_heads={n_heads}")
    batch, seq, d_model = x.shape
    return x.reshape(batch, n_heads, seq, d_model // n_heads)


def split_heads_truncating(x, n_heads):
    d_head = x.shape[-1] // n_heads
    return rearrange(x[..., : n_heads * d_head], "batch seq (heads d_head) -> batch heads seq d_head", heads=n_heads)


def split_heads_unchecked(x, n_heads):
    # einops raises its own EinopsError (not a ValueError naming n_heads) when the sizes do not fit.
    return rearrange(x, "batch seq (heads d_head) -> batch heads seq d_head", heads=n_heads)


def split_heads_unpacks_shape(x, n_heads):
    batch, seq, d_model = x.shape  # Python's "too many values to unpack" is the only check of the rank
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    return rearrange(x, "batch seq (heads d_head) -> batch heads seq d_head", heads=n_heads)


def merge_heads_unpacks_shape(x):
    batch, heads, seq, d_head = x.shape
    return x.transpose(1, 2).reshape(batch, seq, heads * d_head)


def merge_heads_unchecked(x):
    return rearrange(x, "batch heads seq d_head -> batch seq (heads d_head)")


def merge_heads_transposed(x):
    return rearrange(x, "batch heads seq d_head -> batch seq (d_head heads)")


def merge_heads_plain_reshape(x):
    batch, heads, seq, d_head = x.shape
    return x.reshape(batch, seq, heads * d_head)


# --- MultiHeadAttention (each keeps the reference __init__, so the state_dict names match) ---


class _MultiHeadAttention(nn.Module):
    """A copy of solutions.multihead.MultiHeadAttention, the base of the planted bugs below."""

    def __init__(self, d_model, n_heads, *, n_kv_heads=None, dropout=0.0, bias=True):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.dropout = dropout
        self.backend = "auto"
        kv_dim = n_kv_heads * self.d_head
        self.in_proj = nn.Linear(d_model, d_model + 2 * kv_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.split_heads = Rearrange("batch seq (heads d_head) -> batch heads seq d_head", d_head=self.d_head)
        self.merge_heads = Rearrange("batch heads seq d_head -> batch seq (heads d_head)")

    def project_qkv(self, x, context=None):
        sizes = [self.d_model, self.n_kv_heads * self.d_head, self.n_kv_heads * self.d_head]
        if context is None:
            q, k, v = self.in_proj(x).split(sizes, dim=-1)
        else:
            w_q, w_kv = self.in_proj.weight.split([sizes[0], 2 * sizes[1]])
            b_q, b_kv = (None, None) if self.in_proj.bias is None else self.in_proj.bias.split([sizes[0], 2 * sizes[1]])
            q = F.linear(x, w_q, b_q)
            k, v = F.linear(context, w_kv, b_kv).split(sizes[1:], dim=-1)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def forward(self, x, context=None, mask=None, *, is_causal=False):
        q, k, v = self.project_qkv(x, context)
        dropout_p = self.dropout if self.training else 0.0
        out = attention(q, k, v, mask, is_causal=is_causal, dropout_p=dropout_p, backend=self.backend)
        return self.out_proj(self.merge_heads(out))


class MHASplitTransposed(_MultiHeadAttention):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.split_heads = Rearrange("batch seq (d_head heads) -> batch heads seq d_head", d_head=self.d_head)
        self.merge_heads = Rearrange("batch heads seq d_head -> batch seq (d_head heads)")


class MHAMergeTransposed(_MultiHeadAttention):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.merge_heads = Rearrange("batch heads seq d_head -> batch seq (d_head heads)")


class MHANoOutProj(_MultiHeadAttention):
    def forward(self, x, context=None, mask=None, *, is_causal=False):
        q, k, v = self.project_qkv(x, context)
        dropout_p = self.dropout if self.training else 0.0
        out = attention(q, k, v, mask, is_causal=is_causal, dropout_p=dropout_p, backend=self.backend)
        return self.merge_heads(out)


class MHAScaledTwice(_MultiHeadAttention):
    def forward(self, x, context=None, mask=None, *, is_causal=False):
        q, k, v = self.project_qkv(x, context)
        q = q / math.sqrt(self.d_head)  # SDPA scales again
        dropout_p = self.dropout if self.training else 0.0
        out = attention(q, k, v, mask, is_causal=is_causal, dropout_p=dropout_p, backend="sdpa")
        return self.out_proj(self.merge_heads(out))


class MHAKeysValuesSwapped(_MultiHeadAttention):
    def project_qkv(self, x, context=None):
        q, k, v = super().project_qkv(x, context)
        return q, v, k


class MHAQueryFromContext(_MultiHeadAttention):
    def project_qkv(self, x, context=None):
        return super().project_qkv(x if context is None else context, context)


class MHAMaskInverted(_MultiHeadAttention):
    def forward(self, x, context=None, mask=None, *, is_causal=False):
        # "PyTorch masks mean True = ignore", applied to a mask that already follows SDPA's convention.
        return super().forward(x, context, None if mask is None else ~mask, is_causal=is_causal)


class MHADropoutOnValues(_MultiHeadAttention):
    def forward(self, x, context=None, mask=None, *, is_causal=False):
        q, k, v = self.project_qkv(x, context)
        v = F.dropout(v, p=self.dropout, training=self.training)
        out = attention(q, k, v, mask, is_causal=is_causal, backend=self.backend)
        return self.out_proj(self.merge_heads(out))


class MHADropoutAlways(_MultiHeadAttention):
    def forward(self, x, context=None, mask=None, *, is_causal=False):
        q, k, v = self.project_qkv(x, context)
        out = attention(q, k, v, mask, is_causal=is_causal, dropout_p=self.dropout, backend=self.backend)
        return self.out_proj(self.merge_heads(out))


class MHANoBias(_MultiHeadAttention):
    def project_qkv(self, x, context=None):
        sizes = [self.d_model, self.n_kv_heads * self.d_head, self.n_kv_heads * self.d_head]
        q, k, v = F.linear(x if context is None else x, self.in_proj.weight).split(sizes, dim=-1)
        if context is not None:
            _, k, v = F.linear(context, self.in_proj.weight).split(sizes, dim=-1)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)


class MHANoCrossAttention(_MultiHeadAttention):
    """Written for self-attention only: context is accepted and ignored."""

    def forward(self, x, context=None, mask=None, *, is_causal=False):
        return super().forward(x, None, mask, is_causal=is_causal)


class MHANoDropout(_MultiHeadAttention):
    def forward(self, x, context=None, mask=None, *, is_causal=False):
        q, k, v = self.project_qkv(x, context)
        out = attention(q, k, v, mask, is_causal=is_causal, backend=self.backend)
        return self.out_proj(self.merge_heads(out))


class MHAGQATiled(_MultiHeadAttention):
    def forward(self, x, context=None, mask=None, *, is_causal=False):
        q, k, v = self.project_qkv(x, context)
        group = self.n_heads // self.n_kv_heads
        k = repeat(k, "batch kv_heads seq d_head -> batch (group kv_heads) seq d_head", group=group)
        v = repeat(v, "batch kv_heads seq d_head -> batch (group kv_heads) seq d_head", group=group)
        dropout_p = self.dropout if self.training else 0.0
        out = attention(q, k, v, mask, is_causal=is_causal, dropout_p=dropout_p, backend=self.backend)
        return self.out_proj(self.merge_heads(out))


# --- attention_parameter_count ---


def _count(d_model, n_heads, n_kv_heads=None, bias=True, *, with_bias=True, gqa=True, out_proj=True, check_kv=True,
           check_heads=True):
    n_kv_heads = n_heads if n_kv_heads is None or not gqa else n_kv_heads
    if check_heads and (d_model < 1 or n_heads < 1 or d_model % n_heads):
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    if check_kv and (n_kv_heads < 1 or n_heads % n_kv_heads):
        raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}")
    in_features = d_model + 2 * n_kv_heads * (d_model // n_heads)
    weights = d_model * in_features + (d_model * d_model if out_proj else 0)
    biases = in_features + (d_model if out_proj else 0)
    return weights + (biases if bias and with_bias else 0)


def count_without_bias(d_model, n_heads, n_kv_heads=None, bias=True):
    return _count(d_model, n_heads, n_kv_heads, bias, with_bias=False)


def count_ignoring_gqa(d_model, n_heads, n_kv_heads=None, bias=True):
    return _count(d_model, n_heads, n_kv_heads, bias, gqa=False)


def count_without_out_proj(d_model, n_heads, n_kv_heads=None, bias=True):
    return _count(d_model, n_heads, n_kv_heads, bias, out_proj=False)


def count_unchecked_kv_heads(d_model, n_heads, n_kv_heads=None, bias=True):
    return _count(d_model, n_heads, n_kv_heads, bias, check_kv=False)


def count_unchecked_n_heads(d_model, n_heads, n_kv_heads=None, bias=True):
    return _count(d_model, n_heads, n_kv_heads, bias, check_heads=False)


# --- repeat_kv_heads ---


def repeat_kv_heads_tiled(x, n_heads):
    if n_heads % x.shape[1]:
        raise ValueError(f"n_heads={n_heads} must be a multiple of kv_heads={x.shape[1]}")
    return x.repeat(1, n_heads // x.shape[1], 1, 1)


def repeat_kv_heads_unchecked(x, n_heads):
    return x.repeat_interleave(max(n_heads // x.shape[1], 1), dim=1)


# --- query_gradient_norm ---


def _grad_norm(*, scale="flag", reduction="mean", wrt="q", detach=False, leaf="copy"):
    def query_gradient_norm(x, w_q, w_k, w_v, target, *, scaled=True):
        if leaf == "copy":
            w_q = w_q.detach().requires_grad_(True)
        else:  # "caller" or "backward": the caller's own tensor becomes the leaf
            w_q.requires_grad_(True)
        w_k = w_k.detach().requires_grad_(wrt == "k")
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        scores = q @ k.transpose(-2, -1)
        d_head = q.shape[-1]
        divide = {"flag": math.sqrt(d_head) if scaled else 1.0, "always": math.sqrt(d_head),
                  "never": 1.0, "d_head": d_head if scaled else 1.0}[scale]
        weights = (scores / divide).softmax(dim=-1)
        if detach:
            weights = weights.detach()
        error = (weights @ v - target).pow(2)
        loss = error.mean() if reduction == "mean" else error.sum()
        if leaf == "backward":
            loss.backward()
            return w_q.grad.norm().item()
        (grad,) = torch.autograd.grad(loss, w_q if wrt == "q" else w_k, allow_unused=True)
        return 0.0 if grad is None else grad.norm().item()

    return query_gradient_norm


MUTANTS: list[Mutant] = [
    Mutant("split_heads_transposed", "split_heads",
           "heads split as (d_head heads): head h gets every n_heads-th feature instead of a contiguous block",
           split_heads_transposed),
    Mutant("split_heads_plain_reshape", "split_heads",
           "x.reshape(batch, heads, seq, d_head) without a transpose: mixes tokens across heads "
           "(a frequent first attempt; the classic .view-instead-of-.transpose bug)",
           split_heads_plain_reshape),
    Mutant("split_heads_truncating", "split_heads",
           "d_model not divisible by n_heads: integer division silently drops the last features instead of raising",
           split_heads_truncating),
    Mutant("split_heads_unchecked", "split_heads",
           "no argument checks: einops raises an EinopsError that does not say which argument to change",
           split_heads_unchecked),
    Mutant("merge_heads_transposed", "merge_heads",
           "heads merged as (d_head heads): features interleaved across heads, not the inverse of the split",
           merge_heads_transposed),
    Mutant("merge_heads_plain_reshape", "merge_heads",
           "reshape to (batch, seq, d_model) without moving heads back after seq (forgetting .transpose(1, 2))",
           merge_heads_plain_reshape),
    Mutant("split_heads_unpacks_shape", "split_heads",
           "batch, seq, d_model = x.shape as the only check of the rank: Python's ValueError ('too many values to "
           "unpack (expected 3)') does not say that x must be (batch, seq, d_model)", split_heads_unpacks_shape),
    Mutant("merge_heads_unpacks_shape", "merge_heads",
           "batch, heads, seq, d_head = x.shape as the only check of the rank: Python's ValueError ('not enough "
           "values to unpack (expected 4, got 3)') does not say what x should be", merge_heads_unpacks_shape),
    Mutant("merge_heads_unchecked", "merge_heads",
           "no check that x is 4-D: a (batch, seq, d_model) tensor gives an EinopsError instead of a clear ValueError",
           merge_heads_unchecked),
    Mutant("mha_split_transposed", "MultiHeadAttention",
           "the module splits and merges heads as (d_head heads): self-consistent, but not the layout of "
           "nn.MultiheadAttention weights, so loaded checkpoints give wrong outputs",
           MHASplitTransposed),
    Mutant("mha_merge_transposed", "MultiHeadAttention",
           "heads merged in the wrong order before W_O", MHAMergeTransposed),
    Mutant("mha_no_out_proj", "MultiHeadAttention",
           "the concatenated heads are returned without the output projection W_O", MHANoOutProj),
    Mutant("mha_scaled_twice", "MultiHeadAttention",
           "q divided by √d_head before F.scaled_dot_product_attention, which scales again", MHAScaledTwice),
    Mutant("mha_keys_values_swapped", "MultiHeadAttention",
           "the packed in_proj split as [Q; V; K] instead of [Q; K; V]", MHAKeysValuesSwapped),
    Mutant("mha_query_from_context", "MultiHeadAttention",
           "cross-attention takes the queries from the context (encoder output) instead of x", MHAQueryFromContext),
    Mutant("mha_mask_inverted", "MultiHeadAttention",
           "mask polarity inverted when converting between PyTorch's key_padding_mask (True = ignore) and "
           "SDPA's boolean attn_mask (True = attend)", MHAMaskInverted),
    Mutant("mha_dropout_on_values", "MultiHeadAttention",
           "dropout applied to V instead of the attention weights", MHADropoutOnValues),
    Mutant("mha_dropout_in_eval", "MultiHeadAttention",
           "dropout_p passed unconditionally, so dropout also runs in eval mode", MHADropoutAlways),
    Mutant("mha_no_bias", "MultiHeadAttention",
           "the in_proj bias is ignored (F.linear without bias)", MHANoBias),
    Mutant("mha_gqa_tiled", "MultiHeadAttention",
           "GQA K/V heads repeated with repeat/tile instead of repeat_interleave: query head i uses K/V head "
           "i % kv_heads instead of i // group, which breaks checkpoints trained with the usual grouping",
           MHAGQATiled),
    Mutant("mha_no_cross_attention", "MultiHeadAttention",
           "written for self-attention only: the context is ignored, so a decoder's cross-attention attends to itself",
           MHANoCrossAttention),
    Mutant("mha_no_dropout", "MultiHeadAttention",
           "dropout never applied: self.dropout is stored and not passed on", MHANoDropout),
    Mutant("count_without_bias", "attention_parameter_count", "biases forgotten", count_without_bias),
    Mutant("count_ignoring_gqa", "attention_parameter_count",
           "K and V projections counted full width under GQA", count_ignoring_gqa),
    Mutant("count_without_out_proj", "attention_parameter_count", "W_O forgotten (3·d² instead of 4·d²)",
           count_without_out_proj),
    Mutant("count_unchecked_kv_heads", "attention_parameter_count",
           "n_kv_heads that does not divide n_heads is counted anyway (a model that cannot be built)",
           count_unchecked_kv_heads),
    Mutant("count_unchecked_n_heads", "attention_parameter_count",
           "checks n_kv_heads but not that n_heads divides d_model: counts a model that cannot be built",
           count_unchecked_n_heads),
    Mutant("repeat_kv_heads_tiled", "repeat_kv_heads",
           "x.repeat(1, group, 1, 1) tiles the K/V heads (0, 1, 0, 1) instead of grouping them (0, 0, 1, 1)",
           repeat_kv_heads_tiled),
    Mutant("repeat_kv_heads_unchecked", "repeat_kv_heads",
           "no check that n_heads is a multiple of the K/V heads: returns the wrong number of heads silently",
           repeat_kv_heads_unchecked),
    Mutant("grad_ignores_scaled", "query_gradient_norm",
           "always divides by √d_head, so the unscaled measurement is the scaled one again", _grad_norm(scale="always")),
    Mutant("grad_never_scaled", "query_gradient_norm",
           "never divides by √d_head: both curves show the saturated softmax", _grad_norm(scale="never")),
    Mutant("grad_divides_by_d_head", "query_gradient_norm", "divides the scores by d_head instead of √d_head",
           _grad_norm(scale="d_head")),
    Mutant("grad_sum_loss", "query_gradient_norm",
           "sum of squared errors instead of the mean: every gradient scaled by the number of outputs",
           _grad_norm(reduction="sum")),
    Mutant("grad_of_w_k", "query_gradient_norm", "measures the gradient reaching W_K instead of W_Q",
           _grad_norm(wrt="k")),
    Mutant("grad_requires_grad_on_callers_w_q", "query_gradient_norm",
           "w_q.requires_grad_(True) on the caller's tensor instead of a detached copy: the right number, but the "
           "caller's W_Q now records every operation on it", _grad_norm(leaf="caller")),
    Mutant("grad_backward_into_callers_w_q", "query_gradient_norm",
           "loss.backward() into the caller's w_q: its .grad is left filled (and grows at every call)",
           _grad_norm(leaf="backward")),
    Mutant("grad_detached_weights", "query_gradient_norm",
           "attention weights detached: no gradient reaches W_Q (reported as 0)", _grad_norm(detach=True)),
]
