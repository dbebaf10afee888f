"""solutions.vit against a manual loop, nn.Conv2d and torchvision (VisionTransformer, interpolate_embeddings)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torchvision
from einops import rearrange
from torch import nn
from torchvision.models.vision_transformer import VisionTransformer as TorchvisionViT
from torchvision.models.vision_transformer import interpolate_embeddings

import warnings

from solutions.vit import (
    VisionTransformer,
    ViTConfig,
    add_cls_and_positions,
    attention_rollout,
    interpolate_position_embeddings,
    patch_embedding_from_conv,
    patchify,
    vit_parameter_count,
)

SMALL = dict(image_size=32, patch_size=8, in_channels=3, n_classes=10, d_model=64, n_layers=2, n_heads=4, d_ff=128)


def small_torchvision_vit(seed: int) -> TorchvisionViT:
    torch.manual_seed(seed)
    model = TorchvisionViT(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
                           num_classes=10)
    # torchvision zero-initialises the head (and [CLS]); randomise everything so nothing can match by accident.
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(std=0.2)
    return model.eval()


def manual_patches(images: torch.Tensor, p: int) -> torch.Tensor:
    batch, channels, height, width = images.shape
    rows = []
    for b in range(batch):
        patches = []
        for i in range(height // p):
            for j in range(width // p):
                block = images[b, :, i * p:(i + 1) * p, j * p:(j + 1) * p]  # (channels, p1, p2)
                patches.append(torch.stack([block[:, y, x] for y in range(p) for x in range(p)]).flatten())
        rows.append(torch.stack(patches))
    return torch.stack(rows)


@pytest.mark.parametrize("shape, p", [((2, 3, 8, 8), 2), ((1, 1, 6, 9), 3), ((3, 2, 4, 4), 4), ((1, 3, 5, 5), 1)])
def test_patchify_matches_manual_loop(shape, p):
    images = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))
    out = patchify(images, p)
    assert out.shape == (shape[0], (shape[2] // p) * (shape[3] // p), p * p * shape[1])
    torch.testing.assert_close(out, manual_patches(images, p), rtol=0, atol=0)


@pytest.mark.parametrize("seed", [0, 1])
def test_patchify_linear_equals_strided_conv2d(seed):
    torch.manual_seed(seed)
    channels, d_model, p = 3, 16, 4
    conv = nn.Conv2d(channels, d_model, kernel_size=p, stride=p)
    linear = nn.Linear(p * p * channels, d_model)
    with torch.no_grad():
        linear.weight.copy_(rearrange(conv.weight, "d_model channels p1 p2 -> d_model (p1 p2 channels)"))
        linear.bias.copy_(conv.bias)
    images = torch.randn(2, channels, 12, 16)
    expected = rearrange(conv(images), "batch d_model h w -> batch (h w) d_model")
    torch.testing.assert_close(linear(patchify(images, p)), expected, rtol=1e-5, atol=1e-5)


def test_patchify_rejects_indivisible_size():
    with pytest.raises(ValueError, match=r"patch_size=3.*pick patch_size from \[1, 2, 4\]"):
        patchify(torch.zeros(1, 1, 8, 12), 3)


@pytest.mark.parametrize("shape", [(3, 8, 8), (1, 1, 1, 8, 8)])
def test_patchify_rejects_wrong_rank(shape):
    with pytest.raises(ValueError, match="images must be"):
        patchify(torch.zeros(shape), 2)


def test_vit_b16_parameter_count_matches_torchvision():
    with torch.device("meta"):  # shapes only: no memory, no initialisation time
        theirs = sum(p.numel() for p in torchvision.models.vit_b_16(weights=None).parameters())
        ours = sum(p.numel() for p in VisionTransformer(224, 16, 3, 1000, 768, 12, 12, 3072).parameters())
    assert ours == theirs == 86_567_656


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vit_from_torchvision_same_logits(seed):
    theirs = small_torchvision_vit(seed)
    ours = VisionTransformer.from_torchvision(theirs).eval()
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        expected = theirs(images)
        assert expected.abs().max() > 0.1  # a non-trivial reference
        torch.testing.assert_close(ours(images), expected, rtol=1e-4, atol=1e-4)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


@pytest.mark.slow
def test_vit_from_torchvision_vit_b16_same_logits():
    torch.manual_seed(0)
    theirs = torchvision.models.vit_b_16(weights=None).eval()
    with torch.no_grad():
        theirs.heads.head.weight.normal_(std=0.02)  # zero-initialised by torchvision
    ours = VisionTransformer.from_torchvision(theirs).eval()
    images = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        expected = theirs(images)
        assert expected.abs().max() > 0.01
        torch.testing.assert_close(ours(images), expected, rtol=1e-4, atol=1e-4)


def test_vit_from_torchvision_rejects_other_modules():
    with pytest.raises(ValueError, match="torchvision.models.VisionTransformer"):
        VisionTransformer.from_torchvision(nn.Linear(2, 2))


@pytest.mark.parametrize("batch", [1, 3])
def test_vit_forward_shape_and_grad_reaches_every_parameter(batch):
    torch.manual_seed(0)
    model = VisionTransformer(**SMALL)
    logits = model(torch.randn(batch, 3, 32, 32))
    assert logits.shape == (batch, 10)
    logits.square().sum().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []


def test_vit_cls_and_positions_change_the_output():
    torch.manual_seed(0)
    model = VisionTransformer(**SMALL).eval()
    images = torch.randn(2, 3, 32, 32)
    before = model(images)
    with torch.no_grad():
        model.position_embedding[:, 3].add_(1.0)
    assert not torch.allclose(model(images), before)


def test_vit_attention_maps_shape_and_rows_match_attention_weights():
    torch.manual_seed(0)
    model = VisionTransformer(**SMALL).eval()
    images = torch.randn(2, 3, 32, 32)
    maps = model.attention_maps(images)
    assert maps.shape == (2, 2, 4, 4, 4)  # batch, layers, heads, grid height, grid width
    # [CLS] → patches plus [CLS] → [CLS] sums to 1, so the patch part sums to at most 1.
    sums = maps.sum(dim=(-1, -2))
    assert torch.all(sums <= 1 + 1e-5) and torch.all(sums > 0)
    layer = model.layers[0]
    with torch.no_grad():
        full = layer.self_attn.attention_weights(layer.norm1(model.embed(images)))
    torch.testing.assert_close(maps[:, 0], full[:, :, 0, 1:].reshape(2, 4, 4, 4))
    weights = model.attention_weights(images)
    assert weights.shape == (2, 2, 4, 17, 17)  # layers, batch, heads, seq, seq
    torch.testing.assert_close(weights[0], full)


def test_vit_attention_weights_are_those_of_the_forward_pass():
    """attention_weights records, layer by layer, the weights of exactly the inputs the forward pass gives each layer."""
    torch.manual_seed(1)
    model = VisionTransformer(**SMALL).eval()
    images = torch.randn(2, 3, 32, 32)
    seen = []
    hooks = [layer.self_attn.register_forward_pre_hook(lambda mod, args: seen.append(mod.attention_weights(args[0])))
             for layer in model.layers]
    with torch.no_grad():
        model(images)
    for hook in hooks:
        hook.remove()
    torch.testing.assert_close(model.attention_weights(images), torch.stack(seen))


def test_vit_mean_pooling_reads_the_patch_tokens_and_keeps_the_parameters():
    torch.manual_seed(2)
    cls_model = VisionTransformer(**SMALL).eval()
    mean_model = VisionTransformer(**SMALL, pool="mean").eval()
    mean_model.load_state_dict(cls_model.state_dict())  # the same parameters: only what the head reads differs
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        x = cls_model.embed(images)
        for layer in cls_model.layers:
            x = layer(x)
        x = cls_model.norm(x)
        torch.testing.assert_close(mean_model(images), cls_model.head(x[:, 1:].mean(1)))
        torch.testing.assert_close(cls_model(images), cls_model.head(x[:, 0]))
    with pytest.raises(ValueError, match="pool"):
        VisionTransformer(**SMALL, pool="max")


def reference_rollout(attentions: torch.Tensor) -> torch.Tensor:
    """Abnar & Zuidema's rollout for one image at a time, with explicit loops (for the test)."""
    layers, batch, heads, seq, _ = attentions.shape
    out = []
    for b in range(batch):
        rollout = torch.eye(seq, dtype=attentions.dtype)
        for layer in range(layers):
            mean = sum(attentions[layer, b, h] for h in range(heads)) / heads
            mixed = 0.5 * mean + 0.5 * torch.eye(seq, dtype=attentions.dtype)
            mixed = mixed / mixed.sum(dim=1, keepdim=True)
            rollout = mixed @ rollout
        out.append(rollout)
    return torch.stack(out)


