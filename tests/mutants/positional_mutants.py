"""Planted bugs for chapter 3 (positional encodings): each must FAIL the hidden checks of its exercise.

Each mutant is a copy of the ``solutions.positional`` code with one realistic change. The copies never
call ``solutions.positional`` itself: that would be delegation, refused before the judge looks at the answer.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import nn

from mutants import Mutant  # tests/ is on sys.path under pytest


def _rope_angles(seq_len, d_head, start_pos=0, base=10000.0):
    inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    return torch.arange(start_pos, start_pos + seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]


def _alibi_slopes(n_heads):
    def power_of_two_slopes(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two_slopes(n_heads))
    lower = 2 ** math.floor(math.log2(n_heads))
    return torch.tensor(power_of_two_slopes(lower) + power_of_two_slopes(2 * lower)[0::2][: n_heads - lower])


class _Learned(nn.Module):
    """The given __init__ of LearnedPositionalEmbedding (the checks load embedding.weight)."""

    def __init__(self, max_len, d_model):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.embedding = nn.Embedding(max_len, d_model)


# --- sinusoidal_encoding ---


def _sinusoid(seq_len: int, d_model: int, *, swap=False, exponent=2.0, base=10000.0, first=0) -> torch.Tensor:
    position = torch.arange(first, first + seq_len, dtype=torch.float64)[:, None]
    two_i = exponent * torch.arange(0, (d_model + 1) // 2, dtype=torch.float64)
    angle = position / base ** (two_i / d_model)
    pe = torch.zeros(seq_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = (torch.cos if swap else torch.sin)(angle)
    pe[:, 1::2] = (torch.sin if swap else torch.cos)(angle[:, : d_model // 2])
    return pe.float()


def sinusoid_sin_cos_swapped(seq_len: int, d_model: int) -> torch.Tensor:
    return _sinusoid(seq_len, d_model, swap=True)


def sinusoid_exponent_i_over_d(seq_len: int, d_model: int) -> torch.Tensor:
    return _sinusoid(seq_len, d_model, exponent=1.0)


def sinusoid_base_1000(seq_len: int, d_model: int) -> torch.Tensor:
    return _sinusoid(seq_len, d_model, base=1000.0)


def sinusoid_positions_from_1(seq_len: int, d_model: int) -> torch.Tensor:
    return _sinusoid(seq_len, d_model, first=1)


def sinusoid_concatenated(seq_len: int, d_model: int) -> torch.Tensor:
    pe = _sinusoid(seq_len, d_model)
    return torch.cat([pe[:, 0::2], pe[:, 1::2]], dim=-1)


def sinusoid_half_precision_angles(seq_len: int, d_model: int) -> torch.Tensor:
    """Computes the angle as p * exp(-2i/d * ln 10000) in float16: visibly wrong at long lengths."""
    position = torch.arange(seq_len, dtype=torch.float16)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)).half()
    angle = (position * div).float()
    pe = torch.zeros(seq_len, d_model)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe


def sinusoid_unchecked(seq_len: int, d_model: int) -> torch.Tensor:
    """No argument checks: d_model=0 gives an empty table, a negative seq_len a RuntimeError from arange."""
    return _sinusoid(seq_len, d_model)


def sinusoid_no_d_model_check(seq_len: int, d_model: int) -> torch.Tensor:
    """Checks seq_len only: d_model=0 returns an empty (seq_len, 0) table without a word."""
    if not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"seq_len must be a non-negative int; got {seq_len!r}")
    return _sinusoid(seq_len, d_model)


def sinusoid_sign_check_only(seq_len: int, d_model: int) -> torch.Tensor:
    """Checks the signs but not that seq_len is an int: 2.5 fails inside torch.zeros with a TypeError."""
    if seq_len < 0:
        raise ValueError(f"seq_len must be non-negative; got {seq_len!r}")
    if d_model < 1:
        raise ValueError(f"d_model must be at least 1; got {d_model!r}")
    return _sinusoid(seq_len, d_model)


# --- LearnedPositionalEmbedding ---


class LearnedStartPosIgnored(_Learned):
    def forward(self, x, start_pos=0):
        if x.shape[1] + start_pos > self.max_len:
            raise ValueError(f"positions go past max_len={self.max_len}")
        return x + self.embedding(torch.arange(x.shape[1]))


class LearnedClampedIndex(_Learned):
    def forward(self, x, start_pos=0):
        positions = torch.arange(start_pos, start_pos + x.shape[1]).clamp(max=self.max_len - 1)
        return x + self.embedding(positions)


class LearnedWrappedIndex(_Learned):
    def forward(self, x, start_pos=0):
        positions = torch.arange(start_pos, start_pos + x.shape[1]) % self.max_len
        return x + self.embedding(positions)


class LearnedIndexError(_Learned):
    """No check: nn.Embedding raises IndexError ("index out of range in self"), a cryptic production failure."""

    def forward(self, x, start_pos=0):
        return x + self.embedding(torch.arange(start_pos, start_pos + x.shape[1]))


class LearnedOffByOneLimit(_Learned):
    """Rejects a sequence that ends exactly at max_len (``>=`` instead of ``>``)."""

    def forward(self, x, start_pos=0):
        end = start_pos + x.shape[1]
        if end >= self.max_len:
            raise ValueError(f"positions {start_pos}..{end - 1} go past max_len={self.max_len}")
        return x + self.embedding(torch.arange(start_pos, end))


class LearnedUncheckedInputs(_Learned):
    """Checks max_len but not the shape of x or the sign of start_pos."""

    def forward(self, x, start_pos=0):
        end = start_pos + x.shape[1] if x.dim() > 1 else start_pos + 1
        if end > self.max_len:
            raise ValueError(f"positions {start_pos}..{end - 1} go past max_len={self.max_len}")
        return x + self.embedding(torch.arange(start_pos, end))


class LearnedNoStartPosCheck(_Learned):
    """Checks the shape of x and max_len, not start_pos: a negative one ends in nn.Embedding's IndexError."""

    def forward(self, x, start_pos=0):
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, seq, d_model={self.d_model}); got shape {tuple(x.shape)}")
        end = start_pos + x.shape[1]
        if end > self.max_len:
            raise ValueError(f"positions {start_pos}..{end - 1} go past max_len={self.max_len}")
        return x + self.embedding(torch.arange(start_pos, end))


