"""Chapter 1 — attention by hand.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V

A query asks, the keys advertise, the values are what is returned: the output
for each query is an average of the values, weighted by how well the query
matches each key. Masks are boolean with **True = may attend**, broadcastable
to ``(batch, heads, seq_q, seq_k)`` — the meaning of a boolean ``attn_mask`` in
``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import importlib.util
import math

import torch
import torch.nn.functional as F
from einops import einsum, rearrange, repeat
from jaxtyping import Bool, Float, Int
from torch import Tensor

BACKENDS = ("auto", "einsum", "sdpa", "flash")


def attention_scores(
    q: Float[Tensor, "... seq_q d_head"],
    k: Float[Tensor, "... seq_k d_head"],
) -> Float[Tensor, "... seq_q seq_k"]:
    """How much each query looks at each key: ``q @ kᵀ / √d_k``."""
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dimension d_head; got q {tuple(q.shape)} "
            f"and k {tuple(k.shape)}"
        )
    # Scaling q (seq_q·d values) is cheaper than scaling the scores (seq_q·seq_k).
    q = q * (1.0 / math.sqrt(q.shape[-1]))
    return einsum(q, k, "... seq_q d_head, ... seq_k d_head -> ... seq_q seq_k")


def softmax(x: Float[Tensor, "..."], dim: int = -1) -> Float[Tensor, "..."]:
    """Numerically stable softmax; equal to ``torch.softmax(x, dim)``."""
    # exp(x - max) never overflows, and the shift cancels in the ratio.
    shifted = x - x.amax(dim=dim, keepdim=True).detach()
    exp = shifted.exp()
    return exp / exp.sum(dim=dim, keepdim=True)


def causal_mask(
    seq_q: int, seq_k: int | None = None, *, device: torch.device | str | None = None
) -> Bool[Tensor, "seq_q seq_k"]:
    """Query i may attend key j iff ``j <= i + (seq_k - seq_q)``.

    Aligned to the end: when a cache holds ``seq_k - seq_q`` earlier keys, the
    last query still sees every key and the first query sees the cached prefix.
    """
    seq_k = seq_q if seq_k is None else seq_k
    for name, value in (("seq_q", seq_q), ("seq_k", seq_k)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")
    if seq_k < seq_q:
        raise ValueError(
            f"seq_k={seq_k} < seq_q={seq_q}: with an end-aligned causal mask the "
            "first queries would see no key at all; pass seq_k >= seq_q"
        )
    return torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).tril(diagonal=seq_k - seq_q)


def padding_mask(tokens: Int[Tensor, "batch seq_k"], pad_id: int) -> Bool[Tensor, "batch 1 1 seq_k"]:
    """True where the key is a real token, False where it is padding."""
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be (batch, seq_k); got shape {tuple(tokens.shape)}")
    if tokens.is_floating_point():
        raise ValueError(f"tokens must be integer token ids; got dtype {tokens.dtype}")
    return rearrange(tokens != pad_id, "batch seq_k -> batch 1 1 seq_k")


def _check_mask(mask: Tensor, scores_shape: torch.Size) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be a bool tensor with True = may attend; got dtype {mask.dtype}. "
            "Convert with mask.bool() (and invert it if True meant 'ignore')"
        )
    # Broadcasting, read from the right: each pair of sizes is equal or one of them is 1.
    if any(m != s and 1 not in (m, s) for m, s in zip(reversed(mask.shape), reversed(scores_shape))):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the scores "
            f"(batch, heads, seq_q, seq_k) = {tuple(scores_shape)}"
        )


def scaled_dot_product_attention(
    q: Float[Tensor, "batch heads seq_q d_head"],
    k: Float[Tensor, "batch heads seq_k d_head"],
    v: Float[Tensor, "batch heads seq_k d_head"],
    mask: Bool[Tensor, "... seq_q seq_k"] | None = None,
) -> tuple[Float[Tensor, "batch heads seq_q d_head"], Float[Tensor, "batch heads seq_q seq_k"]]:
    """softmax(q kᵀ / √d_k) v by hand; returns the output and the attention weights.

    A query whose keys are all masked attends to nothing: its weights and output
    are zero (not NaN, as a -inf fill would give).
    """
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same seq_k; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    scores = attention_scores(q, k)
    if mask is not None:
        _check_mask(mask, scores.shape)
        # Mask after scaling and before softmax. The most negative finite number
        # gives exp(...) = 0 like -inf, but a fully masked row stays finite.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask.any(dim=-1, keepdim=True)
    output = einsum(weights, v, "... seq_q seq_k, ... seq_k d_head -> ... seq_q d_head")
    return output, weights


def tiled_attention(
    q: Float[Tensor, "... seq_q d_head"],
    k: Float[Tensor, "... seq_k d_head"],
    v: Float[Tensor, "... seq_k d_head"],
    block_size: int = 64,
) -> Float[Tensor, "... seq_q d_head"]:
    """Exact softmax(q kᵀ / √d_k) v, reading the keys block by block with an online softmax.

    FlashAttention's core idea: never hold the ``(seq_q, seq_k)`` scores, only
    ``(seq_q, block_size)`` of them, and a running max, sum and output per query.
    """
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size must be a positive int; got {block_size!r}")
    if k.shape[-2] != v.shape[-2] or k.shape[-2] < 1:
        raise ValueError(f"k and v must have the same seq_k >= 1; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    q = q * (1.0 / math.sqrt(q.shape[-1]))
    running_max = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype, device=q.device)
    running_sum = torch.zeros((*q.shape[:-1], 1), dtype=q.dtype, device=q.device)
    output = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    for start in range(0, k.shape[-2], block_size):
        k_block, v_block = k[..., start : start + block_size, :], v[..., start : start + block_size, :]
        scores = einsum(q, k_block, "... seq_q d_head, ... seq_k d_head -> ... seq_q seq_k")
        new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
        # What was summed under the old max is worth exp(old - new) as much under the new one
        # (0 for the first block, whose old max is -inf).
        rescale = (running_max - new_max).exp()
        p = (scores - new_max).exp()
        running_sum = running_sum * rescale + p.sum(dim=-1, keepdim=True)
        output = output * rescale + einsum(p, v_block, "... seq_q seq_k, ... seq_k d_head -> ... seq_q d_head")
        running_max = new_max
    return output / running_sum


def flash_available() -> bool:
    """True when the flash-attn package is installed and a CUDA device is present."""
    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def _flash_unusable(q: Tensor, mask: Tensor | None) -> str | None:
    """Why the flash backend cannot run these inputs, or None if it can."""
    if importlib.util.find_spec("flash_attn") is None:
        return "the flash-attn package is not installed (pip install 'transformer-deep-dive[flash]')"
    if not q.is_cuda:
        return f"flash-attn runs on CUDA tensors only; q is on {q.device}"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"flash-attn needs float16 or bfloat16; q is {q.dtype}"
    if mask is not None:
        return "flash-attn takes no arbitrary mask (only is_causal=True)"
    return None


def _flash(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, dropout_p: float) -> Tensor:
    from flash_attn import flash_attn_func  # type: ignore[import-not-found]

    # flash-attn wants (batch, seq, heads, d_head); it handles GQA itself and its
    # causal mask is aligned to the end, like ours.
    layout = "batch heads seq d_head -> batch seq heads d_head"
    out = flash_attn_func(
        rearrange(q, layout), rearrange(k, layout), rearrange(v, layout),
        dropout_p=dropout_p, causal=is_causal,
    )
    return rearrange(out, "batch seq heads d_head -> batch heads seq d_head")


def _check_attention_args(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout_p: float, backend: str
) -> tuple[int, int, int, int]:
    """The argument checks of :func:`attention`; returns (heads, kv_heads, seq_q, seq_k)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            "q, k, v must be (batch, heads, seq, d_head); got shapes "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1); got {dropout_p}")
    heads, kv_heads = q.shape[1], k.shape[1]
    if v.shape[1] != kv_heads or heads % kv_heads:
        raise ValueError(
            f"k and v need the same number of heads, dividing q's {heads}; got k {k.shape[1]}, v {v.shape[1]}"
        )
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    if is_causal and seq_k < seq_q:
        raise ValueError(f"is_causal=True needs seq_k >= seq_q; got seq_q={seq_q}, seq_k={seq_k}")
    if mask is not None:
        _check_mask(mask, torch.Size((q.shape[0], heads, seq_q, seq_k)))
    return heads, kv_heads, seq_q, seq_k