@pytest.mark.parametrize("seed", [0, 1])
def test_attention_rollout_matches_the_loop_and_rows_sum_to_one(seed):
    gen = torch.Generator().manual_seed(seed)
    attentions = torch.randn(3, 2, 4, 6, 6, generator=gen, dtype=torch.float64).softmax(-1)
    attentions = attentions * (0.5 + torch.rand(3, 2, 4, 6, 1, generator=gen, dtype=torch.float64))  # as after dropout
    rollout = attention_rollout(attentions)
    torch.testing.assert_close(rollout, reference_rollout(attentions))
    torch.testing.assert_close(rollout.sum(-1), torch.ones(2, 6, dtype=torch.float64))


def test_attention_rollout_of_identity_attention_is_the_identity_and_of_a_vit_is_row_stochastic():
    eye = torch.eye(5).expand(2, 3, 4, 5, 5)
    torch.testing.assert_close(attention_rollout(eye), torch.eye(5).expand(3, 5, 5))
    model = VisionTransformer(**SMALL).eval()
    rollout = attention_rollout(model.attention_weights(torch.randn(2, 3, 32, 32)))
    assert rollout.shape == (2, 17, 17) and torch.all(rollout >= 0)
    torch.testing.assert_close(rollout.sum(-1), torch.ones(2, 17))
    with pytest.raises(ValueError, match="attentions"):
        attention_rollout(torch.rand(2, 4, 5, 5))


