"""solutions.gpt: the cache gives exactly what recomputation gives; limits fail loudly."""

from __future__ import annotations

import pytest
import torch

from solutions.attention import causal_mask
from solutions.gpt import GPT, GPTConfig, KVCache, generate, kv_cache_bytes, sample_next_token

CONFIGS = {
    "mha": dict(n_kv_heads=None),
    "gqa": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
}


def make_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    spec = dict(vocab=37, max_len=48, d_model=32, n_heads=4, n_layers=2) | overrides
    return GPT(GPTConfig(**spec)).eval()


@pytest.mark.parametrize("kind", CONFIGS)
@pytest.mark.parametrize("chunks", [(20,), (1,) * 20, (7, 1, 12), (3, 9, 8), (19, 1)])
def test_gpt_chunked_prompt_equals_full_pass(kind: str, chunks: tuple[int, ...]) -> None:
    model = make_model(**CONFIGS[kind])
    idx = torch.randint(0, 37, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(batch=3)
        parts, start = [], 0
        for size in chunks:
            parts.append(model(idx[:, start : start + size], cache=cache))
            start += size
            assert len(cache) == start
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


def test_gpt_no_future_leak() -> None:
    model = make_model()
    idx = torch.randint(0, 37, (1, 16), generator=torch.Generator().manual_seed(2))
    changed = idx.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 37
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[:, :10], model(changed)[:, :10])


def test_gpt_attention_matches_explicit_causal_mask() -> None:
    """The layer's causal attention equals masking the scores with causal_mask by hand."""
    model = make_model(n_layers=1)
    attn = model.blocks[0].attn
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        q = attn.q_proj(x).view(2, 9, 4, 8).transpose(1, 2)
        k, v = attn.kv_proj(x).view(2, 9, 2, 4, 8).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1) / 8**0.5).masked_fill(~causal_mask(9), float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 9, 32)
        torch.testing.assert_close(attn(x), attn.out_proj(out), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", CONFIGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generate_greedy_identical_with_and_without_cache(kind: str, seed: int) -> None:
    model = make_model(seed, **CONFIGS[kind])
    prompt = torch.randint(0, 37, (2, 5), generator=torch.Generator().manual_seed(seed))
    cached = generate(model, prompt, 40, temperature=0)
    recomputed = generate(model, prompt, 40, temperature=0, use_cache=False)
    assert cached.shape == (2, 45)
    assert torch.equal(cached[:, :5], prompt)
    assert torch.equal(cached, recomputed)


def test_generate_fills_context_exactly() -> None:
    model = make_model()
    out = generate(model, torch.zeros(1, 8, dtype=torch.long), 40, temperature=0)
    assert out.shape == (1, 48)


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("prompt_len, new", [(40, 9), (48, 1), (1, 48), (49, 0)])
def test_generate_past_max_len_raises_before_calling_model(use_cache: bool, prompt_len: int, new: int) -> None:
    model = make_model()
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(ValueError, match="max_len=48"):
        generate(model, torch.zeros(1, prompt_len, dtype=torch.long), new, use_cache=use_cache)
    assert calls == []


def test_gpt_forward_past_max_len_raises() -> None:
    model = make_model()
    cache = model.new_cache()
    model(torch.zeros(1, 40, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="max_len=48"):
        model(torch.zeros(1, 9, dtype=torch.long), cache=cache)
    assert len(cache) == 40
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 49, dtype=torch.long))


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_sampling_reproducible_with_generator(use_cache: bool) -> None:
    model = make_model()
    prompt = torch.zeros(2, 3, dtype=torch.long)
    a = generate(model, prompt, 30, temperature=1.5, generator=torch.Generator().manual_seed(7), use_cache=use_cache)
    b = generate(model, prompt, 30, temperature=1.5, generator=torch.Generator().manual_seed(7), use_cache=use_cache)
    c = generate(model, prompt, 30, temperature=1.5, generator=torch.Generator().manual_seed(8), use_cache=use_cache)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_generate_sampling_same_with_and_without_cache() -> None:
    model = make_model()
    prompt = torch.zeros(1, 3, dtype=torch.long)
    runs = [generate(model, prompt, 30, top_k=5, generator=torch.Generator().manual_seed(3), use_cache=u)
            for u in (True, False)]
    assert torch.equal(*runs)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_generate_top_k_1_equals_greedy(temperature: float) -> None:
    model = make_model(3)
    prompt = torch.randint(0, 37, (2, 4), generator=torch.Generator().manual_seed(3))
    greedy = generate(model, prompt, 30, temperature=0)
    top1 = generate(model, prompt, 30, temperature=temperature, top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(greedy, top1)


def test_generate_top_k_restricts_to_k_most_likely() -> None:
    model = make_model(4)
    prompt = torch.zeros(1, 6, dtype=torch.long)
    allowed = set(torch.topk(model(prompt)[0, -1], 3).indices.tolist())
    seen = {generate(model, prompt, 1, temperature=5.0, top_k=3, generator=torch.Generator().manual_seed(s))[0, -1].item()
            for s in range(60)}
    assert seen <= allowed and len(seen) > 1


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": 38}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
])
def test_generate_rejects_bad_sampling_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        generate(make_model(), torch.zeros(1, 2, dtype=torch.long), 3, **kwargs)


