"""Library tests of solutions.multihead against nn.MultiheadAttention and explicit computations."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from solutions.attention import causal_mask, padding_mask
from solutions.multihead import (
    MultiHeadAttention,
    attention_parameter_count,
    merge_heads,
    query_gradient_norm,
    repeat_kv_heads,
    split_heads,
)

CONFIGS = [(8, 1), (12, 3), (32, 4), (64, 8)]  # d_model, n_heads


def pair(d_model, n_heads, seed, bias=True):
    """A seeded nn.MultiheadAttention (batch first, non-zero biases) and our copy of it, both in eval mode."""
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(d_model, n_heads, bias=bias, batch_first=True)
    if bias:
        with torch.no_grad():
            theirs.in_proj_bias.normal_(0, 0.2)
            theirs.out_proj.bias.normal_(0, 0.2)
    return theirs.eval(), MultiHeadAttention.from_torch(theirs).eval()


# --- split_heads / merge_heads ---


@pytest.mark.parametrize("batch,seq,heads,d_head", [(1, 1, 1, 1), (2, 5, 3, 4), (3, 7, 8, 2)])
def test_split_heads_matches_view_transpose(batch, seq, heads, d_head):
    x = torch.randn(batch, seq, heads * d_head)
    out = split_heads(x, heads)
    assert out.shape == (batch, heads, seq, d_head)
    torch.testing.assert_close(out, x.view(batch, seq, heads, d_head).transpose(1, 2))
    # head h holds the contiguous block of features h·d_head … (h+1)·d_head - 1
    for h in range(heads):
        torch.testing.assert_close(out[:, h], x[..., h * d_head:(h + 1) * d_head])


@pytest.mark.parametrize("batch,seq,heads,d_head", [(1, 1, 1, 1), (2, 5, 3, 4), (3, 7, 8, 2)])
def test_merge_heads_inverts_split_heads(batch, seq, heads, d_head):
    x = torch.randn(batch, seq, heads * d_head)
    torch.testing.assert_close(merge_heads(split_heads(x, heads)), x, atol=0, rtol=0)
    y = torch.randn(batch, heads, seq, d_head)
    torch.testing.assert_close(split_heads(merge_heads(y), heads), y, atol=0, rtol=0)


@pytest.mark.parametrize("x,n_heads", [(torch.randn(2, 3, 10), 4), (torch.randn(2, 3, 10), 0), (torch.randn(3, 10), 2)])
def test_split_heads_bad_arguments_raise(x, n_heads):
    with pytest.raises(ValueError, match="n_heads" if x.dim() == 3 else "x must be"):
        split_heads(x, n_heads)


def test_merge_heads_rejects_3d_input():
    with pytest.raises(ValueError, match="x must be"):
        merge_heads(torch.randn(2, 3, 4))


# --- equal to nn.MultiheadAttention with copied weights ---


@pytest.mark.parametrize("d_model,n_heads", CONFIGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_multihead_attention_self_attention_matches_torch(d_model, n_heads, seed):
    theirs, ours = pair(d_model, n_heads, seed)
    x = torch.randn(2, 6, d_model)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x, x, x, need_weights=False)[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("d_model,n_heads", CONFIGS)
def test_multihead_attention_cross_attention_matches_torch(d_model, n_heads):
    theirs, ours = pair(d_model, n_heads, seed=2)
    x, context = torch.randn(3, 4, d_model), torch.randn(3, 9, d_model)
    with torch.no_grad():
        out = ours(x, context)
        torch.testing.assert_close(out, theirs(x, context, context, need_weights=False)[0], atol=1e-5, rtol=1e-4)
    assert out.shape == (3, 4, d_model)


@pytest.mark.parametrize("d_model,n_heads", CONFIGS)
def test_multihead_attention_causal_matches_torch(d_model, n_heads):
    theirs, ours = pair(d_model, n_heads, seed=3)
    x = torch.randn(2, 7, d_model)
    # PyTorch's boolean attn_mask means True = NOT allowed; ours True = may attend.
    expected = theirs(x, x, x, attn_mask=~causal_mask(7), need_weights=False)[0]
    with torch.no_grad():
        torch.testing.assert_close(ours(x, is_causal=True), expected, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ours(x, mask=causal_mask(7)), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("d_model,n_heads", CONFIGS)
def test_multihead_attention_key_padding_matches_torch(d_model, n_heads):
    theirs, ours = pair(d_model, n_heads, seed=4)
    tokens = torch.tensor([[3, 4, 5, 6, 7, 8], [3, 4, 5, 0, 0, 0], [3, 0, 0, 0, 0, 0]])
    mask = padding_mask(tokens, pad_id=0)
    x, context = torch.randn(3, 4, d_model), torch.randn(3, 6, d_model)
    expected = theirs(x, context, context, key_padding_mask=~mask[:, 0, 0], need_weights=False)[0]
    with torch.no_grad():
        torch.testing.assert_close(ours(x, context, mask), expected, atol=1e-5, rtol=1e-4)


def test_multihead_attention_without_bias_matches_torch():
    theirs, ours = pair(16, 4, seed=5, bias=False)
    assert ours.in_proj.bias is None and ours.out_proj.bias is None
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x, x, x, need_weights=False)[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("d_model,n_heads", CONFIGS)
def test_multihead_attention_weights_match_torch(d_model, n_heads):
    theirs, ours = pair(d_model, n_heads, seed=6)
    x, context = torch.randn(2, 3, d_model), torch.randn(2, 5, d_model)
    _, expected = theirs(x, context, context, need_weights=True, average_attn_weights=False)
    with torch.no_grad():
        weights = ours.attention_weights(x, context)
    torch.testing.assert_close(weights, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, n_heads, 3))


def test_from_torch_rejects_other_modules():
    with pytest.raises(ValueError, match="module"):
        MultiHeadAttention.from_torch(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="kdim"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))


# --- grouped-query and multi-query attention ---


@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 1), (4, 2), (8, 2), (6, 3), (4, 4)])
@pytest.mark.parametrize("cross", [False, True])
def test_multihead_attention_gqa_matches_explicit_repeat(n_heads, n_kv_heads, cross):
    torch.manual_seed(7)
    d_model = n_heads * 4
    module = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads).eval()
    x = torch.randn(2, 5, d_model)
    context = torch.randn(2, 7, d_model) if cross else None
    d_head, kv_dim = 4, n_kv_heads * 4
    w_q, w_k, w_v = module.in_proj.weight.split([d_model, kv_dim, kv_dim])
    b_q, b_k, b_v = module.in_proj.bias.split([d_model, kv_dim, kv_dim])
    source = x if context is None else context
    q = F.linear(x, w_q, b_q).view(2, 5, n_heads, d_head).transpose(1, 2)
    k = F.linear(source, w_k, b_k).view(2, -1, n_kv_heads, d_head).transpose(1, 2)
    v = F.linear(source, w_v, b_v).view(2, -1, n_kv_heads, d_head).transpose(1, 2)
    group = n_heads // n_kv_heads
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
    expected = module.out_proj(out.transpose(1, 2).reshape(2, 5, d_model))
    with torch.no_grad():
        torch.testing.assert_close(module(x, context), expected, atol=1e-5, rtol=1e-4)
        weights = module.attention_weights(x, context)
    assert weights.shape == (2, n_heads, 5, source.shape[1])


@pytest.mark.parametrize("kv_heads,n_heads", [(1, 4), (2, 6), (3, 3)])
def test_repeat_kv_heads_groups_consecutive_query_heads(kv_heads, n_heads):
    x = torch.randn(2, kv_heads, 3, 5)
    out = repeat_kv_heads(x, n_heads)
    torch.testing.assert_close(out, x.repeat_interleave(n_heads // kv_heads, dim=1), atol=0, rtol=0)
    for i in range(n_heads):
        torch.testing.assert_close(out[:, i], x[:, i // (n_heads // kv_heads)], atol=0, rtol=0)


@pytest.mark.parametrize("x,n_heads", [(torch.randn(1, 4, 2, 2), 6), (torch.randn(1, 4, 2, 2), 2), (torch.randn(4, 2, 2), 4)])
def test_repeat_kv_heads_bad_arguments_raise(x, n_heads):
    with pytest.raises(ValueError, match="n_heads" if x.dim() == 4 else "x must be"):
        repeat_kv_heads(x, n_heads)


def test_multi_query_shrinks_kv_projection():
    mha, gqa, mqa = (MultiHeadAttention(64, 8, n_kv_heads=k) for k in (None, 2, 1))
    assert mha.in_proj.weight.shape == (3 * 64, 64)
    assert gqa.in_proj.weight.shape == (64 + 2 * 2 * 8, 64)
    assert mqa.in_proj.weight.shape == (64 + 2 * 8, 64)


# --- parameter counts ---


@pytest.mark.parametrize("d_model,n_heads", CONFIGS + [(768, 12)])
@pytest.mark.parametrize("bias", [True, False])
def test_attention_parameter_count_matches_torch(d_model, n_heads, bias):
    expected = sum(p.numel() for p in nn.MultiheadAttention(d_model, n_heads, bias=bias).parameters())
    assert attention_parameter_count(d_model, n_heads, bias=bias) == expected
    assert sum(p.numel() for p in MultiHeadAttention(d_model, n_heads, bias=bias).parameters()) == expected


@pytest.mark.parametrize(
    "d_model,n_heads,n_kv_heads,bias",
    [(64, 8, 2, True), (64, 8, 1, False), (768, 12, 4, True), (12288, 96, None, True), (8192, 64, 8, False)],
)
def test_attention_parameter_count_matches_module(d_model, n_heads, n_kv_heads, bias):
    with torch.device("meta"):  # shapes only: the big configurations allocate nothing
        module = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads, bias=bias)
    assert attention_parameter_count(d_model, n_heads, n_kv_heads, bias) == sum(p.numel() for p in module.parameters())


def test_attention_parameter_count_known_sizes():
    assert attention_parameter_count(768, 12) == 4 * 768 * 768 + 4 * 768 == 2_362_368
    # LLaMA-2 70B attention: no biases, 8 K/V heads of 128
    assert attention_parameter_count(8192, 64, 8, bias=False) == 2 * 8192 * 8192 + 2 * 8192 * 8 * 128


# --- bad arguments ---


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        ((100, 8), {}, "n_heads"),
        ((0, 1), {}, "d_model"),
        ((64, 0), {}, "n_heads"),
        ((64, 8), {"n_kv_heads": 3}, "n_kv_heads"),
        ((64, 8), {"n_kv_heads": 0}, "n_kv_heads"),
        ((64, 8), {"dropout": 1.0}, "dropout"),
    ],
)
def test_multihead_attention_bad_arguments_raise(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(*args, **kwargs)
    if "dropout" not in kwargs:
        with pytest.raises(ValueError, match=match):
            attention_parameter_count(*args, **kwargs)


def test_multihead_attention_divisibility_error_lists_choices():
    with pytest.raises(ValueError, match=r"pick n_heads from \[1, 2, 4, 5, 10, 20, 25, 50, 100\]"):
        MultiHeadAttention(100, 8)


@pytest.mark.parametrize(
    "x,context,match",
    [
        (torch.randn(2, 5, 12), None, "x must be"),
        (torch.randn(5, 16), None, "x must be"),
        (torch.randn(2, 5, 16), torch.randn(3, 4, 16), "context"),
        (torch.randn(2, 5, 16), torch.randn(2, 4, 8), "context"),
    ],
)
def test_multihead_attention_forward_bad_shapes_raise(x, context, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(16, 4)(x, context)


# --- backends, dropout, gradients ---


@pytest.mark.parametrize("n_kv_heads", [None, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_multihead_attention_backends_agree(n_kv_heads, causal):
    torch.manual_seed(8)
    module = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).eval()
    x, context = torch.randn(2, 6, 32), torch.randn(2, 6, 32)
    mask = padding_mask(torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]), pad_id=0)
    outputs = {}
    for backend in ("einsum", "sdpa", "auto"):
        module.backend = backend
        with torch.no_grad():
            outputs[backend] = module(x, context, mask, is_causal=causal)
    torch.testing.assert_close(outputs["einsum"], outputs["sdpa"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs["auto"], outputs["sdpa"], atol=1e-5, rtol=1e-5)


def test_multihead_attention_dropout_only_in_training():
    torch.manual_seed(9)
    module = MultiHeadAttention(16, 4, dropout=0.5)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        module.train()
        a, b = module(x), module(x)
        module.eval()
        c, d = module(x), module(x)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(c, d, atol=0, rtol=0)


def test_multihead_attention_dropout_drops_whole_attention_weights():
    """One key: dropping its weight zeroes a whole head block of the (pre-W_O) output."""
    torch.manual_seed(10)
    module = MultiHeadAttention(16, 4, dropout=0.5).train()
    with torch.no_grad():
        module.out_proj.weight.copy_(torch.eye(16))
        module.out_proj.bias.zero_()
    x, context = torch.randn(4, 8, 16), torch.randn(4, 1, 16)
    with torch.no_grad():
        out = module(x, context).view(4, 8, 4, 4)
        v = F.linear(context, module.in_proj.weight[32:], module.in_proj.bias[32:]).view(4, 1, 4, 4)
    kept = torch.isclose(out, (v / 0.5).expand_as(out), atol=1e-5).all(-1)
    dropped = (out == 0).all(-1)
    assert (kept | dropped).all() and kept.any() and dropped.any()


def test_multihead_attention_gradients_reach_every_parameter():
    module = MultiHeadAttention(16, 4, n_kv_heads=2)
    x, context = torch.randn(2, 3, 16, requires_grad=True), torch.randn(2, 5, 16)
    module(x, context, is_causal=False).square().sum().backward()
    for name, p in module.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad.abs().sum() > 0


def test_multihead_attention_is_causal_no_future_leak():
    torch.manual_seed(11)
    module = MultiHeadAttention(16, 4).eval()
    x = torch.randn(1, 6, 16)
    y = x.clone()
    y[:, 4:] += 5.0  # change the future of position 3
    with torch.no_grad():
        torch.testing.assert_close(module(x, is_causal=True)[:, :4], module(y, is_causal=True)[:, :4])
        assert not torch.allclose(module(x)[:, :4], module(y)[:, :4])


# --- query_gradient_norm ---


def _weights(d_model, d_head, seed, dtype=torch.float64, batch=2, seq=6):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, d_model, generator=gen, dtype=dtype)
    w = [torch.randn(d_model, d_head, generator=gen, dtype=dtype) / d_model**0.5 for _ in range(3)]
    target = torch.randn(batch, seq, d_head, generator=gen, dtype=dtype)
    return x, *w, target


@pytest.mark.parametrize("scaled", [True, False])
@pytest.mark.parametrize("d_head", [4, 32])
def test_query_gradient_norm_matches_sdpa_backward(scaled, d_head):
    x, w_q, w_k, w_v, target = _weights(16, d_head, seed=d_head)
    leaf = w_q.clone().requires_grad_(True)
    out = F.scaled_dot_product_attention(x @ leaf, x @ w_k, x @ w_v, scale=None if scaled else 1.0)
    (out - target).pow(2).mean().backward()
    assert query_gradient_norm(x, w_q, w_k, w_v, target, scaled=scaled) == pytest.approx(leaf.grad.norm().item(),
                                                                                          rel=1e-9)
    assert not w_q.requires_grad and w_q.grad is None  # the caller's tensor is untouched


def test_query_gradient_norm_unscaled_becomes_rare_and_spiky_as_d_head_grows():
    """Without 1/√d_head most draws get almost no gradient (saturated softmax) while a few get a large one;
    with it, the spread stays put. Measured over fixed seeds: (10th, 90th) percentile of the norm."""

    def spread(d_head, scaled):
        norms = sorted(query_gradient_norm(*_weights(64, d_head, seed, batch=1, seq=4), scaled=scaled) for seed in range(20))
        return norms[2], norms[17]

    (low_4, high_4), (low_1024, high_1024) = spread(4, False), spread(1024, False)
    assert low_1024 < 0.01 * low_4 and high_1024 > high_4, (low_4, high_4, low_1024, high_1024)
    (low_4, _), (low_1024, _) = spread(4, True), spread(1024, True)
    assert low_1024 > 0.3 * low_4, (low_4, low_1024)


def test_query_gradient_norm_works_under_no_grad_and_rejects_bad_shapes():
    args = _weights(8, 4, seed=2)
    with torch.no_grad():
        assert query_gradient_norm(*args) > 0
    x, w_q, w_k, w_v, target = args
    with pytest.raises(ValueError, match="w_q"):
        query_gradient_norm(x, w_q[:-1], w_k, w_v, target)