def test_vit_rejects_images_of_wrong_shape():
    model = VisionTransformer(**SMALL)
    with pytest.raises(ValueError, match=r"images must be \(batch, 3, 32, 32\)"):
        model(torch.zeros(1, 3, 16, 16))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(image_size=30), r"image_size=30 is not divisible by patch_size=8; pick patch_size from"),
        (dict(n_heads=5), r"d_model=64 is not divisible by n_heads=5; pick n_heads from \[1, 2, 4, 8, 16, 32, 64\]"),
        (dict(n_layers=0), r"n_layers must be a positive integer"),
        (dict(dropout=1.5), r"dropout must be in \[0, 1\)"),
    ],
)
def test_vit_config_rejects_bad_sizes(change, message):
    with pytest.raises(ValueError, match=message):
        VisionTransformer(**{**SMALL, **change})


def test_vit_config_derived_sizes():
    config = ViTConfig(224, 16, 3, 1000, 768, 12, 12, 3072)
    assert (config.grid_size, config.n_patches, config.patch_dim) == (14, 196, 768)


# --- the patch embedding as a Linear ---


@pytest.mark.parametrize("channels, p, bias, dtype", [(3, 4, True, torch.float32), (1, 2, False, torch.float32),
                                                      (2, 3, True, torch.float64)])
