"""The chapter 6 checks: their reference models are right, and a known mistake gets its hint."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from autograder.checks import core, kv_cache
from autograder.checks.probes import _ReferenceCache, _ToyLM
from solutions.gpt import GPT, GPTConfig, CausalSelfAttention, KVCache


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one thread avoids OpenMP overhead on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def toy(seed: int = 0, vocab: int = 9, max_len: int = 30) -> _ToyLM:
    g = torch.Generator().manual_seed(seed)
    return _ToyLM(torch.randn(vocab, 6, generator=g), torch.randn(max_len, 6, generator=g),
                  torch.randn(6, vocab, generator=g))


@pytest.mark.parametrize("chunks", [(12,), (1,) * 12, (5, 1, 1, 3, 2)])
def test_toy_model_cache_equals_recompute(chunks: tuple[int, ...]) -> None:
    model = toy()
    idx = torch.randint(0, 9, (2, 12), generator=torch.Generator().manual_seed(1))
    cache, parts, start = model.new_cache(2), [], 0
    for size in chunks:
        parts.append(model(idx[:, start : start + size], cache))
        start += size
    torch.testing.assert_close(torch.cat(parts, dim=1), model(idx), rtol=1e-12, atol=1e-12)
    assert len(cache) == 12
    starts = [sum(chunks[:i]) for i in range(len(chunks))]
    assert [call[:2] for call in model.calls[:-1]] == [[s, n] for s, n in zip(starts, chunks)]  # the last: one pass


def test_toy_model_depends_on_the_whole_prefix_and_refuses_past_max_len() -> None:
    model = toy()
    idx = torch.randint(0, 9, (1, 10), generator=torch.Generator().manual_seed(2))
    changed = idx.clone()
    changed[0, 0] = (changed[0, 0] + 1) % 9
    with torch.no_grad():
        assert not torch.allclose(model(idx)[0, -1], model(changed)[0, -1])
    with pytest.raises(ValueError, match="max_len=30"):
        model(torch.zeros(1, 31, dtype=torch.long))


def test_reference_cache_behaves_like_the_library_cache() -> None:
    ours, library = _ReferenceCache(2, 1, 2, 8, 3), KVCache(2, 1, 2, 8, 3)
    g = torch.Generator().manual_seed(3)
    for n in (3, 1, 2):
        for layer in range(2):
            k, v = torch.randn(1, 2, n, 3, generator=g), torch.randn(1, 2, n, 3, generator=g)
            for a, b in zip(ours.write(layer, k, v), library.write(layer, k, v)):
                assert torch.equal(a, b)
        ours.advance(n)
        library.advance(n)
    assert len(ours) == len(library) == 6
    assert ours.writes[-2:] == [[0, 4, 2], [1, 4, 2]]
    with pytest.raises(ValueError, match="max_len=8"):
        ours.write(0, torch.zeros(1, 2, 3, 3), torch.zeros(1, 2, 3, 3))


class SdpaIsCausal(CausalSelfAttention):
    """What many first write: PyTorch's is_causal=True, whose mask is aligned to the top-left when seq_q < seq_k."""

    def forward(self, x, cache=None, layer=0):
        q = rearrange(self.q_proj(x), "batch seq (heads d_head) -> batch heads seq d_head", heads=self.n_heads)
        k, v = rearrange(self.kv_proj(x), "batch seq (two kv_heads d_head) -> two batch kv_heads seq d_head",
                         two=2, kv_heads=self.kv_heads)
        if cache is not None:
            k, v = cache.write(layer, k, v)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(rearrange(out, "batch heads seq d_head -> batch seq (heads d_head)"))


def test_check_names_the_top_left_causal_mask() -> None:
    check = kv_cache.CHECKS["CausalSelfAttention"]
    verdict = core.judge_check(check, core.local_probe(SdpaIsCausal), lambda case: [0])
    assert not verdict.passed
    assert "top-left" in verdict.reason and "causal_mask(seq_q, seq_k)" in verdict.reason


def test_check_sampling_tolerates_the_reference_on_many_seeds() -> None:
    """The distribution checks are statistical: the reference must pass them whatever the seed."""
    from solutions.gpt import sample_next_token

    check = kv_cache.CHECKS["sample_next_token"]
    verdict = core.judge_check(check, core.local_probe(sample_next_token), lambda case: range(100, 120), level="hidden")
    assert verdict.passed, verdict.reason