class LearnedDimCheckOnly(_Learned):
    """Checks that x is 3-D but not its last size: an x of width 1 broadcasts against the table silently."""

    def forward(self, x, start_pos=0):
        if x.dim() != 3:
            raise ValueError(f"x must be (batch, seq, d_model); got shape {tuple(x.shape)}")
        if not isinstance(start_pos, int) or start_pos < 0:
            raise ValueError(f"start_pos must be a non-negative int; got {start_pos!r}")
        end = start_pos + x.shape[1]
        if end > self.max_len:
            raise ValueError(f"positions {start_pos}..{end - 1} go past max_len={self.max_len}")
        return x + self.embedding(torch.arange(start_pos, end))


# --- apply_rope ---


def _rope(x, start_pos=0, base=10000.0, *, sign=1.0, halves=False, ignore_start=False):
    angle = sign * _rope_angles(x.shape[-2], x.shape[-1], 0 if ignore_start else start_pos, base)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    if halves:
        a, b = x.chunk(2, dim=-1)
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    pairs = rearrange(x, "... seq (half two) -> ... seq half two", two=2)
    a, b = pairs[..., 0], pairs[..., 1]
    return rearrange(torch.stack((a * cos - b * sin, a * sin + b * cos), -1), "... seq half two -> ... seq (half two)")


def rope_transposed(x, start_pos=0, base=10000.0):
    return _rope(x, start_pos, base, sign=-1.0)


def rope_half_split(x, start_pos=0, base=10000.0):
    return _rope(x, start_pos, base, halves=True)


