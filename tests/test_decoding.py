"""solutions.decoding: greedy against a one-row-at-a-time reference, beam search against exhaustive search,
and the decoder cache (use_cache=True, CachedDecoder) against recomputation (Decoder)."""

from __future__ import annotations

import itertools

import pytest
import torch

from autograder.checks.lookup import LookupModel
from solutions.decoding import CachedDecoder, Decoder, beam_search, beam_search_over, greedy_decode, greedy_search
from solutions.transformer import DecoderCache, Transformer, TransformerConfig

BOS, EOS = 1, 2


def random_model(seed: int, vocab: int = 12, eos_bias: float = 1.5) -> Transformer:
    """A random model whose EOS is likely enough that outputs have varied lengths."""
    torch.manual_seed(seed)
    config = TransformerConfig(vocab, vocab, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_len=32)
    model = Transformer(config)
    with torch.no_grad():
        model.generator.weight.mul_(4.0)  # sharper distributions, fewer near-ties
        model.generator.bias[EOS] += eos_bias
    return model.eval()


def random_sources(seed: int, rows: int, vocab: int = 12) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (rows, 7), generator=gen)
    lengths = torch.randint(1, 8, (rows,), generator=gen)
    src[torch.arange(7)[None, :] >= lengths[:, None]] = 0
    return src


def one_row_greedy(model, src_row, max_len):
    src_row = src_row[src_row != 0][None]
    out = [BOS]
    for _ in range(max_len):
        token = int(model(src_row, torch.tensor([out]))[0, -1].argmax())
        if token == EOS:
            break
        out.append(token)
    return out[1:]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_decode_matches_one_row_reference(seed):
    model, src = random_model(seed), random_sources(seed, 6)
    got = greedy_decode(model, src, 10, BOS, EOS)
    assert got == [one_row_greedy(model, row, 10) for row in src]
    assert len({len(g) for g in got}) > 1
    assert all(EOS not in g for g in got)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_search_with_beam_one_equals_greedy(seed):
    model, src = random_model(seed), random_sources(100 + seed, 64)
    greedy = greedy_decode(model, src, 12, BOS, EOS)
    assert beam_search(model, src, 1, 12, BOS, EOS) == greedy
    assert len({len(g) for g in greedy}) > 1  # the property is tested on outputs of varied length


def exhaustive_best(model, src_row, vocab, max_len, alpha):
    """Every hypothesis: ends in EOS within max_len, or max_len tokens without EOS."""
    candidates = []
    words = [t for t in range(vocab) if t != EOS]
    for n in range(0, max_len):
        for prefix in itertools.product(words, repeat=n):
            candidates.append(list(prefix) + [EOS])
    candidates += [list(p) for p in itertools.product(words, repeat=max_len)]
    scored = []
    for length in range(1, max_len + 1):  # one batched forward pass per length
        group = [c for c in candidates if len(c) == length]
        tokens = torch.tensor(group)
        tgt_in = torch.cat([torch.full((len(group), 1), BOS), tokens[:, :-1]], dim=1)
        log_probs = model(src_row[None].expand(len(group), -1), tgt_in).log_softmax(-1)
        totals = log_probs.detach().gather(-1, tokens[..., None])[..., 0].sum(-1)
        scored += [(float(t) / ((5 + length) / 6) ** alpha, c) for t, c in zip(totals, group)]
    best = max(scored)[1]
    return best[:-1] if best[-1] == EOS else best


@pytest.mark.parametrize("seed, alpha", [(0, 0.0), (1, 0.0), (2, 0.0)])
def test_beam_search_with_full_beam_is_exhaustive(seed, alpha):
    """Without length normalisation a live score only falls: a beam as large as the search space is exact."""
    vocab, max_len = 5, 3
    model = random_model(seed, vocab=vocab, eos_bias=0.5)
    src = random_sources(seed, 3, vocab=vocab)
    got = beam_search(model, src, vocab**max_len, max_len, BOS, EOS, length_penalty=alpha)
    assert got == [exhaustive_best(model, row[row != 0], vocab, max_len, alpha) for row in src]


