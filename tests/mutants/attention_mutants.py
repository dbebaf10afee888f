"""Planted bugs for chapter 1 (autograder.checks.attention): one real mistake each."""

from __future__ import annotations

import math

import torch
from einops import einsum, rearrange

from mutants import Mutant


def _scores(q, k):
    return einsum(q, k, "... seq_q d_head, ... seq_k d_head -> ... seq_q seq_k") / math.sqrt(q.shape[-1])


def _softmax(x, dim=-1):
    e = (x - x.amax(dim=dim, keepdim=True)).exp()
    return e / e.sum(dim=dim, keepdim=True)


# --- attention_scores ---


def scores_no_scaling(q, k):
    return einsum(q, k, "... seq_q d_head, ... seq_k d_head -> ... seq_q seq_k")


def scores_divide_by_d_k(q, k):
    return einsum(q, k, "... seq_q d_head, ... seq_k d_head -> ... seq_q seq_k") / q.shape[-1]


def scores_transposed(q, k):
    return einsum(q, k, "... seq_q d_head, ... seq_k d_head -> ... seq_k seq_q") / math.sqrt(q.shape[-1])


def scores_float32(q, k):
    return _scores(q.float(), k.float())


def scores_scale_q_in_place(q, k):
    q.mul_(1.0 / math.sqrt(q.shape[-1]))  # "saves memory", corrupts the caller's q
    return einsum(q, k, "... seq_q d_head, ... seq_k d_head -> ... seq_q seq_k")


# --- softmax ---


def softmax_no_max_subtraction(x, dim=-1):
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_global_max(x, dim=-1):
    e = (x - x.max()).exp()
    return e / e.sum(dim=dim, keepdim=True)


def softmax_ignores_dim(x, dim=-1):
    return _softmax(x, dim=-1)


def softmax_max_subtracted_in_place(x, dim=-1):
    x -= x.amax(dim=dim, keepdim=True)  # stable, but the caller's logits are shifted too
    e = x.exp()
    return e / e.sum(dim=dim, keepdim=True)


# --- causal_mask ---


def _sizes(seq_q, seq_k):
    return seq_q, seq_q if seq_k is None else seq_k


def causal_without_diagonal(seq_q, seq_k=None, *, device=None):
    seq_q, seq_k = _sizes(seq_q, seq_k)
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).tril(diagonal=seq_k - seq_q - 1)


def causal_inverted(seq_q, seq_k=None, *, device=None):
    seq_q, seq_k = _sizes(seq_q, seq_k)
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).triu(diagonal=seq_k - seq_q + 1)


def causal_top_left(seq_q, seq_k=None, *, device=None):
    seq_q, seq_k = _sizes(seq_q, seq_k)
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).tril()


def causal_float(seq_q, seq_k=None, *, device=None):
    seq_q, seq_k = _sizes(seq_q, seq_k)
    return torch.ones(seq_q, seq_k, device=device).tril(diagonal=seq_k - seq_q)


def causal_unchecked(seq_q, seq_k=None, *, device=None):
    seq_q, seq_k = _sizes(seq_q, seq_k)
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).tril(diagonal=seq_k - seq_q)


def causal_no_size_check(seq_q, seq_k=None, *, device=None):
    seq_q, seq_k = _sizes(seq_q, seq_k)
    if seq_k < seq_q:
        raise ValueError(f"seq_k={seq_k} < seq_q={seq_q}: pass seq_k >= seq_q")
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).tril(diagonal=seq_k - seq_q)


# --- padding_mask ---


def padding_2d(tokens, pad_id):
    return tokens != pad_id


def padding_inverted(tokens, pad_id):
    return rearrange(tokens == pad_id, "batch seq_k -> batch 1 1 seq_k")


def padding_pad_zero(tokens, pad_id):
    return rearrange(tokens != 0, "batch seq_k -> batch 1 1 seq_k")


def padding_on_queries(tokens, pad_id):
    return rearrange(tokens != pad_id, "batch seq -> batch 1 seq 1")


# --- scaled_dot_product_attention ---