def test_patch_embedding_from_conv_equals_the_conv(channels, p, bias, dtype):
    torch.manual_seed(channels + p)
    conv = nn.Conv2d(channels, 8, kernel_size=p, stride=p, bias=bias).to(dtype)
    images = torch.randn(2, channels, 3 * p, 2 * p, dtype=dtype)
    linear = patch_embedding_from_conv(conv)
    assert isinstance(linear, nn.Linear) and linear.weight.dtype == dtype and (linear.bias is None) == (not bias)
    with torch.no_grad():
        expected = rearrange(conv(images), "batch d_model h w -> batch (h w) d_model")
        torch.testing.assert_close(linear(patchify(images, p)), expected)
    with torch.no_grad():  # a copy, not a view: changing the Linear leaves the conv alone
        linear.weight.zero_()
    assert conv.weight.abs().sum() > 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(kernel_size=4, stride=2), "stride=\\(2, 2\\)"),
    (dict(kernel_size=4, stride=4, padding=1), "padding=\\(1, 1\\)"),
    (dict(kernel_size=(4, 2), stride=(4, 2)), "square kernel"),
    (dict(kernel_size=2, stride=2, groups=3), "groups=3"),
])
def test_patch_embedding_from_conv_rejects_convs_that_are_not_patch_embeddings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        patch_embedding_from_conv(nn.Conv2d(3, 6, **kwargs))
    with pytest.raises(ValueError, match="conv must be an nn.Conv2d"):
        patch_embedding_from_conv(nn.Linear(3, 3))


# --- [CLS] and positions ---


@pytest.mark.parametrize("batch", [1, 3])
def test_add_cls_and_positions_row_by_row(batch):
    gen = torch.Generator().manual_seed(batch)
    tokens, cls, positions = torch.randn(batch, 5, 4, generator=gen), torch.randn(1, 1, 4, generator=gen), \
        torch.randn(1, 6, 4, generator=gen)
    out = add_cls_and_positions(tokens, cls, positions)
    assert out.shape == (batch, 6, 4)
    for b in range(batch):
        torch.testing.assert_close(out[b, 0], cls[0, 0] + positions[0, 0], rtol=0, atol=0)
        for k in range(5):
            torch.testing.assert_close(out[b, 1 + k], tokens[b, k] + positions[0, 1 + k], rtol=0, atol=0)


def test_add_cls_and_positions_gradients_reach_cls_and_positions():
    cls = torch.randn(1, 1, 4, requires_grad=True)
    positions = torch.randn(1, 4, 4, requires_grad=True)
    cotangent = torch.randn(3, 4, 4)
    (add_cls_and_positions(torch.randn(3, 3, 4), cls, positions) * cotangent).sum().backward()
    torch.testing.assert_close(cls.grad, cotangent[:, :1].sum(0, keepdim=True))
    torch.testing.assert_close(positions.grad, cotangent.sum(0, keepdim=True))


@pytest.mark.parametrize("cls_shape, positions_shape, message", [
    ((1, 1, 4), (1, 5, 4), r"position_embedding must be \(1, 1 \+ n_patches, d_model\) = \(1, 4, 4\).*interpolate"),
    ((2, 1, 4), (1, 4, 4), r"cls_token must be \(1, 1, d_model=4\)"),
])
def test_add_cls_and_positions_rejects_mismatched_shapes(cls_shape, positions_shape, message):
    with pytest.raises(ValueError, match=message):
        add_cls_and_positions(torch.zeros(2, 3, 4), torch.zeros(cls_shape), torch.zeros(positions_shape))


# --- a new image size ---


@pytest.mark.parametrize("old, new, dtype", [(2, 5, torch.float32), (4, 7, torch.float32), (6, 3, torch.float64),
                                             (3, 1, torch.float32)])
def test_interpolate_position_embeddings_matches_torchvision(old, new, dtype):
    positions = torch.randn(1, 1 + old * old, 6, generator=torch.Generator().manual_seed(old * new), dtype=dtype)
    expected = interpolate_embeddings(new * 16, 16, {"encoder.pos_embedding": positions})["encoder.pos_embedding"]
    out = interpolate_position_embeddings(positions, new)
    assert out.shape == (1, 1 + new * new, 6) and out.dtype == dtype
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out[:, 0], positions[:, 0], rtol=0, atol=0)  # [CLS] is not on the grid


