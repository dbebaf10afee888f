"""solutions.gpt: the cache gives exactly what recomputation gives; limits fail loudly."""

from __future__ import annotations

import collections
import itertools

import pytest
import torch

from solutions.attention import causal_mask
from solutions.gpt import (
    GPT,
    GPTConfig,
    KVCache,
    PagedKVCache,
    SlidingWindowKVCache,
    generate,
    kv_cache_bytes,
    sample_next_token,
    sliding_window_mask,
)

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
    attn = model.layers[0].self_attn
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
    assert (c.d_head, c.resolved_n_kv_heads, c.resolved_d_ff) == (8, 2, 256)
    assert GPTConfig(vocab=10, d_model=64, n_heads=8).resolved_n_kv_heads == 8


def test_gpt_gqa_has_fewer_kv_parameters() -> None:
    mha, mqa = make_model(), make_model(n_kv_heads=1)
    assert mha.layers[0].self_attn.kv_proj.weight.shape == (64, 32)
    assert mqa.layers[0].self_attn.kv_proj.weight.shape == (16, 32)


def test_gpt_weight_tying_and_cache_batch_check() -> None:
    model = make_model()
    assert model.lm_head.weight is model.token_embedding.weight
    assert isinstance(model.new_cache(2), KVCache)
    with pytest.raises(ValueError, match="batch"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=model.new_cache(2))