def _sdpa(*, scale="sqrt", fill="finfo", zero_dead_rows=True, softmax_dim=-1, after=False, invert=False,
          detach=False, check=True, zero_by_mask=False):
    def sdpa(q, k, v, mask=None):
        if check and mask is not None and mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor with True = may attend; got dtype {mask.dtype}")
        scores = einsum(q, k, "... seq_q d_head, ... seq_k d_head -> ... seq_q seq_k")
        scores = scores / {"sqrt": math.sqrt(q.shape[-1]), "none": 1.0, "d_k": q.shape[-1]}[scale]
        if not check and mask is not None and mask.dtype != torch.bool:
            keep = mask.bool()  # "converts" the mask instead of refusing it
        else:
            keep = None if mask is None else (mask if not invert else ~mask)
        if keep is not None and not after:
            value = {"finfo": torch.finfo(scores.dtype).min, "-inf": -math.inf, "-1e4": -1e4, "-1e9": -1e9}[fill]
            scores = scores.masked_fill(~keep, value)
        weights = _softmax(scores, dim=softmax_dim)
        if detach:
            weights = weights.detach()
        if keep is not None:
            if after:
                weights = weights.masked_fill(~keep, 0.0)
            elif zero_dead_rows:
                weights = weights * (mask if zero_by_mask else keep).any(dim=-1, keepdim=True)
        return einsum(weights, v, "... seq_q seq_k, ... seq_k d_head -> ... seq_q d_head"), weights

    return sdpa


# --- tiled_attention ---


def _tiled(*, rescale_output=True, rescale_sum=True, shift="running", start_max=-math.inf, stop="all", scale="sqrt",
           full=False, check=True, in_place=False):
    def tiled_attention(q, k, v, block_size=64):
        if check == "sign" and block_size < 1:
            raise ValueError(f"block_size must be positive; got {block_size}")
        if check is True and (not isinstance(block_size, int) or block_size < 1):
            raise ValueError(f"block_size must be a positive int; got {block_size!r}")
        if full:  # exact, but holds every (seq_q, seq_k) score at once
            scores = einsum(q, k, "... seq_q d_head, ... seq_k d_head -> ... seq_q seq_k") / math.sqrt(q.shape[-1])
            return einsum(_softmax(scores), v, "... seq_q seq_k, ... seq_k d_head -> ... seq_q d_head")
        if in_place:
            q = q.mul_(1.0 / math.sqrt(q.shape[-1]))
        else:
            q = q / {"sqrt": math.sqrt(q.shape[-1]), "none": 1.0}[scale]
        m = torch.full((*q.shape[:-1], 1), start_max, dtype=q.dtype)
        total = torch.zeros((*q.shape[:-1], 1), dtype=q.dtype)
        out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype)
        seq_k = k.shape[-2]
        end = seq_k if stop == "all" else seq_k - block_size + 1
        for start in range(0, end, block_size):
            s = einsum(q, k[..., start:start + block_size, :], "... seq_q d_head, ... seq_k d_head -> ... seq_q seq_k")
            block_max = s.amax(dim=-1, keepdim=True)
            new_m = {"running": torch.maximum(m, block_max), "block": block_max, "none": torch.zeros_like(m)}[shift]
            factor = (m - new_m).exp() if shift != "none" else torch.ones_like(m)
            p = (s - new_m).exp()
            total = (total * factor if rescale_sum else total) + p.sum(dim=-1, keepdim=True)
            out = (out * factor if rescale_output else out) + einsum(
                p, v[..., start:start + block_size, :], "... seq_q seq_k, ... seq_k d_head -> ... seq_q d_head")
            m = new_m
        return out / total

    return tiled_attention