def test_interpolate_position_embeddings_keeps_the_grid():
    # Feature 0 is the patch's row, feature 1 its column: after resizing, feature 0 still varies only down the
    # rows and feature 1 only across the columns, and the four corners keep their values (corners aligned).
    rows, cols = torch.meshgrid(torch.arange(4.0), torch.arange(4.0), indexing="ij")
    grid = torch.stack([rows, cols], dim=-1).reshape(1, 16, 2)
    positions = torch.cat([torch.full((1, 1, 2), -7.0), grid], dim=1).double()
    out = interpolate_position_embeddings(positions, 7)[0, 1:].reshape(7, 7, 2)
    torch.testing.assert_close(out[..., 0], out[:, :1, 0].expand(7, 7))
    torch.testing.assert_close(out[..., 1], out[:1, :, 1].expand(7, 7))
    assert out[0, 0].tolist() == [0.0, 0.0] and out[-1, -1].tolist() == [3.0, 3.0]
    assert out[0, -1].tolist() == [0.0, 3.0] and out[-1, 0].tolist() == [3.0, 0.0]
    torch.testing.assert_close(interpolate_position_embeddings(positions, 4), positions)


@pytest.mark.parametrize("shape, grid, message", [
    ((1, 1 + 6, 4), 3, "6 patch positions, which is not a square number"),
    ((2, 5, 4), 3, r"position_embedding must be \(1, 1 \+ n_patches, d_model\)"),
    ((1, 5, 4), 0, "grid_size must be a positive integer"),
])
def test_interpolate_position_embeddings_rejects_bad_input(shape, grid, message):
    with pytest.raises(ValueError, match=message):
        interpolate_position_embeddings(torch.zeros(shape), grid)


def test_vit_for_image_size_equals_torchvision_with_interpolated_positions():
    theirs = small_torchvision_vit(3)
    state = interpolate_embeddings(48, 8, OrderedDict(theirs.state_dict()))
    bigger = TorchvisionViT(image_size=48, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
                            num_classes=10)
    bigger.load_state_dict(state)
    ours = VisionTransformer.from_torchvision(theirs).eval().for_image_size(48)
    assert ours.config.image_size == 48 and ours.position_embedding.shape == (1, 37, 64)
    images = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(ours(images), bigger.eval()(images), rtol=1e-4, atol=1e-4)


def test_vit_wrong_image_size_error_points_to_for_image_size():
    with pytest.raises(ValueError, match="for_image_size"):
        VisionTransformer(**SMALL)(torch.zeros(1, 3, 40, 40))


# --- the parameter count by formula ---


@pytest.mark.parametrize("sizes", [
    (224, 16, 3, 1000, 768, 12, 12, 3072),  # ViT-B/16
    (224, 32, 3, 1000, 768, 12, 12, 3072),  # ViT-B/32
    (224, 16, 3, 1000, 1024, 24, 16, 4096),  # ViT-L/16
    (224, 14, 3, 1000, 1280, 32, 16, 5120),  # ViT-H/14
    (384, 16, 3, 21843, 768, 12, 12, 3072),  # B/16 at 384 px with the ImageNet-21k head
])
def test_vit_parameter_count_matches_torchvision(sizes):
    image_size, p, _, n_classes, d_model, n_layers, n_heads, d_ff = sizes
    with torch.device("meta"):
        theirs = TorchvisionViT(image_size, p, n_layers, n_heads, d_model, d_ff, num_classes=n_classes)
        ours = VisionTransformer(*sizes)
    expected = sum(param.numel() for param in theirs.parameters())
    assert vit_parameter_count(*sizes) == expected == sum(param.numel() for param in ours.parameters())


@pytest.mark.parametrize("channels", [1, 4])
def test_vit_parameter_count_other_channels_matches_the_module(channels):
    sizes = (12, 3, channels, 7, 24, 2, 4, 40)
    assert vit_parameter_count(*sizes) == sum(p.numel() for p in VisionTransformer(*sizes).parameters())


def test_vit_b16_parameter_count_is_86_567_656():
    assert vit_parameter_count(224, 16, 3, 1000, 768, 12, 12, 3072) == 86_567_656


@pytest.mark.parametrize("sizes, message", [
    ((225, 16, 3, 1000, 768, 12, 12, 3072), "image_size=225 is not divisible by patch_size=16"),
    ((224, 16, 3, 1000, 770, 12, 12, 3072), "d_model=770 is not divisible by n_heads=12"),
])
def test_vit_parameter_count_rejects_bad_sizes(sizes, message):
    with pytest.raises(ValueError, match=message):
        vit_parameter_count(*sizes)