def rope_start_pos_ignored(x, start_pos=0, base=10000.0):
    return _rope(x, start_pos, base, ignore_start=True)


def rope_base_ignored(x, start_pos=0, base=10000.0):
    return _rope(x, start_pos, 10000.0)


def rope_cos_sin_not_paired(x, start_pos=0, base=10000.0):
    """Multiplies by cos and adds sin·x, the same for both members of a pair: not a rotation."""
    angle = _rope_angles(x.shape[-2], x.shape[-1], start_pos, base).repeat_interleave(2, dim=-1)
    return x * angle.cos().to(x.dtype) + x * angle.sin().to(x.dtype)


def rope_rotated_in_place(x, start_pos=0, base=10000.0):
    """Writes the rotated pairs back into x ("saves memory"): the caller's queries/keys are rotated too."""
    angle = _rope_angles(x.shape[-2], x.shape[-1], start_pos, base)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., 0::2].clone(), x[..., 1::2].clone()
    x[..., 0::2] = even * cos - odd * sin
    x[..., 1::2] = even * sin + odd * cos
    return x


def rope_unchecked(x, start_pos=0, base=10000.0):
    """No argument checks: an odd d_head fails inside rearrange, a negative start_pos rotates backwards silently."""
    return _rope(x, start_pos, base)


def rope_no_4d_check(x, start_pos=0, base=10000.0):
    """Checks d_head and start_pos but not that x is 4-D: a (heads, seq, d_head) tensor is rotated anyway."""
    if x.shape[-1] % 2:
        raise ValueError(f"d_head={x.shape[-1]} must be even")
    if not isinstance(start_pos, int) or start_pos < 0:
        raise ValueError(f"start_pos must be a non-negative int; got {start_pos!r}")
    return _rope(x, start_pos, base)


def rope_start_pos_sign_only(x, start_pos=0, base=10000.0):
    """Checks start_pos < 0 but not that it is an int: a float start_pos gives fractional positions."""
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, heads, seq, d_head); got shape {tuple(x.shape)}")
    if x.shape[-1] % 2:
        raise ValueError(f"d_head={x.shape[-1]} must be even")
    if start_pos < 0:
        raise ValueError(f"start_pos must be non-negative; got {start_pos}")
    return _rope(x, start_pos, base)


# --- apply_rope_complex ---


def _rope_complex(x, start_pos=0, base=10000.0, *, conjugate=False, halves=False, ignore_start=False,
                  concatenate=False, in_place=False, precision=None):
    angle = _rope_angles(x.shape[-2], x.shape[-1], 0 if ignore_start else start_pos, base)
    turn = torch.polar(torch.ones_like(angle), -angle if conjugate else angle)
    work = x.to(precision) if precision is not None else x
    if halves:
        a, b = work.chunk(2, dim=-1)
        pairs = torch.complex(a, b)
    else:
        pairs = torch.view_as_complex(rearrange(work, "... seq (half two) -> ... seq half two", two=2))
    if in_place:
        pairs.mul_(turn.to(pairs.dtype))
        return x
    rotated = pairs * turn.to(pairs.dtype)
    if halves or concatenate:
        return torch.cat((rotated.real, rotated.imag), dim=-1).to(x.dtype)
    return rearrange(torch.view_as_real(rotated), "... seq half two -> ... seq (half two)").to(x.dtype)


def rope_complex_conjugate(x, start_pos=0, base=10000.0):
    return _rope_complex(x, start_pos, base, conjugate=True)


def rope_complex_halves(x, start_pos=0, base=10000.0):
    return _rope_complex(x, start_pos, base, halves=True)


def rope_complex_start_pos_ignored(x, start_pos=0, base=10000.0):
    return _rope_complex(x, start_pos, base, ignore_start=True)


def rope_complex_concatenated(x, start_pos=0, base=10000.0):
    return _rope_complex(x, start_pos, base, concatenate=True)


def rope_complex_in_place(x, start_pos=0, base=10000.0):
    return _rope_complex(x, start_pos, base, in_place=True)