MUTANTS: list[Mutant] = [
    Mutant("scores_no_scaling", "attention_scores",
           "forgets the 1/√d_k of 'Attention Is All You Need' §3.2.1: the softmax saturates as d_k grows", scores_no_scaling),
    Mutant("scores_divide_by_d_k", "attention_scores",
           "divides by d_k instead of √d_k: scores too flat", scores_divide_by_d_k),
    Mutant("scores_transposed", "attention_scores",
           "k @ qᵀ instead of q @ kᵀ: rows are keys; invisible while seq_q == seq_k", scores_transposed),
    Mutant("scores_float32", "attention_scores",
           "casts to float32: silently loses float64 precision (e.g. in gradient checks)", scores_float32),
    Mutant("scores_scale_q_in_place", "attention_scores",
           "scales q with q.mul_(1/√d_k) to save memory: the caller's queries are divided by √d_k too, "
           "and again at every call", scores_scale_q_in_place),
    Mutant("softmax_no_max_subtraction", "softmax",
           "exp(x) / sum(exp(x)) without subtracting the max: exp overflows to inf for logits above ~88 in "
           "float32 and the result is NaN", softmax_no_max_subtraction),
    Mutant("softmax_global_max", "softmax",
           "subtracts one global max instead of each row's: rows far below it underflow to 0/0", softmax_global_max),
    Mutant("softmax_ignores_dim", "softmax",
           "always normalises the last axis, ignoring the dim argument", softmax_ignores_dim),
    Mutant("softmax_max_subtracted_in_place", "softmax",
           "x -= x.amax(dim, keepdim=True): stable, but the caller's logits are shifted in place",
           softmax_max_subtracted_in_place),
    Mutant("causal_without_diagonal", "causal_mask",
           "tril(diagonal=-1): a token cannot see itself (the first token then sees nothing)", causal_without_diagonal),
    Mutant("causal_inverted", "causal_mask",
           "True = masked (the convention of nn.MultiheadAttention's bool attn_mask) where True = may attend "
           "is expected (F.scaled_dot_product_attention's convention)", causal_inverted),
    Mutant("causal_top_left", "causal_mask",
           "aligned to the top-left corner, like is_causal=True of F.scaled_dot_product_attention (PyTorch "
           "added torch.nn.attention.bias.causal_lower_right for the cache case): wrong when seq_q < seq_k",
           causal_top_left),
    Mutant("causal_float", "causal_mask",
           "a float 0/1 mask: used as an additive mask it adds 0 or 1 to the scores instead of hiding keys", causal_float),
    Mutant("causal_unchecked", "causal_mask",
           "no check of seq_k >= seq_q: tril with a negative diagonal silently gives queries that see no key",
           causal_unchecked),
    Mutant("causal_no_size_check", "causal_mask",
           "checks seq_k >= seq_q but not sizes below 1: causal_mask(0) returns an empty mask instead of refusing",
           causal_no_size_check),
    Mutant("padding_2d", "padding_mask",
           "(batch, seq_k) mask: broadcasts against (batch, heads, seq_q, seq_k) onto the wrong axes", padding_2d),
    Mutant("padding_inverted", "padding_mask",
           "True on the padding (key_padding_mask convention of nn.MultiheadAttention) instead of on real tokens",
           padding_inverted),
    Mutant("padding_pad_zero", "padding_mask", "hard-codes pad id 0 instead of using pad_id", padding_pad_zero),
    Mutant("padding_on_queries", "padding_mask",
           "(batch, 1, seq, 1): masks padded queries instead of padded keys", padding_on_queries),
    Mutant("sdpa_no_scaling", "scaled_dot_product_attention", "no 1/√d_k", _sdpa(scale="none")),
    Mutant("sdpa_divide_by_d_k", "scaled_dot_product_attention", "divides by d_k", _sdpa(scale="d_k")),
    Mutant("sdpa_softmax_over_queries", "scaled_dot_product_attention",
           "softmax over dim=-2 (the queries): columns sum to 1 instead of rows", _sdpa(softmax_dim=-2)),
    Mutant("sdpa_mask_after_softmax", "scaled_dot_product_attention",
           "zeroes masked weights after the softmax: rows no longer sum to 1", _sdpa(after=True)),
    Mutant("sdpa_inverted_mask", "scaled_dot_product_attention",
           "fills where the mask is True (True read as 'ignore')", _sdpa(invert=True)),
    Mutant("sdpa_inverted_mask_rows_zeroed", "scaled_dot_product_attention",
           "masked_fill(mask, torch.finfo(dtype).min): fills where the mask is True, then zeroes the rows of "
           "mask.any() as the text says; a query that may see every key gets uniform weights over none",
           _sdpa(invert=True, zero_by_mask=True)),
    Mutant("sdpa_fill_minus_1e4", "scaled_dot_product_attention",
           "fills masked scores with -1e4 (Hugging Face BERT's extended attention mask used -10000.0 before "
           "torch.finfo(dtype).min): masked keys leak when the real scores are below about -1e4",
           _sdpa(fill="-1e4")),
    Mutant("sdpa_fill_minus_inf", "scaled_dot_product_attention",
           "fills with -inf: a query whose keys are all masked gets NaN weights (the NaN of "
           "nn.MultiheadAttention with a fully padded sequence)", _sdpa(fill="-inf", zero_dead_rows=False)),
    Mutant("sdpa_fill_minus_1e9", "scaled_dot_product_attention",
           "fills with -1e9: does not fit in float16 (masked_fill raises, a cast gives -inf)", _sdpa(fill="-1e9")),
    Mutant("sdpa_dead_rows_uniform", "scaled_dot_product_attention",
           "finite fill but fully masked rows are not zeroed: the query averages values it may not see",
           _sdpa(zero_dead_rows=False)),
    Mutant("sdpa_detached_weights", "scaled_dot_product_attention",
           "weights detached from the graph: no gradient reaches q and k, W_Q and W_K never learn",
           _sdpa(detach=True)),
    Mutant("sdpa_mask_unchecked", "scaled_dot_product_attention",
           "a float 0/1 mask is silently converted with .bool() instead of refused: a float mask usually means "
           "an additive one (0 = keep, -inf = hide), whose 0s would then hide the kept keys", _sdpa(check=False)),
    Mutant("tiled_output_not_rescaled", "tiled_attention",
           "the running sum is rescaled when the max grows, the running output is not: earlier blocks "
           "keep too much weight", _tiled(rescale_output=False)),
    Mutant("tiled_sum_not_rescaled", "tiled_attention",
           "the running output is rescaled, the running sum is not: the normaliser is too large", _tiled(rescale_sum=False)),
    Mutant("tiled_block_max", "tiled_attention",
           "shifts each block by its own max instead of the running max: exact in exact arithmetic, but "
           "exp(m_old - m_new) overflows when a later block's scores are far smaller", _tiled(shift="block")),
    Mutant("tiled_no_max", "tiled_attention",
           "no running max at all (exp of the raw scores): overflows to inf for large scores", _tiled(shift="none")),
    Mutant("tiled_max_starts_at_zero", "tiled_attention",
           "running max initialised to 0 instead of -inf: rows whose scores are all very negative underflow to 0/0",
           _tiled(start_max=0.0)),
    Mutant("tiled_drops_last_block", "tiled_attention",
           "range(0, seq_k - block_size + 1, block_size): the last, shorter block is skipped", _tiled(stop="whole")),
    Mutant("tiled_no_scaling", "tiled_attention", "forgets the 1/√d_k", _tiled(scale="none")),
    Mutant("tiled_full_matrix", "tiled_attention",
           "exact attention that builds the whole (seq_q, seq_k) score matrix: the memory FlashAttention avoids",
           _tiled(full=True)),
    Mutant("tiled_scale_q_in_place", "tiled_attention",
           "q.mul_(1/√d_k): the caller's queries are scaled in place", _tiled(in_place=True)),
    Mutant("tiled_block_size_unchecked", "tiled_attention",
           "no check of block_size: range() raises its own 'arg 3 must not be zero', which names nothing the "
           "caller passed", _tiled(check=False)),
    Mutant("tiled_block_size_not_int_unchecked", "tiled_attention",
           "checks block_size < 1 but not that it is an int: block_size=2.5 reaches range(), whose TypeError "
           "names nothing the caller passed", _tiled(check="sign")),
]