def test_vit_layers_use_the_names_of_the_encoder_decoder():
    """One name per concept (layers, norm1/norm2, self_attn, feed_forward.linear1/linear2), as in chapter 4."""
    keys = set(VisionTransformer(**SMALL).state_dict().keys())
    assert {"layers.0.norm1.weight", "layers.0.self_attn.in_proj.weight", "layers.0.norm2.bias",
            "layers.0.feed_forward.linear1.weight", "layers.0.feed_forward.linear2.bias"} <= keys
    assert not any(name in key for key in keys for name in ("blocks", "mlp", "norm_attention", ".attention."))


def test_vit_d_mlp_is_a_deprecated_alias_of_d_ff():
    sizes = {k: v for k, v in SMALL.items() if k != "d_ff"}
    with pytest.warns(DeprecationWarning, match="d_mlp is deprecated.*d_ff"):
        old = VisionTransformer(**sizes, d_mlp=128)
    assert old.config.d_ff == 128
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name warns nothing
        VisionTransformer(**SMALL)
        VisionTransformer(32, 8, 3, 10, 64, 2, 4, 128)  # positionally, d_ff where d_mlp was
    with pytest.raises(TypeError, match="d_ff"):
        VisionTransformer(**SMALL, d_mlp=128)
    with pytest.raises(TypeError, match="d_ff"):
        VisionTransformer(**sizes)


def test_vit_mutants_are_caught_by_their_checks_not_by_the_delegation_rule():
    # A mutant that called solutions.vit would be rejected as delegation whatever its mistake.
    from autograder.checks import core
    from mutants import chapter_of, load_all

    chapter = chapter_of("vit_mutants")
    for mutant in load_all()["vit_mutants"]:
        with pytest.raises(core.CheckFailed) as err:
            core.run(chapter.checks, mutant.exercise, mutant.obj, level="hidden", seed=0, quiet=True)
        assert "library's answer" not in str(err.value), f"{mutant.name}: {err.value}"


def test_vit_checkpoint_written_under_the_old_names_keeps_loading(tmp_path):
    """A checkpoint saved before the renaming (blocks.N.norm_attention, .attention, .norm_mlp, .mlp.up/.down and the
    config's d_mlp), made here by renaming a new one's keys back, loads into today's model with the same logits."""
    import re

    from solutions.checkpoint import load_checkpoint, save_checkpoint
    from solutions.trainers.vit import build_model

    torch.manual_seed(4)
    config = {"model": "vit", **SMALL}
    model = build_model(config).eval()
    path = save_checkpoint(tmp_path, kind="vit", config=config, model=model, vocab={"classes": list("0123456789")},
                           metrics={})
    saved = torch.load(path, weights_only=True)
    old_names = ((r"^layers\.(\d+)\.norm1\.", r"blocks.\1.norm_attention."),
                 (r"^layers\.(\d+)\.self_attn\.", r"blocks.\1.attention."),
                 (r"^layers\.(\d+)\.norm2\.", r"blocks.\1.norm_mlp."),
                 (r"^layers\.(\d+)\.feed_forward\.linear1\.", r"blocks.\1.mlp.up."),
                 (r"^layers\.(\d+)\.feed_forward\.linear2\.", r"blocks.\1.mlp.down."))
    state = {}
    for key, value in saved["state_dict"].items():
        for pattern, replacement in old_names:
            key = re.sub(pattern, replacement, key)
        state[key] = value
    assert "blocks.1.mlp.down.weight" in state and not any(key.startswith("layers.") for key in state)
    saved["state_dict"] = state
    saved["config"] = {("d_mlp" if key == "d_ff" else key): value for key, value in saved["config"].items()}
    torch.save(saved, path)
    checkpoint = load_checkpoint(tmp_path, kind="vit")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the config comes back under today's names: no DeprecationWarning
        restored = build_model(checkpoint.config).eval()
    restored.load_state_dict(checkpoint.state_dict)  # strict: every key found
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(restored(images), model(images))