def _einsum_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float) -> Tensor:
    """The ``"einsum"`` backend of :func:`attention` (the mask already includes any causal part)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads:
        # Each group of heads // kv_heads query heads shares one K/V head.
        pattern = "batch kv_heads seq d_head -> batch (kv_heads group) seq d_head"
        k = repeat(k, pattern, group=heads // kv_heads)
        v = repeat(v, pattern, group=heads // kv_heads)
    # The maths of scaled_dot_product_attention above, with PyTorch's fused
    # softmax: one pass over the (seq_q, seq_k) scores instead of five.
    scores = attention_scores(q, k)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        live = mask.any(dim=-1, keepdim=True)
        if not bool(live.all()):  # fully masked queries attend to nothing
            weights = weights * live
    if dropout_p > 0.0:
        # Dropout goes on the attention weights, never on q, k or v.
        weights = F.dropout(weights, p=dropout_p, training=True)
    return einsum(weights, v, "... seq_q seq_k, ... seq_k d_head -> ... seq_q d_head")


def attention(
    q: Float[Tensor, "batch heads seq_q d_head"],
    k: Float[Tensor, "batch kv_heads seq_k d_head"],
    v: Float[Tensor, "batch kv_heads seq_k d_head"],
    mask: Bool[Tensor, "... seq_q seq_k"] | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    backend: str = "auto",
) -> Float[Tensor, "batch heads seq_q d_head"]:
    """Attention with a choice of implementation.

    ``"einsum"`` is the by-hand version above, ``"sdpa"`` is PyTorch's fused
    ``F.scaled_dot_product_attention``, ``"flash"`` the flash-attn package (CUDA,
    half precision). ``"auto"`` picks the fastest that can run and never fails.
    ``is_causal=True`` means ``mask = causal_mask(seq_q, seq_k)`` (end-aligned).
    ``k``/``v`` may have fewer heads than ``q`` (GQA/MQA) if they divide them.
    """
    heads, kv_heads, seq_q, seq_k = _check_attention_args(q, k, v, mask, is_causal, dropout_p, backend)

    if backend == "auto":
        # q.is_cuda first: a CPU call then never asks for CUDA (torch.cuda.is_available reads the environment
        # each time), a saving that counts in a decoding step, one token per call.
        backend = "flash" if q.is_cuda and flash_available() and _flash_unusable(q, mask) is None else "sdpa"
    if backend == "flash":
        reason = _flash_unusable(q, mask)
        if reason is not None:
            raise RuntimeError(f"backend='flash' cannot run here: {reason}. Use backend='auto' or 'sdpa'")
        return _flash(q, k, v, is_causal, dropout_p)

    if is_causal and (mask is not None or seq_q != seq_k or backend == "einsum"):
        # PyTorch's own is_causal is aligned to the top-left corner, so build ours.
        causal = causal_mask(seq_q, seq_k, device=q.device)
        mask = causal if mask is None else mask & causal
        is_causal = False

    if backend == "sdpa":
        enable_gqa = {"enable_gqa": True} if heads != kv_heads else {}
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, **enable_gqa
        )

    return _einsum_attention(q, k, v, mask, dropout_p)