def test_generate_restores_training_mode() -> None:
    model = make_model(dropout=0.5).train()
    generate(model, torch.zeros(1, 2, dtype=torch.long), 3)
    assert model.training


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("batch", [1, 3])
def test_kv_cache_bytes_matches_filled_cache(n_kv_heads: int, batch: int) -> None:
    model = make_model(n_kv_heads=n_kv_heads)
    cache = model.new_cache(batch)
    model(torch.zeros(batch, 30, dtype=torch.long), cache=cache)
    c = model.config
    assert cache.nbytes() == kv_cache_bytes(c.n_layers, n_kv_heads, c.d_head, 30, batch)
    for layer in range(c.n_layers):
        assert cache.keys(layer).shape == (batch, n_kv_heads, 30, c.d_head)
        assert cache.values(layer).shape == (batch, n_kv_heads, 30, c.d_head)
    model(torch.zeros(batch, 18, dtype=torch.long), cache=cache)  # now full: every allocated byte is used
    assert cache.allocated_bytes() == kv_cache_bytes(c.n_layers, n_kv_heads, c.d_head, c.max_len, batch)
    assert cache.nbytes() == cache.allocated_bytes()


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_kv_cache_gqa_mqa_shrink_by_head_ratio(n_kv_heads: int) -> None:
    sizes = {}
    for kv in (4, n_kv_heads):
        model = make_model(n_kv_heads=kv)
        cache = model.new_cache()
        model(torch.zeros(1, 20, dtype=torch.long), cache=cache)
        sizes[kv] = cache.nbytes()
    assert sizes[4] == sizes[n_kv_heads] * (4 // n_kv_heads)


def test_kv_cache_bytes_formula_and_dtype() -> None:
    assert kv_cache_bytes(32, 8, 128, 4096) == 2 * 32 * 8 * 128 * 4096 * 4
    assert kv_cache_bytes(2, 1, 64, 10, batch=3, dtype=torch.float16) == 2 * 2 * 1 * 64 * 10 * 3 * 2
    with pytest.raises(ValueError, match="n_layers"):
        kv_cache_bytes(0, 1, 64, 10)


@pytest.mark.parametrize("kwargs, field", [
    (dict(d_model=30, n_heads=4), "d_model"),
    (dict(n_kv_heads=3), "n_kv_heads"),
    (dict(dropout=1.0), "dropout"),
    (dict(max_len=0), "max_len"),
    (dict(vocab=0), "vocab"),
])
def test_gpt_config_rejects_bad_fields(kwargs: dict, field: str) -> None:
    spec = dict(vocab=37, max_len=48, d_model=32, n_heads=4, n_layers=2) | kwargs
    with pytest.raises(ValueError, match=field):
        GPTConfig(**spec)


def test_gpt_config_derived_sizes() -> None:
    c = GPTConfig(vocab=10, d_model=64, n_heads=8, n_kv_heads=2)
    assert (c.d_head, c.kv_heads) == (8, 2)
    assert GPTConfig(vocab=10, d_model=64, n_heads=8).kv_heads == 8


def test_gpt_gqa_has_fewer_kv_parameters() -> None:
    mha, mqa = make_model(), make_model(n_kv_heads=1)
    assert mha.blocks[0].attn.kv_proj.weight.shape == (64, 32)
    assert mqa.blocks[0].attn.kv_proj.weight.shape == (16, 32)


def test_gpt_weight_tying_and_cache_batch_check() -> None:
    model = make_model()
    assert model.lm_head.weight is model.token_embedding.weight
    assert isinstance(model.new_cache(2), KVCache)
    with pytest.raises(ValueError, match="batch"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=model.new_cache(2))


def test_causal_self_attention_matches_torch_multihead_attention() -> None:
    """Independent reference: nn.MultiheadAttention with the same weights and a causal mask."""
    model = make_model(n_layers=1)
    attn = model.blocks[0].attn
    torch_mha = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(torch.cat((attn.q_proj.weight, attn.kv_proj.weight)))
        torch_mha.in_proj_bias.copy_(torch.cat((attn.q_proj.bias, attn.kv_proj.bias)))
        torch_mha.out_proj.weight.copy_(attn.out_proj.weight)
        torch_mha.out_proj.bias.copy_(attn.out_proj.bias)
        x = torch.randn(2, 11, 32, generator=torch.Generator().manual_seed(5))
        future = ~causal_mask(11)  # nn.MultiheadAttention: True = may NOT attend
        expected, _ = torch_mha(x, x, x, attn_mask=future, need_weights=False)
        torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_causal_self_attention_gqa_groups_consecutive_heads(n_kv_heads: int) -> None:
    model = make_model(n_layers=1, n_kv_heads=n_kv_heads)
    attn = model.blocks[0].attn
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        q = attn.q_proj(x).view(2, 9, 4, 8).transpose(1, 2)
        k, v = attn.kv_proj(x).view(2, 9, 2, n_kv_heads, 8).permute(2, 0, 3, 1, 4)
        k, v = k.repeat_interleave(4 // n_kv_heads, dim=1), v.repeat_interleave(4 // n_kv_heads, dim=1)
        scores = (q @ k.transpose(-2, -1) / 8**0.5).masked_fill(~causal_mask(9), float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 9, 32)
        torch.testing.assert_close(attn(x), attn.out_proj(out), atol=1e-5, rtol=1e-5)


def test_kv_cache_write_past_max_len_raises_and_keeps_everything() -> None:
    cache = KVCache(n_layers=2, batch=1, kv_heads=2, max_len=6, d_head=4)
    k = torch.randn(1, 2, 4, 4)
    for layer in range(2):
        cache.write(layer, k, k + 1)
    cache.advance(4)
    with pytest.raises(ValueError, match="max_len=6"):
        cache.write(0, torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    assert len(cache) == 4
    assert torch.equal(cache.keys(0), k) and torch.equal(cache.values(1), k + 1)


def test_kv_cache_write_returns_held_and_new_without_advancing() -> None:
    cache = KVCache(n_layers=1, batch=2, kv_heads=1, max_len=10, d_head=3)
    first, second = torch.randn(2, 1, 4, 3), torch.randn(2, 1, 2, 3)
    cache.write(0, first, -first)
    cache.advance(4)
    k, v = cache.write(0, second, -second)
    assert len(cache) == 4  # only advance moves the length
    assert torch.equal(k, torch.cat((first, second), dim=2)) and torch.equal(v, -k)


def _frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens.flatten(), minlength=vocab).double() / tokens.numel()


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Reference top-p by a loop: the most likely tokens, one by one, until their total reaches p."""
    keep, total = torch.zeros_like(probs, dtype=torch.bool), 0.0
    for token in probs.argsort(descending=True).tolist():
        keep[token] = True
        total += probs[token].item()
        if total >= top_p:
            break
    return keep


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, None, None), (0.5, None, None), (2.5, None, None), (1.0, 3, None), (0.7, 4, None),
    (1.0, None, 0.6), (2.0, None, 0.8), (1.5, 5, 0.7),
])
def test_sample_next_token_matches_analytic_distribution(temperature, top_k, top_p) -> None:
    row = torch.tensor([2.0, 1.2, 0.9, 0.3, -0.4, -1.0, -2.0])
    n = 40_000
    tokens = sample_next_token(row.expand(n, -1), temperature, top_k, top_p,
                               generator=torch.Generator().manual_seed(11))
    assert tokens.shape == (n, 1) and tokens.dtype == torch.long
    logits = row.double() / temperature
    if top_k is not None:
        logits[logits.argsort(descending=True)[top_k:]] = float("-inf")
    probs = logits.softmax(-1)
    if top_p is not None:
        probs = torch.where(_nucleus(probs, top_p), probs, 0.0)
        probs = probs / probs.sum()
    freq = _frequencies(tokens, 7)
    assert bool((freq[probs == 0] == 0).all()), f"a token outside top-k/top-p was sampled: {freq}"
    sigma = (probs * (1 - probs) / n).sqrt()
    assert bool(((freq - probs).abs() <= 5 * sigma + 1e-4).all()), (freq, probs)


def test_sample_next_token_temperature_zero_is_argmax_and_ignores_generator() -> None:
    logits = torch.randn(5, 9, generator=torch.Generator().manual_seed(3))
    assert torch.equal(sample_next_token(logits, temperature=0), logits.argmax(-1, keepdim=True))
    assert torch.equal(sample_next_token(logits, 0, top_k=2, top_p=0.1), logits.argmax(-1, keepdim=True))


@pytest.mark.parametrize("top_p, kept", [(0.3, {0}), (0.5, {0}), (0.51, {0, 1}), (0.8, {0, 1}), (0.81, {0, 1, 2}),
                                         (1.0, {0, 1, 2, 3})])
def test_sample_next_token_top_p_keeps_the_token_that_crosses_p(top_p: float, kept: set) -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    tokens = sample_next_token(probs.log().expand(4000, -1), top_p=top_p, generator=torch.Generator().manual_seed(0))
    assert set(tokens.flatten().tolist()) == kept


def test_sample_next_token_top_k_keeps_ties_with_the_kth() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 1.0, -1.0]])
    tokens = sample_next_token(logits.expand(4000, -1), top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(tokens.flatten().tolist()) == {1, 2, 3}


def test_sample_next_token_uses_only_the_generator() -> None:
    logits = torch.randn(50, 6, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(1)
    a = sample_next_token(logits, 1.3, generator=torch.Generator().manual_seed(9))
    torch.manual_seed(2)
    b = sample_next_token(logits, 1.3, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a, b)


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.1}, "temperature"), ({"top_k": 7}, "top_k"), ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.2}, "top_p"), ({"top_p": True}, "top_p"),
])
def test_sample_next_token_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sample_next_token(torch.zeros(2, 6), **kwargs)
    with pytest.raises(ValueError, match="logits"):
        sample_next_token(torch.zeros(6))


def test_generate_top_p_same_with_and_without_cache_and_rejected_up_front() -> None:
    model = make_model(5)
    prompt = torch.randint(0, 37, (2, 4), generator=torch.Generator().manual_seed(5))
    runs = [generate(model, prompt, 25, temperature=0.9, top_k=10, top_p=0.8,
                     generator=torch.Generator().manual_seed(2), use_cache=u) for u in (True, False)]
    assert torch.equal(*runs)
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(ValueError, match="top_p"):
        generate(model, prompt, 3, top_p=1.5)
    assert calls == []


def test_generate_runs_without_autograd_and_one_pass_per_token() -> None:
    model = make_model()
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append((torch.is_grad_enabled(), args[0].shape[1])))
    generate(model, torch.zeros(1, 5, dtype=torch.long), 6, temperature=0)
    assert seen == [(False, 5)] + [(False, 1)] * 5