@pytest.mark.parametrize("use_cache", [True, False])
def test_decoding_encodes_once_and_restores_training_mode(use_cache):
    model, src = random_model(0), random_sources(0, 5)
    calls = []
    original = model.encode
    model.encode = lambda s: (calls.append(s.shape), original(s))[1]  # type: ignore[method-assign]
    model.train()
    greedy_decode(model, src, 6, BOS, EOS, use_cache=use_cache)
    beam_search(model, src, 3, 6, BOS, EOS, use_cache=use_cache)
    assert calls == [src.shape, src.shape]
    assert model.training


# --- the decoder cache: same tokens, less work ------------------------------------------------------


# Seeds whose random models stop rows at varied steps (asserted below, so a change of RNG cannot hide it).
@pytest.mark.parametrize("seed", [1, 4, 8, 9])
def test_greedy_decode_identical_with_and_without_cache(seed):
    model, src = random_model(seed, eos_bias=1.0), random_sources(200 + seed, 16)
    cached = greedy_decode(model, src, 12, BOS, EOS, use_cache=True)
    assert cached == greedy_decode(model, src, 12, BOS, EOS, use_cache=False)
    assert len({len(row) for row in cached}) > 2  # rows stop at different times
    assert (src == 0).any()  # and the batch has source padding


@pytest.mark.parametrize("seed, beam, alpha", [(1, 2, 0.6), (4, 4, 0.0), (8, 5, 1.0), (9, 3, 0.6)])
def test_beam_search_identical_with_and_without_cache(seed, beam, alpha):
    model, src = random_model(seed, eos_bias=1.0), random_sources(300 + seed, 12)
    cached = beam_search(model, src, beam, 12, BOS, EOS, length_penalty=alpha, use_cache=True)
    assert cached == beam_search(model, src, beam, 12, BOS, EOS, length_penalty=alpha, use_cache=False)
    assert len({len(row) for row in cached}) > 2


@pytest.mark.parametrize("decode", ["greedy", "beam"])
def test_decoding_with_the_cache_feeds_one_token_per_step_and_projects_the_source_once(decode, monkeypatch):
    model, src = random_model(0, eos_bias=-100.0), random_sources(0, 4)  # never stops early: 8 steps
    made, fed, full = [], [], []
    original_init, original_logits = DecoderCache.__init__, DecoderCache.logits
    monkeypatch.setattr(DecoderCache, "__init__", lambda self, *a: (made.append(1), original_init(self, *a))[1])
    monkeypatch.setattr(DecoderCache, "logits", lambda self, t: (fed.append(t.shape[1]), original_logits(self, t))[1])
    original_decode = model.decode
    model.decode = lambda tgt_in, *a, **k: (full.append(tgt_in.shape[1]), original_decode(tgt_in, *a, **k))[1]
    cross_calls = []
    for layer in model.decoder_layers:  # the cross-attention module itself never runs: its K/V are in the cache
        layer.cross_attn.register_forward_pre_hook(lambda *args: cross_calls.append(1))
    if decode == "greedy":
        greedy_decode(model, src, 8, BOS, EOS)
    else:
        beam_search(model, src, 3, 8, BOS, EOS)
    assert made == [1] and fed == [1] * 8 and full == [] and cross_calls == []
    fed.clear()
    greedy_decode(model, src, 8, BOS, EOS, use_cache=False)
    assert full == list(range(1, 9)) and fed == []  # recomputation feeds the whole prefix


@pytest.mark.parametrize("seed", [0, 1])
def test_cached_decoder_log_probs_equal_decoder_after_reorders(seed):
    model, src = random_model(seed), random_sources(seed, 3)
    plain, cached = Decoder(model, src), CachedDecoder(model, src, 8)
    tokens = torch.full((3, 1), BOS)
    for rows in (torch.tensor([0, 0, 2, 1]), torch.tensor([3, 1]), torch.tensor([1, 0, 1])):
        torch.testing.assert_close(cached.log_probs(tokens), plain.log_probs(tokens), atol=1e-5, rtol=1e-4)
        tokens = torch.cat([tokens, plain.log_probs(tokens).argmax(-1, keepdim=True)], dim=1)[rows]
        plain.reorder(rows)
        cached.reorder(rows)
        assert plain.batch == cached.batch == len(rows)


