"""Library tests for solutions.positional: formulas against direct loops, properties, and the papers' code."""

from __future__ import annotations

import math

import pytest
import torch

from solutions.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    apply_rope_complex,
    sinusoidal_encoding,
)

# --- sinusoidal ---


@pytest.mark.parametrize("seq_len, d_model", [(1, 2), (7, 4), (50, 16), (33, 7), (128, 64)])
def test_sinusoidal_encoding_matches_paper_formula_loop(seq_len, d_model):
    expected = torch.empty(seq_len, d_model, dtype=torch.float64)
    for p in range(seq_len):
        for column in range(d_model):
            two_i = column - column % 2  # columns 2i and 2i+1 share the frequency of pair i
            angle = p / 10000 ** (two_i / d_model)
            expected[p, column] = math.sin(angle) if column % 2 == 0 else math.cos(angle)
    out = sinusoidal_encoding(seq_len, d_model)
    assert out.shape == (seq_len, d_model)
    assert out.dtype == torch.get_default_dtype()
    torch.testing.assert_close(out.double(), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("shift", [1, 3, 10, 57])
@pytest.mark.parametrize("d_model", [8, 32])
def test_sinusoidal_encoding_shift_is_a_fixed_rotation(shift, d_model):
    pe = sinusoidal_encoding(400, d_model).double()
    # Constructed: pair i at p + k is pair i at p rotated by k·ω_i (angle-sum formulas).
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    rotation = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i, w in enumerate(omega):
        c, s = math.cos(shift * w), math.sin(shift * w)
        # [sin(a+b), cos(a+b)] = [[cos b, sin b], [-sin b, cos b]] @ [sin a, cos a]
        rotation[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    torch.testing.assert_close(pe[:-shift] @ rotation.T, pe[shift:], atol=1e-6, rtol=0)
    # Fitted: one least-squares matrix from even positions predicts the odd ones (float64 table,
    # positions up to 20000 so that even the slowest frequencies turn enough to be identifiable).
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        table = sinusoidal_encoding(20000 + shift, d_model)
    finally:
        torch.set_default_dtype(previous)
    p = torch.arange(0, 20000, 2)
    fitted = torch.linalg.lstsq(table[p], table[p + shift]).solution
    torch.testing.assert_close(table[p + 1] @ fitted, table[p + 1 + shift], atol=1e-8, rtol=0)
    torch.testing.assert_close(fitted, rotation.T, atol=1e-6, rtol=0)


def test_sinusoidal_encoding_positions_are_unique_and_bounded():
    pe = sinusoidal_encoding(2048, 64).double()
    distances = torch.cdist(pe, pe) + torch.eye(2048, dtype=torch.float64) * 1e9
    assert distances.min() > 1e-2
    assert pe.abs().max() <= 1.0


@pytest.mark.parametrize("bad", [(-1, 8), (4, 0), (4.0, 8), (4, "8")])
def test_sinusoidal_encoding_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="seq_len|d_model"):
        sinusoidal_encoding(*bad)


@pytest.mark.parametrize("start_pos", [0, 1, 13])
def test_sinusoidal_module_forward_adds_positions_from_start_pos(start_pos):
    gen = torch.Generator().manual_seed(start_pos)
    module = SinusoidalPositionalEncoding(12, max_len=40)
    assert sum(p.numel() for p in module.parameters()) == 0
    x = torch.randn(2, 5, 12, generator=gen)
    expected = x + sinusoidal_encoding(start_pos + 5, 12)[start_pos:]
    torch.testing.assert_close(module(x, start_pos=start_pos), expected)


@pytest.mark.parametrize("module_factory", [
    lambda: SinusoidalPositionalEncoding(8, max_len=20),
    lambda: LearnedPositionalEmbedding(20, 8),
], ids=["sinusoidal", "learned"])
def test_positional_modules_chunks_equal_whole(module_factory):
    torch.manual_seed(0)
    module = module_factory().eval()
    x = torch.randn(3, 20, 8)
    whole = module(x)
    chunks = torch.cat([module(x[:, :7]), module(x[:, 7:12], start_pos=7), module(x[:, 12:], start_pos=12)], dim=1)
    torch.testing.assert_close(chunks, whole)


def test_learned_positional_embedding_forward_uses_table_rows():
    torch.manual_seed(1)
    module = LearnedPositionalEmbedding(16, 4)
    x = torch.randn(2, 6, 4)
    torch.testing.assert_close(module(x, start_pos=10), x + module.embedding.weight[10:16])


@pytest.mark.parametrize("module_factory", [
    lambda: SinusoidalPositionalEncoding(8, max_len=10),
    lambda: LearnedPositionalEmbedding(10, 8),
], ids=["sinusoidal", "learned"])
@pytest.mark.parametrize("seq, start_pos", [(11, 0), (1, 10), (4, 7), (10, 1)])
def test_positional_modules_past_max_len_raise(module_factory, seq, start_pos):
    module = module_factory()
    module(torch.zeros(1, 10 - start_pos if start_pos < 10 else 0, 8), start_pos=min(start_pos, 10))  # up to the edge is fine
    with pytest.raises(ValueError, match="max_len=10"):
        module(torch.zeros(1, seq, 8), start_pos=start_pos)


@pytest.mark.parametrize("module_factory", [
    lambda: SinusoidalPositionalEncoding(8, max_len=10),
    lambda: LearnedPositionalEmbedding(10, 8),
], ids=["sinusoidal", "learned"])
def test_positional_modules_reject_bad_input(module_factory):
    module = module_factory()
    with pytest.raises(ValueError, match="d_model=8"):
        module(torch.zeros(1, 3, 7))
    with pytest.raises(ValueError, match="d_model=8"):
        module(torch.zeros(3, 8))
    with pytest.raises(ValueError, match="start_pos"):
        module(torch.zeros(1, 3, 8), start_pos=-1)


# --- RoPE ---


def _rope_complex(x: torch.Tensor, start_pos: int = 0, base: float = 10000.0) -> torch.Tensor:
    """RoFormer / LLaMA reference: pairs (x[2i], x[2i+1]) as complex numbers times e^{i·p·θ_i}."""
    d_head = x.shape[-1]
    theta = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    positions = torch.arange(start_pos, start_pos + x.shape[-2], dtype=torch.float64)
    phase = torch.polar(torch.ones(len(positions), len(theta), dtype=torch.float64), torch.outer(positions, theta))
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d_head // 2, 2).contiguous())
    return torch.view_as_real(z * phase).reshape(x.shape)


@pytest.mark.parametrize("shape", [(1, 1, 5, 2), (2, 3, 17, 8), (1, 4, 64, 64)])
@pytest.mark.parametrize("start_pos", [0, 9])
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_apply_rope_matches_complex_reference(shape, start_pos, base):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=torch.float64)
    torch.testing.assert_close(apply_rope(x, start_pos, base), _rope_complex(x, start_pos, base), atol=1e-10, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_apply_rope_preserves_norms_and_dtype(dtype):
    x = torch.randn(2, 3, 50, 16, dtype=dtype, generator=torch.Generator().manual_seed(0))
    out = apply_rope(x, start_pos=100)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("d_head", [2, 8, 32])
def test_apply_rope_score_depends_only_on_offset(d_head):
    gen = torch.Generator().manual_seed(d_head)
    q = torch.randn(1, 1, 1, d_head, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, 1, d_head, generator=gen, dtype=torch.float64)

    def score(m: int, n: int) -> float:
        return float((apply_rope(q, start_pos=m) * apply_rope(k, start_pos=n)).sum())

    for offset in (-7, -1, 0, 1, 5, 30):
        scores = [score(n + offset, n) for n in (max(0, -offset), 11, 40, 333)]
        assert max(scores) - min(scores) < 1e-10, (offset, scores)
    assert abs(score(0, 0) - float((q * k).sum())) < 1e-12  # position 0 is the identity
    assert abs(score(5, 0) - score(0, 5)) > 1e-6 or d_head == 2  # the sign of the offset matters in general


def test_apply_rope_slice_at_start_pos_equals_slice_of_whole():
    x = torch.randn(2, 2, 30, 8, generator=torch.Generator().manual_seed(3))
    whole = apply_rope(x)
    for start, end in [(0, 1), (4, 9), (29, 30), (10, 30)]:
        torch.testing.assert_close(apply_rope(x[:, :, start:end], start_pos=start), whole[:, :, start:end])


@pytest.mark.parametrize("bad_call, match", [
    (lambda: apply_rope(torch.zeros(1, 1, 4, 5)), "even"),
    (lambda: apply_rope(torch.zeros(1, 4, 8)), "batch, heads, seq, d_head"),
    (lambda: apply_rope(torch.zeros(1, 1, 4, 8), start_pos=-2), "start_pos"),
])
def test_apply_rope_rejects_bad_input(bad_call, match):
    with pytest.raises(ValueError, match=match):
        bad_call()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("start_pos, base", [(0, 10000.0), (13, 500.0)])
def test_apply_rope_complex_equals_pairwise_rotation(dtype, start_pos, base):
    x = torch.randn(2, 3, 40, 16, generator=torch.Generator().manual_seed(start_pos)).to(dtype)
    out = apply_rope_complex(x, start_pos, base)
    assert out.dtype == dtype and out.shape == x.shape
    tol = {torch.float16: 2e-3, torch.float32: 1e-5, torch.float64: 1e-12}[dtype]  # float16: one ulp of ~4
    torch.testing.assert_close(out, apply_rope(x, start_pos, base), atol=tol, rtol=tol)


def test_apply_rope_complex_leaves_input_and_rejects_bad_input():
    x = torch.randn(1, 2, 5, 8)
    before = x.clone()
    apply_rope_complex(x, start_pos=3)
    assert torch.equal(x, before)
    with pytest.raises(ValueError, match="even"):
        apply_rope_complex(torch.zeros(1, 1, 4, 5))
    with pytest.raises(ValueError, match="start_pos"):
        apply_rope_complex(x, start_pos=-1)


# --- ALiBi ---


def _paper_slopes(n: int) -> list[float]:
    """The slope rule of Press et al.'s reference code (github.com/ofirpress/attention_with_linear_biases,
    fairseq/models/transformer.py, ``get_slopes``), restated: for a power of two, the geometric
    sequence starting at 2^(-8/n); otherwise the power of two below n, then every other slope of
    twice that power."""

    def power_of_two(m: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    below = 2 ** math.floor(math.log2(n))
    return power_of_two(below) + _paper_slopes(2 * below)[0::2][: n - below]


def test_alibi_slopes_eight_heads_are_the_papers():
    torch.testing.assert_close(alibi_slopes(8).double(), torch.tensor([2.0**-k for k in range(1, 9)], dtype=torch.float64))


@pytest.mark.parametrize("n_heads", range(1, 33))
def test_alibi_slopes_match_paper_code(n_heads):
    out = alibi_slopes(n_heads)
    assert out.shape == (n_heads,)
    torch.testing.assert_close(out.double(), torch.tensor(_paper_slopes(n_heads), dtype=torch.float64), atol=1e-7, rtol=0)
    assert (out > 0).all() and (out <= 1).all()


@pytest.mark.parametrize("bad", [0, -4, 2.0, "8"])
def test_alibi_slopes_rejects_bad_head_count(bad):
    with pytest.raises(ValueError, match="n_heads"):
        alibi_slopes(bad)


@pytest.mark.parametrize("n_heads, seq_q, seq_k", [(1, 1, 1), (8, 6, 6), (12, 3, 9), (5, 1, 7)])
def test_alibi_bias_matches_formula_loop(n_heads, seq_q, seq_k):
    slopes = _paper_slopes(n_heads)
    expected = torch.empty(n_heads, seq_q, seq_k, dtype=torch.float64)
    for h in range(n_heads):
        for i in range(seq_q):
            for j in range(seq_k):
                expected[h, i, j] = -slopes[h] * abs(i + (seq_k - seq_q) - j)
    torch.testing.assert_close(alibi_bias(n_heads, seq_q, seq_k).double(), expected, atol=1e-6, rtol=0)


def test_alibi_bias_is_end_aligned_with_the_square_bias():
    square = alibi_bias(4, 10, 10)
    for seq_q in (1, 3, 9):
        torch.testing.assert_close(alibi_bias(4, seq_q, 10), square[:, -seq_q:])
    assert (square.diagonal(dim1=-2, dim2=-1) == 0).all() and (square <= 0).all()


def test_alibi_bias_as_sdpa_float_mask_adds_to_scores():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 6, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    bias = alibi_bias(4, 6, 6).double()
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8) + bias, dim=-1)
    torch.testing.assert_close(out, weights @ v)


@pytest.mark.parametrize("args", [(4, 0, 3), (4, 3, 0), (4, 2.0, 3), (0, 3, 3)])
def test_alibi_bias_rejects_bad_sizes(args):
    with pytest.raises(ValueError, match="seq_q|seq_k|n_heads"):
        alibi_bias(*args)