def rope_complex_single_precision(x, start_pos=0, base=10000.0):
    return _rope_complex(x, start_pos, base, precision=torch.float32)


# --- alibi_slopes ---


def slopes_naive(n_heads: int) -> torch.Tensor:
    start = 2.0 ** (-8.0 / n_heads)
    return torch.tensor([start ** (i + 1) for i in range(n_heads)])


def slopes_negative(n_heads: int) -> torch.Tensor:
    if not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int; got {n_heads!r}")
    return -_alibi_slopes(n_heads)


def slopes_truncated_next_power(n_heads: int) -> torch.Tensor:
    """Takes the first n slopes of the next power of two instead of the paper's interleaving rule."""
    if not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int; got {n_heads!r}")
    upper = 2 ** math.ceil(math.log2(n_heads))
    return _alibi_slopes(upper)[:n_heads]


def slopes_reversed(n_heads: int) -> torch.Tensor:
    if not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int; got {n_heads!r}")
    return _alibi_slopes(n_heads).flip(0)


def slopes_unchecked(n_heads: int) -> torch.Tensor:
    """No check: n_heads=0 fails in math.log2 with 'math domain error', which names nothing the caller passed."""
    return _alibi_slopes(n_heads)


def slopes_sign_check_only(n_heads: int) -> torch.Tensor:
    """Checks n_heads < 1 but not that it is an int: 2.5 fails in a slice with a TypeError."""
    if n_heads < 1:
        raise ValueError(f"n_heads must be at least 1; got {n_heads}")
    return _alibi_slopes(n_heads)


# --- alibi_bias ---


