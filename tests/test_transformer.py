"""solutions.transformer against nn.Transformer*Layer with copied weights, and the masking properties."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from solutions.multihead import MultiHeadAttention
from solutions.transformer import (
    DecoderCache, DecoderLayer, EncoderLayer, FeedForward, Transformer, TransformerConfig, teacher_forcing,
)


def small_config(**kw) -> TransformerConfig:
    base = dict(src_vocab=23, tgt_vocab=19, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_len=64)
    return TransformerConfig(**{**base, **kw})


def copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        ours.in_proj.weight.copy_(theirs.in_proj_weight)
        ours.in_proj.bias.copy_(theirs.in_proj_bias)
        ours.out_proj.weight.copy_(theirs.out_proj.weight)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


def copy_common(ours, theirs) -> None:
    copy_attention(ours.self_attn, theirs.self_attn)
    with torch.no_grad():
        for name in ("linear1", "linear2"):
            getattr(ours.feed_forward, name).load_state_dict(getattr(theirs, name).state_dict())
        for name in ("norm1", "norm2", "norm3"):
            if hasattr(ours, name):
                getattr(ours, name).load_state_dict(getattr(theirs, name).state_dict())


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("seed", [0, 1])
def test_encoder_layer_matches_torch(norm_first, activation, seed):
    torch.manual_seed(seed)
    theirs = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation=activation,
                                        batch_first=True, norm_first=norm_first).eval()
    # Perturb the LayerNorms so their weights matter.
    with torch.no_grad():
        for norm in (theirs.norm1, theirs.norm2):
            norm.weight.normal_(1.0, 0.1)
            norm.bias.normal_(0.0, 0.1)
    ours = EncoderLayer(32, 4, 64, 0.0, norm_first=norm_first, activation=activation).eval()
    copy_common(ours, theirs)
    x = torch.randn(3, 7, 32)
    src = torch.randint(1, 9, (3, 7))
    src[1, 4:] = 0
    src[2, 6:] = 0
    keep = src != 0
    expected = theirs(x, src_key_padding_mask=~keep)
    got = ours(x, keep[:, None, None, :])
    # torch's fast path leaves padded query rows as 0; compare the real positions.
    torch.testing.assert_close(got[keep], expected[keep], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("seq_q, seq_k", [(5, 7), (9, 4), (1, 1)])
def test_decoder_layer_matches_torch(norm_first, seq_q, seq_k):
    torch.manual_seed(seq_q * 10 + seq_k)
    theirs = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    with torch.no_grad():
        for norm in (theirs.norm1, theirs.norm2, theirs.norm3):
            norm.weight.normal_(1.0, 0.1)
            norm.bias.normal_(0.0, 0.1)
    ours = DecoderLayer(32, 4, 64, 0.0, norm_first=norm_first).eval()
    copy_common(ours, theirs)
    copy_attention(ours.cross_attn, theirs.multihead_attn)
    x, memory = torch.randn(2, seq_q, 32), torch.randn(2, seq_k, 32)
    keep = torch.ones(2, seq_k, dtype=torch.bool)
    keep[1, max(1, seq_k - 2):] = False
    expected = theirs(x, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(seq_q),
                      tgt_is_causal=True, memory_key_padding_mask=~keep)
    got = ours(x, memory, keep[:, None, None, :])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_is_position_wise(activation):
    torch.manual_seed(0)
    ff = FeedForward(16, 48, activation=activation)
    x = torch.randn(2, 5, 16)
    act = torch.relu if activation == "relu" else nn.functional.gelu
    expected = ff.linear2(act(ff.linear1(x)))
    torch.testing.assert_close(ff(x), expected)
    # Position-wise: permuting positions permutes outputs.
    perm = torch.randperm(5)
    torch.testing.assert_close(ff(x[:, perm]), ff(x)[:, perm])


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_transformer_forward_shape_and_decode_equals_forward(norm_first, seed):
    torch.manual_seed(seed)
    model = Transformer(small_config(norm_first=norm_first)).eval()
    src, tgt_in = torch.randint(1, 23, (3, 6)), torch.randint(1, 19, (3, 4))
    logits = model(src, tgt_in)
    assert logits.shape == (3, 4, 19)
    torch.testing.assert_close(model.decode(tgt_in, model.encode(src), src), logits)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_transformer_source_padding_does_not_change_logits(norm_first, seed):
    torch.manual_seed(seed)
    model = Transformer(small_config(norm_first=norm_first)).eval()
    src = torch.randint(1, 23, (4, 5))
    src[1, 3:] = 0
    tgt_in = torch.randint(1, 19, (4, 6))
    padded = torch.cat([src, torch.zeros(4, 7, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded, tgt_in), model(src, tgt_in), atol=1e-5, rtol=1e-5)
    # Row 1 alone, without its padding, gives the same logits as in the batch.
    torch.testing.assert_close(model(src[1:2, :3], tgt_in[1:2]), model(src, tgt_in)[1:2], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_target_token_does_not_change_earlier_logits(norm_first):
    torch.manual_seed(3)
    model = Transformer(small_config(norm_first=norm_first)).eval()
    src, tgt_in = torch.randint(1, 23, (2, 5)), torch.randint(1, 19, (2, 8))
    base = model(src, tgt_in)
    for t in range(8):
        changed = tgt_in.clone()
        changed[:, t] = (changed[:, t] % 18) + 1
        out = model(src, changed)
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out[:, t], base[:, t])  # and it does change its own position


def test_transformer_attention_maps_shapes_rows_and_masks():
    torch.manual_seed(0)
    model = Transformer(small_config(n_layers=3)).eval()
    src = torch.randint(1, 23, (2, 6))
    src[0, 4:] = 0
    tgt_in = torch.randint(1, 19, (2, 5))
    maps = model.attention_maps(src, tgt_in)
    assert {k: tuple(v.shape) for k, v in maps.items()} == {
        "encoder": (3, 2, 4, 6, 6), "decoder": (3, 2, 4, 5, 5), "cross": (3, 2, 4, 5, 6)}
    for found in maps.values():
        torch.testing.assert_close(found.sum(-1), torch.ones(found.shape[:-1]))
    assert maps["cross"][:, 0, :, :, 4:].abs().max() == 0  # source padding gets no attention
    assert maps["encoder"][:, 0, :, :, 4:].abs().max() == 0
    assert maps["decoder"].triu(diagonal=1).abs().max() == 0  # no target position looks ahead


def test_transformer_attention_maps_match_forward_pass():
    """The maps are those of the attention inputs seen by an ordinary forward pass."""
    torch.manual_seed(1)
    model = Transformer(small_config(n_layers=2, norm_first=True)).eval()
    src, tgt_in = torch.randint(1, 23, (2, 6)), torch.randint(1, 19, (2, 5))
    maps = model.attention_maps(src, tgt_in)
    captured = []
    hooks = [layer.cross_attn.register_forward_hook(
        lambda mod, inputs, out: captured.append(inputs)) for layer in model.decoder_layers]
    model(src, tgt_in)
    for h in hooks:
        h.remove()
    assert len(captured) == len(model.decoder_layers)
    for i, ((query, memory, mask), layer) in enumerate(zip(captured, model.decoder_layers)):
        torch.testing.assert_close(maps["cross"][i], layer.cross_attn.attention_weights(query, memory, mask))
    first = model.encoder_layers[0]
    x = model.positional(model.src_embed(src) * 32**0.5)
    torch.testing.assert_close(maps["encoder"][0], first.self_attn.attention_weights(first.norm1(x), None,
                                                                                     model.source_mask(src)))


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_training_mode_drops_sublayer_outputs_like_torch(norm_first):
    """In training mode, with the same dropout masks, DecoderLayer equals nn.TransformerDecoderLayer: dropout1..3 on
    each sub-layer's output before the residual add, and the feed-forward's own dropout inside it."""
    torch.manual_seed(3)
    theirs = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.5, batch_first=True, norm_first=norm_first)
    ours = DecoderLayer(16, 4, 32, dropout=0.5, norm_first=norm_first)
    copy_common(ours, theirs)
    copy_attention(ours.cross_attn, theirs.multihead_attn)
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    masks = {name: (torch.rand(2, 5, 32 if name == "dropout" else 16) > 0.5).float() * 2
             for name in ("dropout1", "dropout2", "dropout3", "dropout")}

    class Fixed(nn.Module):
        def __init__(self, mask):
            super().__init__()
            self.mask = mask

        def forward(self, h):
            return h * self.mask

    for name, mask in masks.items():
        setattr(theirs, name, Fixed(mask))
        target = ours.feed_forward if name == "dropout" else ours
        setattr(target, name, Fixed(mask))
    theirs.self_attn.dropout = theirs.multihead_attn.dropout = 0.0
    ours.self_attn.dropout = ours.cross_attn.dropout = 0.0
    theirs.train(), ours.train()
    future = ~torch.ones(5, 5, dtype=torch.bool).tril()
    with torch.no_grad():
        torch.testing.assert_close(ours(x, memory), theirs(x, memory, tgt_mask=future), atol=1e-5, rtol=1e-4)


def test_transformer_paper_base_parameter_count():
    """N=6, d_model 512, d_ff 2048, h 8, a shared 37000-token vocabulary with tied embeddings: ≈65M."""
    config = TransformerConfig(37000, 37000, d_model=512, n_heads=8, n_layers=6, d_ff=2048, share_embeddings=True)
    model = Transformer(config)
    d, d_ff, v, n = 512, 2048, 37000, 6
    attention = 4 * d * d + 4 * d
    ffn = 2 * d * d_ff + d_ff + d
    expected = v * d + v + n * (attention + ffn + 2 * 2 * d) + n * (2 * attention + ffn + 3 * 2 * d)
    assert model.num_parameters() == expected
    assert abs(model.num_parameters() - 65e6) / 65e6 < 0.04  # the paper's "65M" is rounded up from 63.1M
    assert model.tgt_embed.weight is model.src_embed.weight is model.generator.weight


def test_transformer_untied_parameter_count():
    config = small_config()
    model = Transformer(config)
    d, d_ff = 32, 64
    attention, ffn = 4 * d * d + 4 * d, 2 * d * d_ff + d_ff + d
    expected = (23 + 19) * d + 19 * d + 19 + 2 * (attention + ffn + 4 * d) + 2 * (2 * attention + ffn + 6 * d)
    assert model.num_parameters() == expected


def test_transformer_dropout_only_in_training():
    torch.manual_seed(0)
    model = Transformer(small_config(dropout=0.3))
    src, tgt_in = torch.randint(1, 23, (2, 6)), torch.randint(1, 19, (2, 5))
    model.train()
    assert not torch.allclose(model(src, tgt_in), model(src, tgt_in))
    model.eval()
    torch.testing.assert_close(model(src, tgt_in), model(src, tgt_in))


@pytest.mark.parametrize("change, field", [
    (dict(d_model=30, n_heads=4), "n_heads"),
    (dict(d_model=0), "d_model"),
    (dict(src_vocab=0), "src_vocab"),
    (dict(tgt_vocab=-1), "tgt_vocab"),
    (dict(n_layers=0), "n_layers"),
    (dict(d_ff=0), "d_ff"),
    (dict(max_len=0), "max_len"),
    (dict(dropout=1.0), "dropout"),
    (dict(dropout=-0.1), "dropout"),
    (dict(pad_id=50), "pad_id"),
    (dict(activation="tanh"), "activation"),
    (dict(share_embeddings=True), "share_embeddings"),
    (dict(layer_norm_eps=0.0), "layer_norm_eps"),
])
def test_transformer_config_rejects_bad_values(change, field):
    with pytest.raises(ValueError, match=field):
        small_config(**change)


def test_transformer_config_is_frozen():
    config = small_config()
    with pytest.raises(Exception):
        config.d_model = 64  # type: ignore[misc]
    assert config.d_head == 8


def test_transformer_rejects_bad_tokens():
    model = Transformer(small_config()).eval()
    with pytest.raises(ValueError, match="src"):
        model.encode(torch.randn(2, 3))
    with pytest.raises(ValueError, match="src"):
        model.encode(torch.full((2, 3), 23))
    with pytest.raises(ValueError, match="tgt_in"):
        model(torch.ones(2, 3, dtype=torch.long), torch.full((2, 3), 19))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.ones(2, 65, dtype=torch.long), torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="memory"):
        model.decode(torch.ones(2, 3, dtype=torch.long), torch.randn(2, 4, 32), torch.ones(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="config"):
        Transformer({"src_vocab": 3})  # type: ignore[arg-type]


def reference_teacher_forcing(rows, bos, eos, pad, width):
    inputs, labels = [], []
    for row in rows:
        inputs.append([bos] + row + [pad] * (width - len(row)))
        labels.append(row + [eos] + [pad] * (width - len(row)))
    return torch.tensor(inputs), torch.tensor(labels)


@pytest.mark.parametrize("bos, eos, pad", [(1, 2, 0), (5, 6, 9)])
def test_teacher_forcing_shift_right(bos, eos, pad):
    rows = [[10, 11, 12], [13], [14, 15], []]
    width = 4
    tgt = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
    decoder_input, labels = teacher_forcing(tgt, bos, eos, pad)
    expected_input, expected_labels = reference_teacher_forcing(rows, bos, eos, pad, width)
    assert decoder_input.shape == labels.shape == (4, width + 1)
    assert torch.equal(decoder_input, expected_input)
    assert torch.equal(labels, expected_labels)
    # Position t of the input predicts label t: the input is the labels shifted right by one.
    token = (labels[:, :-1] != pad) & (labels[:, :-1] != eos)
    assert torch.equal(decoder_input[:, 1:][token], labels[:, :-1][token])


def test_teacher_forcing_rejects_bad_input():
    with pytest.raises(ValueError, match="right-padded"):
        teacher_forcing(torch.tensor([[3, 0, 4]]), 1, 2, 0)
    with pytest.raises(ValueError, match="bos_id or eos_id"):
        teacher_forcing(torch.tensor([[3, 2, 0]]), 1, 2, 0)
    with pytest.raises(ValueError, match="different"):
        teacher_forcing(torch.tensor([[3, 4]]), 1, 1, 0)
    with pytest.raises(ValueError, match="tgt"):
        teacher_forcing(torch.tensor([3.0, 4.0]), 1, 2, 0)
    with pytest.raises(ValueError, match="bos_id"):
        teacher_forcing(torch.tensor([[3, 4]]), 1.0, 2, 0)  # type: ignore[arg-type]


# --- the decoder cache (library only: chapter 6 teaches it) -------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("chunks", [(1,) * 7, (3, 1, 2, 1), (7,)])
def test_decoder_cache_chunked_logits_equal_full_pass(norm_first, chunks):
    torch.manual_seed(len(chunks))
    model = Transformer(small_config(norm_first=norm_first, activation="gelu")).eval()
    src = torch.randint(1, 23, (3, 6))
    src[1, 4:] = 0
    tgt_in = torch.randint(1, 19, (3, sum(chunks)))
    memory = model.encode(src)
    full = model.decode(tgt_in, memory, src)
    cache = DecoderCache(model, memory, src, 16)
    parts, start = [], 0
    for size in chunks:
        parts.append(cache.logits(tgt_in[:, start : start + size]))
        start += size
        assert len(cache) == start
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-4)


def test_decoder_cache_reorder_follows_rows():
    """After reorder(rows), row i continues as old row rows[i] would have (rows repeat and are left out)."""
    torch.manual_seed(5)
    model = Transformer(small_config()).eval()
    src = torch.randint(1, 23, (3, 5))
    src[2, 3:] = 0
    tgt_in = torch.randint(1, 19, (3, 4))
    memory = model.encode(src)
    cache = DecoderCache(model, memory, src, 8)
    cache.logits(tgt_in[:, :3])
    rows = torch.tensor([2, 0, 0, 2])
    cache.reorder(rows)
    step = cache.logits(tgt_in[rows, 3:])
    full = model.decode(tgt_in[rows], memory[rows], src[rows])
    torch.testing.assert_close(step[:, 0], full[:, -1], atol=1e-5, rtol=1e-4)


def test_decoder_cache_refuses_what_does_not_fit():
    model = Transformer(small_config()).eval()
    src = torch.randint(1, 23, (2, 5))
    memory = model.encode(src)
    cache = DecoderCache(model, memory, src, 4)
    cache.logits(torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len"):
        cache.logits(torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="batch=2"):
        DecoderCache(model, memory, src, 4).logits(torch.ones(3, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="max_len"):
        DecoderCache(model, memory, src, 65)
    with pytest.raises(ValueError, match="memory"):
        DecoderCache(model, torch.randn(2, 5, 8), src, 4)
    with pytest.raises(ValueError, match="rows"):
        DecoderCache(model, memory, src, 4).reorder(torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="Transformer"):
        DecoderCache(nn.Linear(2, 2), memory, src, 4)  # type: ignore[arg-type]
