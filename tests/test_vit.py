"""solutions.vit against a manual loop, nn.Conv2d and torchvision's VisionTransformer."""

from __future__ import annotations

import pytest
import torch
import torchvision
from einops import rearrange
from torch import nn
from torchvision.models.vision_transformer import VisionTransformer as TorchvisionViT

from solutions.vit import VisionTransformer, ViTConfig, patchify

SMALL = dict(image_size=32, patch_size=8, in_channels=3, n_classes=10, d_model=64, n_layers=2, n_heads=4, d_mlp=128)


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
    block = model.blocks[0]
    with torch.no_grad():
        full = block.attention.attention_weights(block.norm_attention(model.embed(images)))
    torch.testing.assert_close(maps[:, 0], full[:, :, 0, 1:].reshape(2, 4, 4, 4))


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