def _checked(seq_q: int, seq_k: int) -> None:
    for name, value in (("seq_q", seq_q), ("seq_k", seq_k)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")


def bias_positive(n_heads: int, seq_q: int, seq_k: int) -> torch.Tensor:
    _checked(seq_q, seq_k)
    distance = (torch.arange(seq_q)[:, None] + (seq_k - seq_q) - torch.arange(seq_k)[None, :]).abs()
    return _alibi_slopes(n_heads)[:, None, None] * distance


def bias_start_aligned(n_heads: int, seq_q: int, seq_k: int) -> torch.Tensor:
    _checked(seq_q, seq_k)
    distance = (torch.arange(seq_q)[:, None] - torch.arange(seq_k)[None, :]).abs()
    return -_alibi_slopes(n_heads)[:, None, None] * distance


def bias_signed_distance(n_heads: int, seq_q: int, seq_k: int) -> torch.Tensor:
    _checked(seq_q, seq_k)
    distance = torch.arange(seq_q)[:, None] + (seq_k - seq_q) - torch.arange(seq_k)[None, :]
    return -_alibi_slopes(n_heads)[:, None, None] * distance


def bias_naive_slopes(n_heads: int, seq_q: int, seq_k: int) -> torch.Tensor:
    _checked(seq_q, seq_k)
    distance = (torch.arange(seq_q)[:, None] + (seq_k - seq_q) - torch.arange(seq_k)[None, :]).abs()
    return -slopes_naive(n_heads)[:, None, None] * distance


def bias_unchecked(n_heads: int, seq_q: int, seq_k: int) -> torch.Tensor:
    """No size checks: seq_q=0 gives an empty bias instead of an error."""
    distance = (torch.arange(seq_q)[:, None] + (seq_k - seq_q) - torch.arange(seq_k)[None, :]).abs()
    return -_alibi_slopes(n_heads)[:, None, None] * distance


def bias_no_seq_k_check(n_heads: int, seq_q: int, seq_k: int) -> torch.Tensor:
    """Checks seq_q only: seq_k = 0 gives an empty bias instead of an error."""
    if not isinstance(seq_q, int) or seq_q < 1:
        raise ValueError(f"seq_q must be a positive int; got {seq_q!r}")
    distance = (torch.arange(seq_q)[:, None] + (seq_k - seq_q) - torch.arange(seq_k)[None, :]).abs()
    return -_alibi_slopes(n_heads)[:, None, None] * distance


MUTANTS: list[Mutant] = [
    Mutant("sin_cos_swapped", "sinusoidal_encoding",
           "cos in the even columns and sin in the odd ones (row 0 becomes 1, 0, 1, 0)", sinusoid_sin_cos_swapped),
    Mutant("exponent_i_over_d", "sinusoidal_encoding",
           "10000^(i/d) with i the column index used per pair instead of 2i/d: frequencies decay half as fast",
           sinusoid_exponent_i_over_d),
    Mutant("base_1000", "sinusoidal_encoding", "base 1000 instead of 10000 (a typo)", sinusoid_base_1000),
    Mutant("positions_from_1", "sinusoidal_encoding", "positions counted from 1 instead of 0",
           sinusoid_positions_from_1),
    Mutant("sin_cos_concatenated", "sinusoidal_encoding",
           "all sines then all cosines (the tensor2tensor layout) where the paper interleaves them",
           sinusoid_concatenated),
    Mutant("half_precision_angles", "sinusoidal_encoding",
           "position × frequency computed in float16: angles lose precision at long lengths", sinusoid_half_precision_angles),
    Mutant("sinusoid_unchecked", "sinusoidal_encoding",
           "no argument checks: d_model=0 returns an empty table, a negative seq_len a cryptic RuntimeError",
           sinusoid_unchecked),
    Mutant("sinusoid_no_d_model_check", "sinusoidal_encoding",
           "checks seq_len only: d_model=0 returns an empty table", sinusoid_no_d_model_check),
    Mutant("sinusoid_sign_check_only", "sinusoidal_encoding",
           "checks the signs only: a seq_len of 2.5 gives a TypeError from torch.zeros", sinusoid_sign_check_only),
    Mutant("learned_start_pos_ignored", "LearnedPositionalEmbedding",
           "positions not advanced with start_pos (every chunk, every cached step, reuses positions 0…)",
           LearnedStartPosIgnored),
    Mutant("learned_clamped_index", "LearnedPositionalEmbedding",
           "past max_len the index is clamped to the last row: silent garbage", LearnedClampedIndex),
    Mutant("learned_wrapped_index", "LearnedPositionalEmbedding",
           "past max_len the index wraps around (p % max_len): silent garbage", LearnedWrappedIndex),
    Mutant("learned_index_error", "LearnedPositionalEmbedding",
           "no length check: nn.Embedding raises a cryptic IndexError ('index out of range in self')",
           LearnedIndexError),
    Mutant("learned_off_by_one_limit", "LearnedPositionalEmbedding",
           "end >= max_len rejected: the last position of the table can never be used", LearnedOffByOneLimit),
    Mutant("learned_unchecked_inputs", "LearnedPositionalEmbedding",
           "checks max_len only: a 2-D x or a negative start_pos gives an IndexError or a silent wrong row",
           LearnedUncheckedInputs),
    Mutant("learned_no_start_pos_check", "LearnedPositionalEmbedding",
           "checks x and max_len but not start_pos: a negative one gives 'index out of range in self'",
           LearnedNoStartPosCheck),
    Mutant("learned_dim_check_only", "LearnedPositionalEmbedding",
           "checks x.dim() only: an x of width 1 broadcasts against the (seq, d_model) rows silently",
           LearnedDimCheckOnly),
    Mutant("rope_transposed", "apply_rope", "rotation by -θ (the transposed matrix)", rope_transposed),
    Mutant("rope_half_split", "apply_rope",
           "pairs (x[i], x[i + d/2]) as in GPT-NeoX/HF rotate_half, where this chapter's convention (and the "
           "original RoFormer / Meta LLaMA code) pairs (x[2i], x[2i+1]); mixing them breaks checkpoint conversions",
           rope_half_split),
    Mutant("rope_start_pos_ignored", "apply_rope", "positions not advanced with start_pos (KV-cache decoding bug)",
           rope_start_pos_ignored),
    Mutant("rope_base_ignored", "apply_rope", "the base argument is ignored (10000 hard-coded)", rope_base_ignored),
    Mutant("rope_not_a_rotation", "apply_rope", "x·cos + x·sin on each coordinate instead of rotating the pair",
           rope_cos_sin_not_paired),
    Mutant("rope_rotated_in_place", "apply_rope",
           "rotated pairs written back into x: the caller's queries and keys change (and rotate again on a second call)",
           rope_rotated_in_place),
    Mutant("rope_unchecked", "apply_rope",
           "no argument checks: an odd d_head fails inside einops, a negative start_pos is accepted", rope_unchecked),
    Mutant("rope_no_4d_check", "apply_rope",
           "checks d_head and start_pos but not that x is 4-D: a 3-D or 5-D tensor is rotated anyway",
           rope_no_4d_check),
    Mutant("rope_start_pos_sign_only", "apply_rope",
           "checks start_pos < 0 but not that it is an int: a float start_pos gives fractional positions",
           rope_start_pos_sign_only),
    Mutant("rope_complex_conjugate", "apply_rope_complex", "multiplies by e^(-iθ): the rotation by -θ",
           rope_complex_conjugate),
    Mutant("rope_complex_halves", "apply_rope_complex",
           "complex numbers built from the two halves (x[i] + i·x[i + d/2]) instead of neighbouring pairs",
           rope_complex_halves),
    Mutant("rope_complex_start_pos_ignored", "apply_rope_complex", "the angles of positions 0… whatever start_pos",
           rope_complex_start_pos_ignored),
    Mutant("rope_complex_concatenated", "apply_rope_complex",
           "real parts then imaginary parts (torch.cat) instead of interleaving them back with view_as_real",
           rope_complex_concatenated),
    Mutant("rope_complex_in_place", "apply_rope_complex",
           "pairs.mul_(e^(iθ)) on the complex view of x: rotates the caller's tensor", rope_complex_in_place),
    Mutant("rope_complex_single_precision", "apply_rope_complex",
           "always works in complex64: a float64 input loses half its digits", rope_complex_single_precision),
    Mutant("slopes_naive", "alibi_slopes",
           "2^(-8i/n) for every n: the paper's rule for non-powers of two (interleave the next power's slopes) "
           "is skipped", slopes_naive),
    Mutant("slopes_negative", "alibi_slopes", "negative slopes (sign folded into the slope)", slopes_negative),
    Mutant("slopes_truncated", "alibi_slopes",
           "first n slopes of the next power of two instead of the paper's interleaving", slopes_truncated_next_power),
    Mutant("slopes_reversed", "alibi_slopes", "slopes in increasing order", slopes_reversed),
    Mutant("slopes_unchecked", "alibi_slopes",
           "no check of n_heads: 0 fails in math.log2 with 'math domain error'", slopes_unchecked),
    Mutant("slopes_sign_check_only", "alibi_slopes",
           "checks n_heads < 1 but not that it is an int: 2.5 fails in a slice with a TypeError",
           slopes_sign_check_only),
    Mutant("bias_positive", "alibi_bias", "+slope·distance: far keys are favoured instead of penalised",
           bias_positive),
    Mutant("bias_start_aligned", "alibi_bias",
           "query i placed at position i even when seq_q < seq_k (wrong with a KV cache)", bias_start_aligned),
    Mutant("bias_signed_distance", "alibi_bias", "signed i - j instead of |i - j|", bias_signed_distance),
    Mutant("bias_naive_slopes", "alibi_bias", "bias built from naive slopes for non-powers of two",
           bias_naive_slopes),
    Mutant("bias_unchecked", "alibi_bias", "no size checks: seq_q = 0 gives an empty bias instead of an error",
           bias_unchecked),
    Mutant("bias_no_seq_k_check", "alibi_bias", "checks seq_q only: seq_k = 0 gives an empty bias",
           bias_no_seq_k_check),
]