def test_greedy_search_and_beam_search_over_take_any_decoder():
    """The searches only use the decoder protocol: here a table model's decoder, without any cache."""
    gen = torch.Generator().manual_seed(0)
    first = torch.randn(2, 6, 7, 7, generator=gen) * 2
    first[..., :2] = -1e4  # never padding or BOS
    model = LookupModel(first, torch.zeros(2, 6, 8, 7), torch.zeros(2, 6, 7), pad_id=0)
    src = torch.tensor([[0, 4], [1, 5], [1, 3]])
    greedy = greedy_search(Decoder(model, src), 5, BOS, EOS)
    assert greedy == beam_search_over(Decoder(model, src), 1, 5, BOS, EOS)
    assert greedy == greedy_decode(model, src, 5, BOS, EOS, use_cache=False)
    assert beam_search_over(Decoder(model, src), 3, 5, BOS, EOS) == beam_search(model, src, 3, 5, BOS, EOS,
                                                                               use_cache=False)


def test_beam_search_sets_finished_hypotheses_aside():
    """Two beams; EOS comes second at the first step. Kept in the beam it would take b's place and "a c" (p 0.21)
    would win; set aside, b stays live and "b d" (p 0.27, the most probable and the best normalised) wins."""
    vocab, a, b, c, d = 7, 3, 4, 5, 6
    first = torch.full((1, 5, vocab, vocab), -12.0)
    first[..., :2] = float("-inf")
    for step, previous, probabilities in ((0, slice(None), {a: 0.42, EOS: 0.3, b: 0.28}),
                                          (1, a, {c: 0.55, EOS: 0.45}), (1, b, {d: 0.99}),
                                          (2, slice(None), {EOS: 0.99})):
        for token, p in probabilities.items():
            first[0, step, previous, token] = torch.tensor(p).log()
    model = LookupModel(first, torch.zeros(1, 5, vocab + 1, vocab), torch.zeros(1, 5, vocab), pad_id=0)
    src = torch.zeros(1, 2, dtype=torch.long)
    assert beam_search(model, src, 2, 4, BOS, EOS, length_penalty=1.0, use_cache=False) == [[b, d]]
    assert greedy_decode(model, src, 4, BOS, EOS, use_cache=False) == [[a, c]]


def test_decoding_stops_at_max_len():
    model = random_model(0, eos_bias=-100.0)  # never ends by itself
    src = random_sources(0, 4)
    assert all(len(out) == 5 for out in greedy_decode(model, src, 5, BOS, EOS))
    assert all(len(out) == 5 for out in beam_search(model, src, 3, 5, BOS, EOS))


@pytest.mark.parametrize("fn", ["greedy", "beam"])
@pytest.mark.parametrize("kwargs, name", [
    (dict(max_len=0), "max_len"),
    (dict(max_len=40), "max_len"),
    (dict(bos_id=-1), "bos_id"),
    (dict(eos_id=12), "eos_id"),
    (dict(src=torch.randn(2, 3)), "src"),
    (dict(src=torch.ones(3, dtype=torch.long)), "src"),
    (dict(model=torch.nn.Linear(2, 2)), "model"),
    (dict(use_cache=1), "use_cache"),
    (dict(model=LookupModel(torch.zeros(1, 9, 12, 12), torch.zeros(1, 9, 13, 12), torch.zeros(1, 9, 12), 0)),
     "use_cache"),  # a model that is not a Transformer cannot be cached
])
def test_decoding_rejects_bad_arguments(fn, kwargs, name):
    args = dict(model=random_model(0), src=random_sources(0, 2), max_len=5, bos_id=BOS, eos_id=EOS)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        if fn == "greedy":
            greedy_decode(**args)
        else:
            beam_search(beam_size=2, **args)


@pytest.mark.parametrize("kwargs, name", [
    (dict(beam_size=0), "beam_size"),
    (dict(beam_size=2.0), "beam_size"),
    (dict(beam_size=2, length_penalty=-1.0), "length_penalty"),
])
def test_beam_search_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        beam_search(random_model(0), random_sources(0, 2), max_len=5, bos_id=BOS, eos_id=EOS, **kwargs)