def test_causal_self_attention_matches_torch_multihead_attention() -> None:
    """Independent reference: nn.MultiheadAttention with the same weights and a causal mask."""
    model = make_model(n_layers=1)
    attn = model.layers[0].self_attn
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
    attn = model.layers[0].self_attn
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        q = attn.q_proj(x).view(2, 9, 4, 8).transpose(1, 2)
        k, v = attn.kv_proj(x).view(2, 9, 2, n_kv_heads, 8).permute(2, 0, 3, 1, 4)
        k, v = k.repeat_interleave(4 // n_kv_heads, dim=1), v.repeat_interleave(4 // n_kv_heads, dim=1)
        scores = (q @ k.transpose(-2, -1) / 8**0.5).masked_fill(~causal_mask(9), float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 9, 32)
        torch.testing.assert_close(attn(x), attn.out_proj(out), atol=1e-5, rtol=1e-5)


def test_kv_cache_write_past_max_len_raises_and_keeps_everything() -> None:
    cache = KVCache(n_layers=2, batch=1, n_kv_heads=2, max_len=6, d_head=4)
    k = torch.randn(1, 2, 4, 4)
    for layer in range(2):
        cache.write(layer, k, k + 1)
    cache.advance(4)
    with pytest.raises(ValueError, match="max_len=6"):
        cache.write(0, torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    assert len(cache) == 4
    assert torch.equal(cache.keys(0), k) and torch.equal(cache.values(1), k + 1)


def test_kv_cache_write_returns_held_and_new_without_advancing() -> None:
    cache = KVCache(n_layers=1, batch=2, n_kv_heads=1, max_len=10, d_head=3)
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


# --- names, configs and old checkpoints -------------------------------------------------------------------


def test_gpt_config_replace_keeps_defaults_unresolved() -> None:
    """The None defaults are resolved by properties: replace(n_heads=8) stays multi-head, replace(d_model) rescales
    the feed-forward (a value resolved in __post_init__ would be copied and silently make it GQA)."""
    import dataclasses

    c = GPTConfig(vocab=10, d_model=64, n_heads=4)
    wider = dataclasses.replace(c, n_heads=8, d_model=128)
    assert (wider.n_kv_heads, wider.resolved_n_kv_heads, wider.resolved_d_ff) == (None, 8, 512)
    assert GPT(wider).layers[0].self_attn.kv_proj.weight.shape == (2 * 128, 128)


@pytest.mark.parametrize("old, new", [("kv_heads", "resolved_n_kv_heads"), ("hidden", "resolved_d_ff")])
def test_gpt_config_old_property_names_warn(old: str, new: str) -> None:
    c = GPTConfig(vocab=10, d_model=64, n_heads=8, n_kv_heads=2)
    with pytest.warns(DeprecationWarning, match=new):
        assert getattr(c, old) == getattr(c, new)


def test_gpt_layer_names_follow_pytorch() -> None:
    names = {name for name, _ in make_model().named_parameters()}
    assert {"layers.0.self_attn.q_proj.weight", "layers.1.feed_forward.linear1.weight",
            "layers.1.feed_forward.linear2.bias", "layers.0.norm1.weight", "layers.0.norm2.bias"} <= names
    assert not [n for n in names if ".attn." in n or ".mlp." in n or n.startswith("blocks.")]


def _old_names(state_dict: dict) -> dict:
    """A state dict as `python -m solutions.train gpt` saved it before the names were unified."""
    renamed = {}
    for key, value in state_dict.items():
        key = key.replace("layers.", "blocks.").replace(".self_attn.", ".attn.")
        renamed[key.replace(".feed_forward.linear1.", ".mlp.up.").replace(".feed_forward.linear2.", ".mlp.down.")] = value
    return renamed


def test_gpt_checkpoint_saved_under_the_old_names_still_loads(tmp_path) -> None:
    from dataclasses import asdict

    from solutions.checkpoint import load_checkpoint, renamed_keys, save_checkpoint
    from solutions.data.text import CharVocab
    from solutions.generate import load_gpt

    model = make_model(7, n_kv_heads=2)
    old = _old_names(model.state_dict())
    assert "blocks.1.mlp.down.weight" in old and "blocks.0.attn.kv_proj.bias" in old
    assert renamed_keys("gpt", old).keys() == model.state_dict().keys()
    assert renamed_keys("gpt", model.state_dict()).keys() == model.state_dict().keys()  # new keys stay

    class OldNames(torch.nn.Module):  # what save_checkpoint saw before the rename
        def state_dict(self):
            return old

    vocab = CharVocab("".join(chr(97 + i) for i in range(26)) + "0123456789.")
    save_checkpoint(tmp_path, kind="gpt", config=asdict(model.config), model=OldNames(), metrics={},
                    vocab={"tokenizer": vocab.to_dict()})
    assert set(load_checkpoint(tmp_path, kind="gpt").state_dict) == set(model.state_dict())
    loaded, _ = load_gpt(tmp_path)
    idx = torch.randint(0, 37, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx), model(idx))


# --- caches ----------------------------------------------------------------------------------------------


def _chunked(model: GPT, idx: torch.Tensor, chunks, cache) -> torch.Tensor:
    parts, start = [], 0
    with torch.no_grad():
        for size in chunks:
            parts.append(model(idx[:, start : start + size], cache))
            start += size
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("kind", CONFIGS)
@pytest.mark.parametrize("block_size", [1, 4, 7, 64])
def test_paged_cache_gives_the_contiguous_cache_logits(kind: str, block_size: int) -> None:
    model = make_model(**CONFIGS[kind])
    idx = torch.randint(0, 37, (3, 21), generator=torch.Generator().manual_seed(1))
    chunks = (6, 1, 1, 9, 4)
    contiguous = _chunked(model, idx, chunks, model.new_cache(3))
    paged = model.new_cache(3, block_size=block_size)
    assert torch.equal(_chunked(model, idx, chunks, paged), contiguous)  # token for token, bit for bit
    blocks = -(-21 // block_size)
    assert [len(t) for t in paged.block_tables] == [blocks] * 3
    held = [b for t in paged.block_tables for b in t]
    assert len(set(held)) == len(held) and not set(held) & set(paged.free_blocks)
    assert sorted(held + paged.free_blocks) == list(range(paged.n_blocks))
    assert paged.allocated_bytes() == 3 * blocks * block_size * kv_cache_bytes(2, model.config.resolved_n_kv_heads,
                                                                             model.config.d_head, 1)


def test_paged_cache_writes_the_pool_in_place_and_maps_through_the_table() -> None:
    cache = PagedKVCache(2, 2, 1, 3, n_blocks=6, block_size=2)
    cache.free_blocks = [0, 5, 1, 4, 2, 3]  # an order that differs from the logical one
    pools = [t.data_ptr() for t in cache.k_pool + cache.v_pool]
    g = torch.Generator().manual_seed(0)
    written = []
    for n in (3, 1):
        k = torch.randn(2, 1, n, 3, generator=g)
        for layer in range(2):
            keys, values = cache.write(layer, k + layer, -k)
        cache.advance(n)
        written.append(k)
    expected = torch.cat(written, dim=2)
    assert torch.equal(keys, expected + 1) and torch.equal(values, -expected)
    assert [t.data_ptr() for t in cache.k_pool + cache.v_pool] == pools
    for row in range(2):  # position p of row b: block block_tables[b][p // 2], offset p % 2
        for p in range(4):
            block = cache.block_tables[row][p // 2]
            assert torch.equal(cache.k_pool[0][block, :, p % 2], expected[row, :, p])


def test_paged_cache_out_of_blocks_raises_and_changes_nothing() -> None:
    cache = PagedKVCache(1, 2, 1, 2, n_blocks=3, block_size=2)
    k = torch.ones(2, 1, 2, 2)
    cache.write(0, k, k)
    cache.advance(2)
    tables, free = [list(t) for t in cache.block_tables], list(cache.free_blocks)
    with pytest.raises(ValueError, match="n_blocks=3"):
        cache.write(0, k, k)
    assert cache.block_tables == tables and cache.free_blocks == free and len(cache) == 2


def test_paged_cache_truncate_and_retain_give_blocks_back() -> None:
    cache = PagedKVCache(1, 3, 1, 2, n_blocks=12, block_size=4)
    k = torch.randn(3, 1, 9, 2, generator=torch.Generator().manual_seed(2))
    cache.write(0, k, k)
    cache.advance(9)
    assert [len(t) for t in cache.block_tables] == [3, 3, 3] and len(cache.free_blocks) == 3
    cache.truncate(5)  # positions 0-4: two blocks, the second one partly used and kept
    assert [len(t) for t in cache.block_tables] == [2, 2, 2] and len(cache.free_blocks) == 6
    third = list(cache.block_tables[2])
    cache.retain([2, 0])
    assert cache.block_tables[0] == third and cache.batch == 2 and len(cache.free_blocks) == 8
    keys, _ = cache.write(0, torch.zeros(2, 1, 1, 2), torch.zeros(2, 1, 1, 2))
    assert torch.equal(keys[:, :, :5], k[[2, 0], :, :5])
    with pytest.raises(ValueError, match="distinct"):
        cache.retain([0, 0])


def test_contiguous_cache_truncate_and_retain() -> None:
    model = make_model()
    idx = torch.randint(0, 37, (3, 12), generator=torch.Generator().manual_seed(3))
    cache = model.new_cache(3)
    with torch.no_grad():
        model(idx, cache)
        cache.truncate(7)
        cache.retain([2, 0])
        stepped = model(idx[[2, 0], 7:], cache)
        torch.testing.assert_close(stepped, model(idx[[2, 0]])[:, 7:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="length"):
        cache.truncate(13)


def test_sliding_window_mask_is_end_aligned() -> None:
    mask = sliding_window_mask(2, 5, 3)
    assert mask.tolist() == [[False, True, True, True, False], [False, False, True, True, True]]
    assert torch.equal(sliding_window_mask(6, 6, 99), causal_mask(6))


@pytest.mark.parametrize("chunks", [(30,), (1,) * 30, (7, 1, 1, 10, 5, 6), (2, 13, 15)])
def test_sliding_window_ring_buffer_equals_windowed_full_attention(chunks) -> None:
    model = make_model(window=6, n_kv_heads=2)
    idx = torch.randint(0, 37, (2, 30), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(idx)
        one_layer = make_model(window=6, n_kv_heads=2, n_layers=1)
        by_hand = torch.stack([  # one layer sees exactly its last 6 tokens: recompute each from them alone
            one_layer(idx[:, max(0, t - 5) : t + 1], positions=torch.arange(max(0, t - 5), t + 1).expand(2, -1))[:, -1]
            for t in range(30)], dim=1)
        torch.testing.assert_close(one_layer(idx), by_hand, atol=1e-5, rtol=1e-5)
    ring = SlidingWindowKVCache(2, 2, 2, 6, 8)
    torch.testing.assert_close(_chunked(model, idx, chunks, ring), full, atol=1e-5, rtol=1e-5)
    assert ring.allocated_bytes() == kv_cache_bytes(2, 2, 8, 6, batch=2)  # the window, however long the text


# --- positions and padding -----------------------------------------------------------------------------------


def test_gpt_left_padding_and_positions_leave_real_tokens_alone() -> None:
    model = make_model(5, n_kv_heads=2)
    real = torch.randint(0, 37, (1, 7), generator=torch.Generator().manual_seed(5))
    padded = torch.cat((torch.full((1, 4), 3), real), dim=1)
    padding = torch.tensor([[False] * 4 + [True] * 7])
    positions = (padding.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        alone = model(real)
        logits = model(padded, positions=positions, padding=padding)
        assert torch.isfinite(logits).all()
        torch.testing.assert_close(logits[:, 4:], alone, atol=1e-5, rtol=1e-5)
        counted_from_padding = model(padded, padding=padding)  # positions 0… from the first pad
        assert not torch.allclose(counted_from_padding[:, 4:], alone, atol=1e-3)


@pytest.mark.parametrize("kwargs, match", [
    ({"positions": torch.arange(48, 51)[None]}, "positions"),
    ({"positions": torch.arange(3)}, "positions"),
    ({"padding": torch.ones(1, 4, dtype=torch.bool)}, "padding"),
    ({"padding": torch.ones(1, 3)}, "padding"),
])
def test_gpt_rejects_bad_positions_and_padding(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_model()(torch.zeros(1, 3, dtype=torch.long), **kwargs)


# --- the next token's distribution ---------------------------------------------------------------------------


def test_next_token_probs_is_what_sample_next_token_draws_from() -> None:
    from solutions.gpt import next_token_probs

    logits = torch.randn(3, 9, generator=torch.Generator().manual_seed(6))
    probs = next_token_probs(logits, 0.7, 5, 0.8)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))
    assert ((probs > 0).sum(-1) <= 5).all()
    draws = sample_next_token(logits, 0.7, 5, 0.8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(draws, torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(1)))
    greedy = next_token_probs(logits, 0)
    assert torch.equal(greedy.argmax(-1), logits.argmax(-1)) and torch.equal(greedy.sum(-1), torch.ones(3))


# --- the roofline -----------------------------------------------------------------------------------------------

LLAMA2_7B = dict(n_params=6_738_415_616, n_layers=32, n_kv_heads=32, d_head=128)
H100 = dict(bandwidth=3.35e12, peak_flops=989e12)


def test_decode_tokens_per_second_llama2_7b_on_h100() -> None:
    from solutions.gpt import decode_tokens_per_second

    one = decode_tokens_per_second(**LLAMA2_7B, context=0, batch=1, **H100)
    assert one == pytest.approx(3.35e12 / (2 * 6_738_415_616))  # 13.5 GB of weights per token: ~249 tokens/s
    assert 240 < one < 255
    # with a 1,024-token cache per sequence (512 KiB a token) the bytes grow with the batch
    b64 = decode_tokens_per_second(**LLAMA2_7B, context=1024, batch=64, **H100)
    step = (2 * 6_738_415_616 + 64 * 1024 * 512 * 1024) / 3.35e12
    assert b64 == pytest.approx(64 / step)
    # without a cache, decode turns compute-bound at the ridge point: ~295 sequences
    ridge = 989e12 / 3.35e12
    memory_bound = decode_tokens_per_second(**LLAMA2_7B, context=0, batch=int(ridge) - 5, **H100)
    compute_bound = decode_tokens_per_second(**LLAMA2_7B, context=0, batch=int(ridge) + 5, **H100)
    assert memory_bound == pytest.approx((int(ridge) - 5) * 3.35e12 / (2 * 6_738_415_616))
    assert compute_bound == pytest.approx(989e12 / (2 * 6_738_415_616))
    assert decode_tokens_per_second(**LLAMA2_7B, context=0, batch=1024, **H100) == pytest.approx(compute_bound)


def test_decode_tokens_per_second_gqa_reads_less_cache_not_fewer_weights() -> None:
    from solutions.gpt import decode_tokens_per_second

    mha = decode_tokens_per_second(**LLAMA2_7B, context=4096, batch=16, **H100)
    gqa = decode_tokens_per_second(**dict(LLAMA2_7B, n_kv_heads=8), context=4096, batch=16, **H100)
    weights, cache = 2 * 6_738_415_616, 16 * kv_cache_bytes(32, 32, 128, 4096, dtype=torch.float16)
    assert gqa / mha == pytest.approx((weights + cache) / (weights + cache / 4))
    assert gqa / mha < 4


# --- a batch of prompts of different lengths ------------------------------------------------------------------


def _prompts(seed: int, lengths=(3, 9, 1, 6)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 37, (n,), generator=g) for n in lengths]


@pytest.mark.parametrize("kind", CONFIGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_generate_batch_greedy_equals_each_prompt_alone(kind: str, seed: int) -> None:
    from solutions.gpt import generate_batch

    model = make_model(seed, **CONFIGS[kind])
    prompts = _prompts(seed)
    outs = generate_batch(model, prompts, 25, temperature=0)
    assert [len(o) for o in outs] == [len(p) + 25 for p in prompts]
    for prompt, out in zip(prompts, outs):
        assert torch.equal(out, generate(model, prompt[None], 25, temperature=0)[0])


def test_generate_batch_each_row_stops_at_its_own_eos_and_leaves_the_batch() -> None:
    from solutions.gpt import generate_batch

    model = make_model(2, n_kv_heads=2)
    prompts = _prompts(2)
    alone = [generate(model, p[None], 30, temperature=0)[0, len(p) :].tolist() for p in prompts]
    eos = alone[0][4]  # the fifth token of the first row
    fed = []
    model.register_forward_pre_hook(lambda module, args: fed.append(args[0].shape[0]))
    outs = generate_batch(model, prompts, 30, eos_id=eos, temperature=0)
    for prompt, out, tokens in zip(prompts, outs, alone):
        stop = tokens.index(eos) + 1 if eos in tokens else 30
        assert out[len(prompt) :].tolist() == tokens[:stop]
    finished = [min(t.index(eos) + 1 if eos in t else 31, 31) for t in alone]
    assert fed[0] == 4 and fed[-1] == sum(f > len(fed) - 1 for f in finished) and fed == sorted(fed, reverse=True)


def test_generate_batch_with_a_paged_cache_frees_finished_rows() -> None:
    from solutions.gpt import generate_batch

    model = make_model(3)
    prompts = _prompts(3)
    contiguous = generate_batch(model, prompts, 20, temperature=0, eos_id=5)
    caches = []

    def paged(batch=1):
        caches.append(GPT.new_cache(model, batch, block_size=4))
        return caches[-1]

    model.new_cache = paged
    outs = generate_batch(model, prompts, 20, temperature=0, eos_id=5)
    assert all(torch.equal(a, b) for a, b in zip(outs, contiguous))
    cache = caches[0]
    held = sum(len(t) for t in cache.block_tables)
    assert held + len(cache.free_blocks) == cache.n_blocks and cache.batch <= len(prompts)


class _Raises(torch.nn.Module):
    """Wraps a model and raises on its ``after``-th call."""

    def __init__(self, model: GPT, after: int) -> None:
        super().__init__()
        self.model, self.after, self.calls, self.config = model, after, 0, model.config

    def new_cache(self, batch: int = 1):
        return self.model.new_cache(batch)

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.after:
            raise RuntimeError("out of memory, say")
        return self.model(*args, **kwargs)


@pytest.mark.parametrize("training", [True, False])
def test_generate_batch_and_speculative_restore_the_mode_when_a_step_raises(training: bool) -> None:
    from solutions.gpt import generate_batch, speculative_generate

    for run in (lambda m: generate_batch(m, _prompts(0), 10),
                lambda m: speculative_generate(m, m, _prompts(0)[1][None], 10)):
        model = _Raises(make_model(), after=3).train(training)
        with pytest.raises(RuntimeError, match="out of memory"):
            run(model)
        assert model.training == training and model.model.training == training


@pytest.mark.parametrize("prompts, new, match", [
    ([torch.zeros(40, dtype=torch.long), torch.zeros(2, dtype=torch.long)], 9, "max_len=48"),
    ([], 3, "prompts"),
    ([torch.zeros(2, 3, dtype=torch.long)], 3, "prompts"),
    ([torch.zeros(0, dtype=torch.long)], 3, "prompts"),
    ([torch.zeros(2)], 3, "prompts"),
    ([torch.zeros(2, dtype=torch.long)], -1, "max_new_tokens"),
])
def test_generate_batch_refuses_bad_input_before_running_the_model(prompts, new, match) -> None:
    from solutions.gpt import generate_batch

    model = make_model()
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(ValueError, match=match):
        generate_batch(model, prompts, new)
    assert calls == []


def test_generate_batch_zero_tokens_and_reproducible_sampling() -> None:
    from solutions.gpt import generate_batch

    model, prompts = make_model(), _prompts(4)
    assert all(torch.equal(a, b) for a, b in zip(generate_batch(model, prompts, 0), prompts))
    runs = [generate_batch(model, prompts, 12, top_k=5, generator=torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))
    assert not all(torch.equal(a, b) for a, b in zip(runs[0], runs[2]))


# --- speculative decoding -------------------------------------------------------------------------------------


@pytest.mark.parametrize("lookahead", [1, 2, 4, 7])
@pytest.mark.parametrize("draft_layers", [1, 2])
def test_speculative_greedy_equals_the_targets_greedy(lookahead: int, draft_layers: int) -> None:
    from solutions.gpt import speculative_generate

    target, draft = make_model(0, n_kv_heads=2), make_model(9, n_layers=draft_layers, d_model=16, n_heads=2)
    prompt = torch.randint(0, 37, (1, 5), generator=torch.Generator().manual_seed(lookahead))
    tokens, stats = speculative_generate(target, draft, prompt, 30, lookahead=lookahead, temperature=0)
    assert torch.equal(tokens, generate(target, prompt, 30, temperature=0))
    assert stats["accepted"] <= stats["proposed"] and stats["target_calls"] == 30 - stats["accepted"]


def test_speculative_with_the_target_as_draft_accepts_everything() -> None:
    from solutions.gpt import speculative_generate

    model = make_model(1)
    prompt = torch.randint(0, 37, (1, 4), generator=torch.Generator().manual_seed(0))
    tokens, stats = speculative_generate(model, model, prompt, 23, lookahead=4, temperature=0)
    assert torch.equal(tokens, generate(model, prompt, 23, temperature=0))
    assert stats["accepted"] == stats["proposed"] == 23 - stats["target_calls"]
    assert stats["target_calls"] == -(-23 // 5)  # k + 1 = 5 tokens per target pass


class _PositionLM(torch.nn.Module):
    """A tiny causal LM with the chapter's interface: logits from the previous token and the position, so a cache
    that is not rolled back (wrong positions) changes the distribution. Logs each call's (start, tokens fed)."""

    def __init__(self, seed: int, vocab: int = 3, max_len: int = 12) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.table, self.pos = torch.randn(vocab, vocab, generator=g) * 1.2, torch.randn(max_len, vocab, generator=g)
        self.config = GPTConfig(vocab=vocab, max_len=max_len, d_model=2, n_heads=1, n_layers=1)
        self.calls: list[tuple[int, int]] = []

    def new_cache(self, batch: int = 1) -> KVCache:
        return KVCache(1, batch, 1, self.config.max_len, 1)

    def forward(self, idx, cache=None):
        start = 0 if cache is None else len(cache)
        self.calls.append((start, idx.shape[1]))
        if cache is not None:  # the cache holds the tokens themselves, so it knows the previous one
            prev, _ = cache.write(0, idx[:, None, :, None].float(), idx[:, None, :, None].float())
            cache.advance(idx.shape[1])
            prev = prev[:, 0, :, 0].long()
        else:
            prev = idx
        return self.table[prev[:, -idx.shape[1] :]] + self.pos[start : start + idx.shape[1]]


def _exact_distribution(model: _PositionLM, prompt: torch.Tensor, n: int, **sampling) -> dict[tuple, float]:
    from solutions.gpt import next_token_probs

    found = {}
    for seq in itertools.product(range(model.config.vocab), repeat=n):
        prob, idx = 1.0, prompt
        for token in seq:
            prob *= next_token_probs(model(idx)[:, -1], **sampling)[0, token].item()
            idx = torch.cat((idx, torch.tensor([[token]])), dim=1)
        found[seq] = prob
    return found


@pytest.mark.parametrize("sampling", [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 2}])
def test_speculative_sampling_has_the_targets_distribution(sampling: dict) -> None:
    """2,000 runs with fixed generators: the frequency of each of the 27 possible 3-token outputs is within 5 sigma
    of the target's own probability, although the draft's distribution is far from it."""
    from solutions.gpt import speculative_generate

    target, draft = _PositionLM(0), _PositionLM(1)
    prompt = torch.tensor([[1]])
    exact, drafts = _exact_distribution(target, prompt, 3, **sampling), _exact_distribution(draft, prompt, 3, **sampling)
    assert max(abs(exact[s] - drafts[s]) for s in exact) > 0.1  # the draft alone would fail the test
    runs, counts = 2000, collections.Counter()
    generator = torch.Generator().manual_seed(0)
    for _ in range(runs):
        tokens, _ = speculative_generate(target, draft, prompt, 3, lookahead=2, generator=generator, **sampling)
        counts[tuple(tokens[0, 1:].tolist())] += 1
    for seq, p in exact.items():
        sigma = (p * (1 - p) / runs) ** 0.5
        assert abs(counts[seq] / runs - p) <= 5 * sigma + 1 / runs, (seq, counts[seq] / runs, p)


def test_speculative_rolls_both_caches_back_past_rejected_tokens() -> None:
    from solutions.gpt import speculative_generate

    target, draft = _PositionLM(0, max_len=40), _PositionLM(1, max_len=40)
    tokens, stats = speculative_generate(target, draft, torch.tensor([[1, 2]]), 30, lookahead=3,
                                         generator=torch.Generator().manual_seed(0))
    assert stats["accepted"] < stats["proposed"]  # some drafts were rejected
    fed = 0
    for start, n in target.calls:  # each pass starts where the accepted tokens end: nothing rejected stays
        assert start <= fed + 1
        fed = start + n
    starts = [start for start, _ in target.calls]
    assert starts[0] == 0 and all(b > a for a, b in zip(starts, starts[1:]))
    assert len(target.calls) == stats["target_calls"] and tokens.shape == (1, 32)


@pytest.mark.parametrize("kwargs, match", [
    ({"idx": torch.zeros(2, 3, dtype=torch.long)}, "idx"),
    ({"max_new_tokens": 46}, "max_len=48"),
    ({"lookahead": 0}, "lookahead"),
    ({"draft_vocab": 36}, "vocab"),
])
def test_speculative_refuses_bad_input_before_running_the_models(kwargs: dict, match: str) -> None:
    from solutions.gpt import speculative_generate

    target, draft = make_model(), make_model(1, vocab=kwargs.pop("draft_vocab", 37))
    calls = []
    for m in (target, draft):
        m.register_forward_pre_hook(lambda *_: calls.append(1))
    args = {"idx": torch.zeros(1, 3, dtype=torch.long), "max_new_tokens": 10} | kwargs
    with pytest.raises(ValueError, match=match):
        speculative_generate(target, draft, args.pop("idx"), args.pop("max_new_tokens"), **args)
    assert calls == []
