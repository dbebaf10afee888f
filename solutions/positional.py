"""Chapter 3 — positional encodings.

Self-attention is permutation-equivariant: shuffle the tokens and the outputs
are shuffled the same way, so "dog bites man" and "man bites dog" look alike.
Position must be injected: added to the embeddings (sinusoidal, learned),
rotated into queries and keys (RoPE), or added to the scores (ALiBi).
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor, nn


def sinusoidal_encoding(seq_len: int, d_model: int) -> Float[Tensor, "seq d_model"]:
    """``PE[p, 2i] = sin(p / 10000^(2i/d))``, ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``."""
    if not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"seq_len must be a non-negative int; got {seq_len!r}")
    if not isinstance(d_model, int) or d_model < 1:
        raise ValueError(f"d_model must be a positive int; got {d_model!r}")
    position = torch.arange(seq_len, dtype=torch.float64)[:, None]
    even = torch.arange(0, d_model, 2, dtype=torch.float64)  # the 2i of the formula
    angle = position / 10000.0 ** (even / d_model)  # (seq, ceil(d/2)): fast to slow frequencies
    pe = torch.zeros(seq_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.to(torch.get_default_dtype())


def _check_positions(x: Tensor, start_pos: int, max_len: int, d_model: int) -> None:
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"x must be (batch, seq, d_model={d_model}); got shape {tuple(x.shape)}")
    if not isinstance(start_pos, int) or start_pos < 0:
        raise ValueError(f"start_pos must be a non-negative int; got {start_pos!r}")
    end = start_pos + x.shape[1]
    if end > max_len:
        raise ValueError(
            f"positions {start_pos}..{end - 1} go past max_len={max_len}; "
            f"build the module with max_len >= {end} or feed shorter sequences"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encodings of positions ``start_pos…`` to ``x`` (no parameters)."""

    def __init__(self, d_model: int, max_len: int = 4096, dropout: float = 0.0) -> None:
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Float[Tensor, "batch seq d_model"], start_pos: int = 0) -> Float[Tensor, "batch seq d_model"]:
        _check_positions(x, start_pos, self.max_len, self.d_model)
        return self.dropout(x + self.pe[start_pos : start_pos + x.shape[1]].to(x.dtype))


class LearnedPositionalEmbedding(nn.Module):
    """A trained vector per position; it cannot go past ``max_len``, so it says so."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, x: Float[Tensor, "batch seq d_model"], start_pos: int = 0) -> Float[Tensor, "batch seq d_model"]:
        """``x`` plus the learned vectors of positions ``start_pos … start_pos + seq - 1``.

        Raises ValueError (naming ``max_len``) when those positions go past ``max_len``.
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, seq, d_model={self.d_model}); got shape {tuple(x.shape)}")
        if not isinstance(start_pos, int) or start_pos < 0:
            raise ValueError(f"start_pos must be a non-negative int; got {start_pos!r}")
        end = start_pos + x.shape[1]
        if end > self.max_len:  # an embedding table has no row for these: fail fast, never wrap or clamp
            raise ValueError(
                f"positions {start_pos}..{end - 1} go past max_len={self.max_len}; "
                f"build the module with max_len >= {end} or feed shorter sequences"
            )
        positions = torch.arange(start_pos, end, device=x.device)
        return x + self.embedding(positions)


def rope_angles(seq_len: int, d_head: int, start_pos: int = 0, base: float = 10000.0) -> Float[Tensor, "seq half"]:
    """θ[p, i] = p · base^(-2i/d_head) for the pair of dimensions (2i, 2i+1)."""
    inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    position = torch.arange(start_pos, start_pos + seq_len, dtype=torch.float64)
    return position[:, None] * inv_freq[None, :]


def apply_rope(
    x: Float[Tensor, "batch heads seq d_head"], start_pos: int = 0, base: float = 10000.0
) -> Float[Tensor, "batch heads seq d_head"]:
    """Rotate each pair ``(x[2i], x[2i+1])`` at position p by the angle ``p · base^(-2i/d_head)``.

    Apply it to queries and keys (never values): the score of a query at m and
    a key at n then depends only on ``m - n``.
    """
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, heads, seq, d_head); got shape {tuple(x.shape)}")
    if x.shape[-1] % 2:
        raise ValueError(f"d_head={x.shape[-1]} must be even: RoPE rotates pairs of dimensions")
    if not isinstance(start_pos, int) or start_pos < 0:
        raise ValueError(f"start_pos must be a non-negative int; got {start_pos!r}")
    angle = rope_angles(x.shape[-2], x.shape[-1], start_pos, base).to(x.device)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    pairs = rearrange(x, "... seq (half two) -> ... seq half two", two=2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rearrange(rotated, "... seq half two -> ... seq (half two)")


def apply_rope_complex(
    x: Float[Tensor, "batch heads seq d_head"], start_pos: int = 0, base: float = 10000.0
) -> Float[Tensor, "batch heads seq d_head"]:
    """:func:`apply_rope` by complex multiplication: the pair ``(x[2i], x[2i+1])`` is the number
    ``x[2i] + i·x[2i+1]``, and turning it by ``θ`` is multiplying it by ``e^{iθ}``."""
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, heads, seq, d_head); got shape {tuple(x.shape)}")
    if x.shape[-1] % 2:
        raise ValueError(f"d_head={x.shape[-1]} must be even: RoPE rotates pairs of dimensions")
    if not isinstance(start_pos, int) or start_pos < 0:
        raise ValueError(f"start_pos must be a non-negative int; got {start_pos!r}")
    angle = rope_angles(x.shape[-2], x.shape[-1], start_pos, base).to(x.device)
    turn = torch.polar(torch.ones_like(angle), angle)  # e^{iθ} = cos θ + i·sin θ
    real = x if x.dtype in (torch.float32, torch.float64) else x.float()  # complex numbers need float32/64
    pairs = torch.view_as_complex(rearrange(real, "... seq (half two) -> ... seq half two", two=2).contiguous())
    rotated = pairs * turn.to(pairs.dtype)
    return rearrange(torch.view_as_real(rotated), "... seq half two -> ... seq (half two)").to(x.dtype)

def alibi_slopes(n_heads: int) -> Float[Tensor, "heads"]:
    """The ALiBi paper's geometric slopes: for 8 heads 1/2, 1/4, …, 1/256.

    For a head count that is not a power of two, take the slopes of the power of
    two below it, then every other slope of the next power of two.
    """
    if not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int; got {n_heads!r}")

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two_slopes(n_heads)
    else:
        lower = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two_slopes(lower) + power_of_two_slopes(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(slopes, dtype=torch.get_default_dtype())


def alibi_bias(n_heads: int, seq_q: int, seq_k: int) -> Float[Tensor, "heads seq_q seq_k"]:
    """``-slope · |i + (seq_k - seq_q) - j|``: a penalty growing with distance, per head."""
    for name, value in (("seq_q", seq_q), ("seq_k", seq_k)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")
    query_pos = torch.arange(seq_q)[:, None] + (seq_k - seq_q)  # end-aligned, like causal_mask
    distance = (query_pos - torch.arange(seq_k)[None, :]).abs()
    return -alibi_slopes(n_heads)[:, None, None] * distance