def test_check_sampling_names_temperature_zero_divided_by() -> None:
    """Dividing by a temperature of 0 raises inside torch.multinomial; the hint says what temperature 0 means."""
    from solutions.gpt import sample_next_token

    def divides_first(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
        probs = torch.softmax(logits / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=generator)

    check = kv_cache.CHECKS["sample_next_token"]
    verdict = core.judge_check(check, core.local_probe(divides_first), lambda case: [0])
    assert not verdict.passed
    assert "temperature 0 means greedy" in verdict.reason and "raised" in verdict.reason
    assert core.judge_check(check, core.local_probe(sample_next_token), lambda case: [0]).passed


def test_check_generate_accepts_a_loop_written_differently() -> None:
    """A correct generate that feeds then samples (no break) with an explicit no_grad passes too."""
    from solutions.gpt import sample_next_token

    def generate(model, idx, max_new_tokens, *, use_cache=True, temperature=1.0, top_k=None, top_p=None,
                 generator=None):
        if idx.shape[1] + max_new_tokens > model.config.max_len:
            raise ValueError(f"too long for max_len={model.config.max_len}")
        mode = model.training
        model.eval()
        cache = model.new_cache(idx.shape[0]) if use_cache else None
        out, feed = idx, idx
        with torch.no_grad():
            for _ in range(max_new_tokens):
                logits = model(feed, cache)[:, -1] if use_cache else model(out)[:, -1]
                token = sample_next_token(logits, temperature, top_k, top_p, generator)
                out, feed = torch.cat((out, token), dim=1), token
        model.train(mode)
        return out

    check = kv_cache.CHECKS["generate"]
    verdict = core.judge_check(check, core.local_probe(generate), lambda case: [0, 1, 2], level="hidden")
    assert verdict.passed, verdict.reason


def test_gpt_check_builds_the_learners_config_class() -> None:
    """The probe builds the model with the GPTConfig its own code sees; a model that rejects other configs passes."""
    verdict = core.judge_check(kv_cache.CHECKS["GPT"], core.local_probe(GPT), lambda case: [0])
    assert verdict.passed, verdict.reason
    assert GPT.__init__.__globals__["GPTConfig"] is GPTConfig


class SdpaCausalIfSeveral(CausalSelfAttention):
    """Bug hunt 3's pattern: is_causal only for a chunk of several tokens (a single token needs no mask), but
    PyTorch aligns that mask to the top-left when the chunk follows a cached prefix."""

    def forward(self, x, cache=None, layer=0):
        q = rearrange(self.q_proj(x), "batch seq (heads d_head) -> batch heads seq d_head", heads=self.n_heads)
        k, v = rearrange(self.kv_proj(x), "batch seq (two kv_heads d_head) -> two batch kv_heads seq d_head",
                         two=2, kv_heads=self.kv_heads)
        if cache is not None:
            k, v = cache.write(layer, k, v)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[-2] > 1)
        return self.out_proj(rearrange(out, "batch heads seq d_head -> batch seq (heads d_head)"))


def _mutant(name: str):
    from mutants import load_all

    return next(m for m in load_all()["kv_cache_mutants"] if m.name == name).obj


@pytest.mark.parametrize("learner", ["SdpaCausalIfSeveral", "mask_not_offset_for_prefix"])
def test_check_names_the_mask_not_offset_by_the_prefix(learner: str) -> None:
    """Top-left for chunks and no mask for one token: the hint names the mask, not only the difference."""
    obj = SdpaCausalIfSeveral if learner == "SdpaCausalIfSeveral" else _mutant(learner)
    check = kv_cache.CHECKS["CausalSelfAttention"]
    for level, seeds in (("visible", [0]), ("hidden", [0, 1, 2])):
        verdict = core.judge_check(check, core.local_probe(obj), lambda case: seeds, level=level)
        assert not verdict.passed
        assert "the mask is aligned to the top-left, not offset by the cached prefix" in verdict.reason, verdict.reason
        assert "causal_mask(seq_q, seq_k)" in verdict.reason


TOP_P_HINTS = {
    "top_p_before_temperature": "top-p must be applied to the distribution after temperature",
    "top_p_drops_crossing_token": "drops the token that crosses p",
    "temperature_after_softmax": "has no effect: divide the LOGITS by it",
}


@pytest.mark.parametrize("name", ["top_p_before_temperature", "top_p_drops_crossing_token"])
def test_check_top_p_mistakes_each_get_their_own_hint(name: str) -> None:
    """On the top-p cases the two mistakes (and the temperature one) sample different distributions, so the hint
    names the mistake made and no other."""
    check = kv_cache.CHECKS["sample_next_token"]
    top_p_cases = [case for case in check.visible + check.hidden if "top-p" in case.name]
    assert len(top_p_cases) == 3
    for case in top_p_cases:
        for seed in (0, 1, 2, 3):
            one = dataclasses.replace(check, visible=(case,), hidden=())
            verdict = core.judge_check(one, core.local_probe(_mutant(name)), lambda case: [seed])
            assert not verdict.passed, (case.name, seed)
            assert TOP_P_HINTS[name] in verdict.reason, (case.name, seed, verdict.reason)
            others = [hint for other, hint in TOP_P_HINTS.items() if other != name]
            assert not any(hint in verdict.reason for hint in others), (case.name, seed, verdict.reason)


def test_check_bytes_names_query_heads_used_for_kv_heads() -> None:
    """n_heads where n_kv_heads belongs: 8x too large for LLaMA-2-70B, 4x for Mistral-7B, and the hint says why."""
    mutant = _mutant("bytes_query_heads_for_kv_heads")
    verdict = core.judge_check(kv_cache.CHECKS["kv_cache_bytes"], core.local_probe(mutant), lambda case: [0])
    assert not verdict.passed
    assert "8× too large" in verdict.reason and "n_kv_heads" in verdict.reason, verdict.reason
    mistral = {"args": (32, 8, 128, 4096), "kwargs": {"dtype": "bfloat16"}, "model": "Mistral-7B", "heads": 32}
    right = 2 * 32 * 8 * 128 * 4096 * 2
    with pytest.raises(core.CheckFailed, match="4× too large.*n_kv_heads"):
        kv_cache._judge_bytes(mistral, {"error": None, "out": 4 * right})
    kv_cache._judge_bytes(mistral, {"error": None, "out": right})  # the right size passes
