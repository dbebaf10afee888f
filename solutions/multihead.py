"""Chapter 2 — multi-head attention.

h heads attend in parallel, each in its own d_model/h-dimensional subspace;
their outputs are concatenated and mixed by W_O. With ``n_kv_heads < n_heads``
groups of query heads share one key/value head (GQA; ``n_kv_heads=1`` is MQA),
which shrinks the K/V projections and the KV cache by ``n_heads / n_kv_heads``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum, rearrange, repeat
from einops.layers.torch import Rearrange
from jaxtyping import Bool, Float
from torch import Tensor, nn

from solutions.attention import attention, scaled_dot_product_attention


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def split_heads(x: Float[Tensor, "batch seq d_model"], n_heads: int) -> Float[Tensor, "batch heads seq d_head"]:
    """``(batch, seq, heads·d_head)`` → ``(batch, heads, seq, d_head)``: head h owns features h·d_head…"""
    if x.dim() != 3:
        raise ValueError(f"x must be (batch, seq, d_model); got shape {tuple(x.shape)}")
    if n_heads < 1 or x.shape[-1] % n_heads:
        raise ValueError(
            f"d_model={x.shape[-1]} is not divisible by n_heads={n_heads}; "
            f"pick n_heads from {_divisors(x.shape[-1])}"
        )
    return rearrange(x, "batch seq (heads d_head) -> batch heads seq d_head", heads=n_heads)


def merge_heads(x: Float[Tensor, "batch heads seq d_head"]) -> Float[Tensor, "batch seq d_model"]:
    """The inverse of :func:`split_heads`."""
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, heads, seq, d_head); got shape {tuple(x.shape)}")
    return rearrange(x, "batch heads seq d_head -> batch seq (heads d_head)")


def repeat_kv_heads(x: Float[Tensor, "batch kv_heads seq d_head"], n_heads: int) -> Float[Tensor, "batch heads seq d_head"]:
    """Give each of ``n_heads`` query heads its K/V head: query head i uses K/V head ``i // (n_heads // kv_heads)``."""
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, kv_heads, seq, d_head); got shape {tuple(x.shape)}")
    kv_heads = x.shape[1]
    if n_heads < 1 or n_heads % kv_heads:
        raise ValueError(
            f"n_heads={n_heads} must be a positive multiple of the kv_heads={kv_heads} heads of x; "
            f"e.g. n_heads={2 * kv_heads}"
        )
    # Consecutive query heads share a K/V head (like repeat_interleave), the grouping GQA checkpoints use.
    return repeat(x, "batch kv_heads seq d_head -> batch (kv_heads group) seq d_head", group=n_heads // kv_heads)


def attention_parameter_count(d_model: int, n_heads: int, n_kv_heads: int | None = None, bias: bool = True) -> int:
    """Weights and biases of ``MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads, bias=bias)``."""
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    if d_model < 1 or n_heads < 1 or d_model % n_heads:
        raise ValueError(
            f"d_model={d_model} is not divisible by n_heads={n_heads}; "
            f"pick n_heads from {_divisors(max(d_model, 1))}"
        )
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(
            f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}; pick n_kv_heads from {_divisors(n_heads)}"
        )
    kv_dim = n_kv_heads * (d_model // n_heads)
    in_features = d_model + 2 * kv_dim  # W_Q is full width; W_K and W_V shrink with n_kv_heads
    return d_model * in_features + d_model * d_model + (in_features + d_model if bias else 0)


def query_gradient_norm(
    x: Float[Tensor, "batch seq d_model"],
    w_q: Float[Tensor, "d_model d_head"],
    w_k: Float[Tensor, "d_model d_head"],
    w_v: Float[Tensor, "d_model d_head"],
    target: Float[Tensor, "batch seq d_head"],
    *,
    scaled: bool = True,
) -> float:
    """‖∂L/∂W_Q‖ for one head, L = mean((softmax(q kᵀ · s) v - target)²), s = 1/√d_head or 1 (``scaled=False``)."""
    if x.dim() != 3 or not w_q.shape == w_k.shape == w_v.shape == (x.shape[-1], w_q.shape[-1]):
        raise ValueError(
            f"x must be (batch, seq, d_model) and w_q, w_k, w_v (d_model, d_head); got x {tuple(x.shape)}, "
            f"w_q {tuple(w_q.shape)}, w_k {tuple(w_k.shape)}, w_v {tuple(w_v.shape)}"
        )
    w_q = w_q.detach().requires_grad_(True)  # our own leaf: the caller's tensor is left alone
    with torch.enable_grad():  # a measurement must work even when called under torch.no_grad()
        q, k, v = x @ w_q, x @ w_k, x @ w_v
        scores = einsum(q, k, "batch seq_q d_head, batch seq_k d_head -> batch seq_q seq_k")
        if scaled:
            scores = scores / math.sqrt(q.shape[-1])
        out = einsum(scores.softmax(dim=-1), v, "batch seq_q seq_k, batch seq_k d_head -> batch seq_q d_head")
        loss = (out - target).pow(2).mean()
        (grad,) = torch.autograd.grad(loss, w_q)
    return grad.norm().item()


class MultiHeadAttention(nn.Module):
    """Multi-head (and grouped-query) attention, batch first.

    ``forward(x)`` is self-attention; ``forward(x, context)`` is cross-attention,
    with queries from ``x`` and keys/values from ``context``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model < 1 or n_heads < 1 or d_model % n_heads:
            raise ValueError(
                f"d_model={d_model} is not divisible by n_heads={n_heads}; "
                f"pick n_heads from {_divisors(max(d_model, 1))}"
            )
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(
                f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}; "
                f"pick n_kv_heads from {_divisors(n_heads)}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {dropout}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_head = d_model // n_heads
        self.dropout = dropout
        self.backend = "auto"  # see solutions.attention.attention
        kv_dim = n_kv_heads * self.d_head
        # One packed projection [W_Q; W_K; W_V]: one matmul instead of three for
        # self-attention, and the same layout as nn.MultiheadAttention.in_proj_weight.
        self.in_proj = nn.Linear(d_model, d_model + 2 * kv_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.split_heads = Rearrange("batch seq (heads d_head) -> batch heads seq d_head", d_head=self.d_head)
        self.merge_heads = Rearrange("batch heads seq d_head -> batch seq (heads d_head)")

    def project_qkv(
        self, x: Float[Tensor, "batch seq_q d_model"], context: Float[Tensor, "batch seq_k d_model"] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """q ``(batch, heads, seq_q, d_head)``, k and v ``(batch, kv_heads, seq_k, d_head)``."""
        sizes = [self.d_model, self.n_kv_heads * self.d_head, self.n_kv_heads * self.d_head]
        if context is None:
            q, k, v = self.in_proj(x).split(sizes, dim=-1)
        else:
            w_q, w_kv = self.in_proj.weight.split([sizes[0], 2 * sizes[1]])
            b_q, b_kv = (None, None) if self.in_proj.bias is None else self.in_proj.bias.split([sizes[0], 2 * sizes[1]])
            q = F.linear(x, w_q, b_q)
            k, v = F.linear(context, w_kv, b_kv).split(sizes[1:], dim=-1)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def forward(
        self,
        x: Float[Tensor, "batch seq_q d_model"],
        context: Float[Tensor, "batch seq_k d_model"] | None = None,
        mask: Bool[Tensor, "... seq_q seq_k"] | None = None,
        *,
        is_causal: bool = False,
    ) -> Float[Tensor, "batch seq_q d_model"]:
        """Self-attention over ``x``, or cross-attention to ``context``; ``mask`` is True where a query may attend."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, seq, d_model={self.d_model}); got shape {tuple(x.shape)}")
        if context is not None and (
            context.dim() != 3 or context.shape[-1] != self.d_model or context.shape[0] != x.shape[0]
        ):
            raise ValueError(
                f"context must be (batch={x.shape[0]}, seq_k, d_model={self.d_model}); "
                f"got shape {tuple(context.shape)}"
            )
        q, k, v = self.project_qkv(x, context)
        dropout_p = self.dropout if self.training else 0.0
        out = attention(q, k, v, mask, is_causal=is_causal, dropout_p=dropout_p, backend=self.backend)
        return self.out_proj(self.merge_heads(out))

    def attention_weights(
        self,
        x: Float[Tensor, "batch seq_q d_model"],
        context: Float[Tensor, "batch seq_k d_model"] | None = None,
        mask: Bool[Tensor, "... seq_q seq_k"] | None = None,
    ) -> Float[Tensor, "batch heads seq_q seq_k"]:
        """The per-head attention maps the forward pass would use (no dropout)."""
        q, k, v = self.project_qkv(x, context)
        k, v = repeat_kv_heads(k, self.n_heads), repeat_kv_heads(v, self.n_heads)
        return scaled_dot_product_attention(q, k, v, mask)[1]

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> "MultiHeadAttention":
        """An equivalent module with ``module``'s weights copied (same outputs, batch first)."""
        if not isinstance(module, nn.MultiheadAttention):
            raise ValueError(f"module must be an nn.MultiheadAttention; got {type(module).__name__}")
        if not module._qkv_same_embed_dim:
            raise ValueError("module has kdim/vdim different from embed_dim; only the packed layout is supported")
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("module uses add_bias_kv or add_zero_attn, which MultiHeadAttention does not have")
        has_bias = module.in_proj_bias is not None
        ours = cls(module.embed_dim, module.num_heads, dropout=module.dropout, bias=has_bias)
        ours = ours.to(device=module.in_proj_weight.device, dtype=module.in_proj_weight.dtype)
        with torch.no_grad():
            ours.in_proj.weight.copy_(module.in_proj_weight)
            ours.out_proj.weight.copy_(module.out_proj.weight)
            if has_bias:
                ours.in_proj.bias.copy_(module.in_proj_bias)
                ours.out_proj.bias.copy_(module.out_proj.bias)
        return ours
