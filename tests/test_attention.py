"""Library tests of solutions.attention against F.scaled_dot_product_attention and torch.softmax."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F

from solutions.attention import (
    attention,
    attention_scores,
    causal_mask,
    flash_available,
    padding_mask,
    scaled_dot_product_attention,
    softmax,
    tiled_attention,
)

SHAPES = [(1, 1, 3, 3, 4), (2, 4, 5, 7, 8), (3, 2, 6, 6, 16)]  # batch, heads, seq_q, seq_k, d_head


def qkv(batch, heads, seq_q, seq_k, d_head, seed, kv_heads=None, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    kv_heads = heads if kv_heads is None else kv_heads
    q = torch.randn(batch, heads, seq_q, d_head, generator=gen, dtype=dtype)
    k = torch.randn(batch, kv_heads, seq_k, d_head, generator=gen, dtype=dtype)
    v = torch.randn(batch, kv_heads, seq_k, d_head, generator=gen, dtype=dtype)
    return q, k, v


def random_mask(batch, seq_q, seq_k, seed):
    """A (batch, 1, seq_q, seq_k) mask with at least one True per row."""
    gen = torch.Generator().manual_seed(seed + 1000)
    mask = torch.rand(batch, 1, seq_q, seq_k, generator=gen) < 0.6
    mask[..., 0] = True
    return mask


# --- attention_scores ---


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_attention_scores_equal_scaled_matmul(shape, seed):
    q, k, _ = qkv(*shape, seed)
    expected = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    torch.testing.assert_close(attention_scores(q, k), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_attention_scores_softmax_matches_sdpa(shape):
    q, k, v = qkv(*shape, seed=3)
    ours = torch.softmax(attention_scores(q, k), dim=-1) @ v
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=1e-5)


def test_attention_scores_rejects_different_d_head():
    with pytest.raises(ValueError, match="d_head"):
        attention_scores(torch.randn(1, 2, 4), torch.randn(1, 2, 5))


# --- softmax ---


@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("scale", [1.0, 100.0, 1e4, 1e30])
def test_softmax_equals_torch_softmax(dim, scale):
    gen = torch.Generator().manual_seed(int(math.log10(scale)) + dim)
    x = torch.randn(4, 5, 6, generator=gen) * scale
    out = softmax(x, dim=dim)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.softmax(x, dim=dim), atol=1e-6, rtol=1e-5)


def test_softmax_large_logits_stay_finite():
    x = torch.tensor([[1000.0, 999.0, -1000.0], [-1e38, -1e38, -1e38], [3.4e38, 0.0, -3.4e38]])
    torch.testing.assert_close(softmax(x), torch.softmax(x, dim=-1))
    assert torch.isfinite(softmax(x)).all()


def test_softmax_gradient_matches_torch():
    x = torch.randn(3, 7, requires_grad=True)
    y = x.detach().clone().requires_grad_(True)
    cot = torch.randn(3, 7)
    (softmax(x) * cot).sum().backward()
    (torch.softmax(y, -1) * cot).sum().backward()
    torch.testing.assert_close(x.grad, y.grad, atol=1e-6, rtol=1e-5)


# --- causal_mask ---


@pytest.mark.parametrize("seq_q,seq_k", [(1, 1), (4, 4), (3, 7), (1, 5), (6, 6)])
def test_causal_mask_end_aligned_rule(seq_q, seq_k):
    mask = causal_mask(seq_q, seq_k)
    assert mask.dtype == torch.bool and mask.shape == (seq_q, seq_k)
    for i in range(seq_q):
        for j in range(seq_k):
            assert bool(mask[i, j]) == (j <= i + (seq_k - seq_q))
    # The last query sees every key: right for a KV cache holding the prefix.
    assert mask[-1].all()


def test_causal_mask_square_is_lower_triangular():
    torch.testing.assert_close(causal_mask(5), torch.ones(5, 5, dtype=torch.bool).tril())


def test_causal_mask_matches_sdpa_is_causal():
    q, k, v = qkv(2, 3, 6, 6, 8, seed=4)
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(6)),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        atol=1e-6, rtol=1e-5,
    )


@pytest.mark.parametrize("args,name", [((0,), "seq_q"), ((3, 0), "seq_k"), ((2.5,), "seq_q"), ((5, 3), "seq_k"), ((True,), "seq_q")])
def test_causal_mask_bad_arguments_raise(args, name):
    with pytest.raises(ValueError, match=name):
        causal_mask(*args)


# --- padding_mask ---


def test_padding_mask_shape_and_polarity():
    tokens = torch.tensor([[5, 6, 7, 0, 0], [1, 0, 2, 3, 0]])
    mask = padding_mask(tokens, pad_id=0)
    assert mask.shape == (2, 1, 1, 5) and mask.dtype == torch.bool
    assert mask[0, 0, 0].tolist() == [True, True, True, False, False]
    assert mask[1, 0, 0].tolist() == [True, False, True, True, False]


def test_padding_mask_ignores_padded_keys():
    """Changing the values behind padded keys changes nothing."""
    tokens = torch.tensor([[4, 5, 6, 9, 9], [4, 5, 9, 9, 9]])
    mask = padding_mask(tokens, pad_id=9)
    q, k, v = qkv(2, 2, 3, 5, 4, seed=5)
    k2, v2 = k.clone(), v.clone()
    k2[..., 3:, :] += 100.0
    v2[..., 3:, :] -= 50.0
    torch.testing.assert_close(attention(q, k, v, mask), attention(q, k2, v2, mask))


@pytest.mark.parametrize("tokens", [torch.tensor([1, 2, 0]), torch.zeros(2, 3)])
def test_padding_mask_rejects_bad_tokens(tokens):
    with pytest.raises(ValueError, match="tokens"):
        padding_mask(tokens, pad_id=0)


# --- scaled_dot_product_attention (by hand) ---


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("masked", [False, True])
def test_scaled_dot_product_attention_matches_torch(shape, masked):
    q, k, v = qkv(*shape, seed=6)
    mask = random_mask(shape[0], shape[2], shape[3], seed=6) if masked else None
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-6, rtol=0)
    if masked:
        assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


@pytest.mark.parametrize("backend", ["einsum", "sdpa"])
def test_fully_masked_rows_give_zeros_not_nan(backend):
    q, k, v = qkv(1, 2, 3, 4, 8, seed=7)
    mask = torch.tensor([[True, False, True, False], [False, False, False, False], [True, True, True, True]])
    out = attention(q, k, v, mask, backend=backend)
    assert torch.isfinite(out).all()
    assert (out[:, :, 1] == 0).all()
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(weights).all() and (weights[:, :, 1] == 0).all()


def test_scaled_dot_product_attention_gradient_flows_to_query():
    q, k, v = qkv(1, 2, 4, 4, 8, seed=8)
    q.requires_grad_(True)
    out, _ = scaled_dot_product_attention(q, k, v, causal_mask(4))
    (grad,) = torch.autograd.grad(out.square().sum(), q)
    assert grad[:, :, 1:].abs().sum() > 0  # the first query sees one key only: its gradient is zero


# --- attention: backends, masks, is_causal, GQA ---


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask_kind", ["none", "random", "padding", "causal"])
def test_attention_backends_agree(shape, mask_kind):
    batch, heads, seq_q, seq_k, d_head = shape
    q, k, v = qkv(*shape, seed=9)
    mask = {
        "none": None,
        "random": random_mask(batch, seq_q, seq_k, seed=9),
        "padding": padding_mask(torch.tensor([[1] * (seq_k - 1) + [0]] * batch), pad_id=0),
        "causal": causal_mask(seq_q, seq_k),
    }[mask_kind]
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    for backend in ("einsum", "sdpa", "auto"):
        torch.testing.assert_close(attention(q, k, v, mask, backend=backend), reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seq_q,seq_k", [(5, 5), (2, 7), (1, 4)])
@pytest.mark.parametrize("backend", ["einsum", "sdpa", "auto"])
def test_attention_is_causal_is_end_aligned(seq_q, seq_k, backend):
    q, k, v = qkv(2, 2, seq_q, seq_k, 8, seed=10)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(seq_q, seq_k))
    torch.testing.assert_close(attention(q, k, v, is_causal=True, backend=backend), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["einsum", "sdpa"])
def test_attention_is_causal_combines_with_mask(backend):
    q, k, v = qkv(2, 2, 4, 6, 8, seed=11)
    mask = random_mask(2, 4, 6, seed=11)
    mask[..., :3] = True  # every query keeps at least its first keys
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask & causal_mask(4, 6))
    torch.testing.assert_close(attention(q, k, v, mask, is_causal=True, backend=backend), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads", [(4, 1), (4, 2), (6, 3), (8, 8)])
@pytest.mark.parametrize("backend", ["einsum", "sdpa", "auto"])
def test_attention_grouped_query_matches_explicit_repeat(heads, kv_heads, backend):
    q, k, v = qkv(2, heads, 5, 5, 8, seed=12, kv_heads=kv_heads)
    group = heads // kv_heads
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), attn_mask=causal_mask(5)
    )
    torch.testing.assert_close(attention(q, k, v, is_causal=True, backend=backend), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(flash_available(), reason="flash-attn and CUDA are present")
def test_attention_flash_backend_raises_clear_error_without_cuda():
    q, k, v = qkv(1, 2, 4, 4, 8, seed=13)
    with pytest.raises(RuntimeError, match="backend='flash' cannot run here"):
        attention(q, k, v, backend="flash")
    # auto never fails
    torch.testing.assert_close(attention(q, k, v, backend="auto"), F.scaled_dot_product_attention(q, k, v))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_attention_flash_backend_matches_sdpa_on_cuda():
    if importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash-attn is not installed")
    q, k, v = (t.cuda() for t in qkv(2, 4, 64, 64, 64, seed=14, dtype=torch.float16))
    for causal in (False, True):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(attention(q, k, v, is_causal=causal, backend="flash"), expected, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("backend", ["einsum", "sdpa"])
def test_attention_dropout_acts_on_weights_only(backend):
    """With one key its weight is 1: dropping it zeroes a whole (head, query) row of the output,
    keeping it scales the row by 1/(1-p). Dropout on q, k or v would not give whole rows."""
    q, k, v = qkv(4, 4, 16, 1, 8, seed=15)
    torch.manual_seed(0)
    out = attention(q, k, v, dropout_p=0.5, backend=backend)
    kept = torch.isclose(out, (v / 0.5).expand_as(out), atol=1e-5).all(-1)
    dropped = (out == 0).all(-1)
    assert (kept | dropped).all()
    assert 0.3 < dropped.float().mean() < 0.7


def test_attention_dropout_is_unbiased_on_average():
    q, k, v = qkv(1, 2, 4, 6, 8, seed=16)
    torch.manual_seed(0)
    mean = torch.stack([attention(q, k, v, dropout_p=0.2, backend="einsum") for _ in range(3000)]).mean(0)
    torch.testing.assert_close(mean, attention(q, k, v), atol=0.1, rtol=0)


@pytest.mark.parametrize(
    "kwargs,shapes,match",
    [
        ({"backend": "cuda"}, None, "backend"),
        ({"dropout_p": 1.0}, None, "dropout_p"),
        ({"dropout_p": -0.1}, None, "dropout_p"),
        ({"is_causal": True}, ((1, 2, 5, 8), (1, 2, 3, 8), (1, 2, 3, 8)), "is_causal"),
        ({}, ((2, 5, 8), (2, 5, 8), (2, 5, 8)), "q, k, v"),
        ({}, ((1, 4, 5, 8), (1, 3, 5, 8), (1, 3, 5, 8)), "heads"),
        ({}, ((1, 4, 5, 8), (1, 2, 5, 8), (1, 1, 5, 8)), "heads"),
    ],
)
def test_attention_bad_arguments_raise(kwargs, shapes, match):
    shapes = shapes or ((1, 2, 3, 8),) * 3
    q, k, v = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, **kwargs)


@pytest.mark.parametrize(
    "mask,match", [(torch.ones(3, 3), "bool"), (torch.ones(2, 2, dtype=torch.bool), "broadcast")]
)
def test_attention_bad_mask_raises(mask, match):
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match=match):
        attention(q, q, q, mask)


def test_scaled_dot_product_attention_rejects_k_v_length_mismatch():
    with pytest.raises(ValueError, match="seq_k"):
        scaled_dot_product_attention(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 4, 4))


# --- tiled_attention ---


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block_size", [1, 2, 3, 64])
def test_tiled_attention_matches_sdpa(shape, block_size):
    q, k, v = qkv(*shape, seed=block_size)
    torch.testing.assert_close(tiled_attention(q, k, v, block_size), F.scaled_dot_product_attention(q, k, v),
                               atol=1e-5, rtol=1e-4)


def test_tiled_attention_large_scores_stay_finite_and_exact():
    # Rows whose scores are all around +2000 (exp overflows) or all around -2000 (exp underflows to 0).
    q, k, v = qkv(1, 2, 6, 23, 4, seed=3, dtype=torch.float64)
    sign = torch.tensor([1.0, -1.0] * 3, dtype=torch.float64)[:, None]
    q, k = q.abs() * sign * 40, k.abs() * 40
    out = tiled_attention(q, k, v, block_size=5)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-10, rtol=1e-8)


def test_tiled_attention_never_builds_the_score_matrix():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.largest = max(Largest.largest, t.numel())
            return out

    q, k, v = qkv(1, 2, 8, 256, 4, seed=0)
    with Largest():
        tiled_attention(q, k, v, block_size=16)
    assert Largest.largest < 2 * 8 * 256 / 4, Largest.largest  # far below the 4096 scores of the full matrix
    with Largest():
        scaled_dot_product_attention(q, k, v)
    assert Largest.largest >= 2 * 8 * 256  # the by-hand version does build it


@pytest.mark.parametrize("block_size", [0, -1, 2.0, True])
def test_tiled_attention_rejects_bad_block_size(block_size):
    q, k, v = qkv(1, 1, 2, 3, 4, seed=0)
    with pytest.raises(ValueError, match="block_size"):
        tiled_attention(q, k, v, block_size)
