"""Planted bugs for chapter 5 (the Vision Transformer): each must FAIL the hidden checks of its exercise.

Each mutant is a copy of the ``solutions.vit`` code with one realistic change. They are written out here
rather than calling ``solutions.vit``: a call into the chapter's answer module is delegation, which the
checks flag on its own, and a mutant must be caught by the check of its mistake.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import nn
from torchvision.models import vision_transformer

from mutants import Mutant  # tests/ is on sys.path under pytest
from solutions.multihead import MultiHeadAttention


def _check_divisible(images, patch_size):
    height, width = images.shape[-2:]
    if height % patch_size or width % patch_size:
        raise ValueError(f"patch_size={patch_size} does not divide the image size {height}×{width}")


# --- patchify ---


def patchify_view_no_permute(images, patch_size):
    _check_divisible(images, patch_size)
    batch, channels = images.shape[:2]
    return images.reshape(batch, -1, patch_size * patch_size * channels)


def patchify_unfold_view(images, patch_size):
    _check_divisible(images, patch_size)
    batch, channels = images.shape[:2]
    patches = images.unfold(2, patch_size, patch_size).unfold(3, patch_size, patch_size).contiguous()
    return patches.view(batch, -1, channels * patch_size * patch_size)


def patchify_channels_first(images, patch_size):
    _check_divisible(images, patch_size)
    return F.unfold(images, kernel_size=patch_size, stride=patch_size).transpose(1, 2)


def patchify_column_major(images, patch_size):
    _check_divisible(images, patch_size)
    return rearrange(images, "batch channels (h p1) (w p2) -> batch (w h) (p1 p2 channels)", p1=patch_size,
                     p2=patch_size)


def patchify_silent_crop(images, patch_size):
    height, width = images.shape[-2:]
    images = images[..., : height // patch_size * patch_size, : width // patch_size * patch_size]
    return rearrange(images, "batch channels (h p1) (w p2) -> batch (h w) (p1 p2 channels)", p1=patch_size,
                     p2=patch_size)


# --- patch_embedding_from_conv ---


def _check_patch_conv(conv):
    if conv.stride != conv.kernel_size or conv.padding != (0, 0):
        raise ValueError(f"conv must have stride == kernel_size; got stride={conv.stride}")


def conv_weight_reshaped(conv):
    _check_patch_conv(conv)
    p1, p2 = conv.kernel_size
    linear = nn.Linear(conv.in_channels * p1 * p2, conv.out_channels, bias=conv.bias is not None,
                       dtype=conv.weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.reshape(conv.out_channels, -1))
        if conv.bias is not None:
            linear.bias.copy_(conv.bias)
    return linear


def conv_refuses_valid_padding(conv):
    """Checks conv.padding against (0, 0) only: a conv made with padding="valid" (the same conv) is refused."""
    p1, p2 = conv.kernel_size
    if p1 != p2 or conv.stride != conv.kernel_size or conv.padding != (0, 0):
        raise ValueError(f"conv must be a patch embedding; got stride={conv.stride}, padding={conv.padding}")
    linear = nn.Linear(conv.in_channels * p1 * p2, conv.out_channels, bias=conv.bias is not None,
                       dtype=conv.weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(rearrange(conv.weight, "d_model channels p1 p2 -> d_model (p1 p2 channels)"))
        if conv.bias is not None:
            linear.bias.copy_(conv.bias)
    return linear


def conv_bias_not_copied(conv):
    _check_patch_conv(conv)
    p1, p2 = conv.kernel_size
    linear = nn.Linear(conv.in_channels * p1 * p2, conv.out_channels, dtype=conv.weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(rearrange(conv.weight, "d_model channels p1 p2 -> d_model (p1 p2 channels)"))
    return linear


# --- add_cls_and_positions ---


def _check_positions(tokens, position_embedding):
    if position_embedding.shape[1] != tokens.shape[1] + 1:
        raise ValueError(f"position_embedding has {position_embedding.shape[1]} rows; need {tokens.shape[1] + 1}")


def cls_not_expanded(tokens, cls_token, position_embedding):
    _check_positions(tokens, position_embedding)
    return torch.cat([cls_token, tokens], dim=1) + position_embedding


def positions_before_cls(tokens, cls_token, position_embedding):
    _check_positions(tokens, position_embedding)
    tokens = tokens + position_embedding[:, : tokens.shape[1]]
    return torch.cat([repeat(cls_token, "1 1 d -> b 1 d", b=tokens.shape[0]), tokens], dim=1)


def cls_appended_last(tokens, cls_token, position_embedding):
    _check_positions(tokens, position_embedding)
    cls = repeat(cls_token, "1 1 d -> b 1 d", b=tokens.shape[0])
    return torch.cat([tokens, cls], dim=1) + position_embedding


def cls_positions_sliced(tokens, cls_token, position_embedding):
    """A table with more rows than needed is silently cut to the first 1 + n_patches ones."""
    if position_embedding.shape[1] < tokens.shape[1] + 1:
        raise ValueError(f"position_embedding has {position_embedding.shape[1]} rows; need {tokens.shape[1] + 1}")
    cls = repeat(cls_token, "1 1 d -> b 1 d", b=tokens.shape[0])
    return torch.cat([cls, tokens], dim=1) + position_embedding[:, : tokens.shape[1] + 1]


def cls_through_data(tokens, cls_token, position_embedding):
    _check_positions(tokens, position_embedding)
    cls = cls_token.data.expand(tokens.shape[0], -1, -1)
    return torch.cat([cls, tokens], dim=1) + position_embedding


# --- VisionTransformer (a self-contained copy with the reference's parameter names) ---


def _add_cls_and_positions(tokens, cls_token, position_embedding):
    cls = repeat(cls_token, "1 1 d_model -> batch 1 d_model", batch=tokens.shape[0])
    return torch.cat([cls, tokens], dim=1) + position_embedding


class _FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1, self.activation, self.linear2 = nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class _EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model, eps=1e-6)
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.dropout = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model, eps=1e-6)
        self.feed_forward = _FeedForward(d_model, d_ff, dropout)

    def forward(self, x):
        x = x + self.dropout(self.self_attn(self.norm1(x)))
        return x + self.feed_forward(self.norm2(x))


class _ViT(nn.Module):
    def __init__(self, image_size, patch_size, in_channels, n_classes, d_model, n_layers, n_heads, d_ff=None,
                 dropout=0.0, *, pool="cls"):
        super().__init__()
        self.image_size, self.in_channels, self.patch_size, self.pool = image_size, in_channels, patch_size, pool
        self.patch_embedding = nn.Linear(patch_size * patch_size * in_channels, d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.position_embedding = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2 + 1, d_model))
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(_EncoderLayer(d_model, n_heads, d_ff, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model, eps=1e-6)
        self.head = nn.Linear(d_model, n_classes)

    def patches(self, images):
        if tuple(images.shape[1:]) != (self.in_channels, self.image_size, self.image_size):
            raise ValueError(f"images must be (batch, {self.in_channels}, {self.image_size}, {self.image_size})")
        p = self.patch_size
        return self.patch_embedding(rearrange(images, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p))

    def embed(self, images):
        return self.dropout(_add_cls_and_positions(self.patches(images), self.cls_token, self.position_embedding))

    def encode(self, images):
        x = self.embed(images)
        for layer in self.layers:
            x = layer(x)
        return x

    def pooled(self, x):
        return x[:, 0] if self.pool == "cls" else x[:, 1:].mean(dim=1)

    def forward(self, images):
        return self.head(self.pooled(self.norm(self.encode(images))))


class ViTClassifiesFromLastToken(_ViT):
    def forward(self, images):
        return self.head(self.norm(self.encode(images))[:, -1])


class ViTMeanIncludingCLS(_ViT):
    """Mean pooling over every token, [CLS] included (with pool="cls" too)."""

    def pooled(self, x):
        return x.mean(dim=1)


class ViTPoolIgnored(_ViT):
    """The head always reads [CLS], whatever pool says."""

    def pooled(self, x):
        return x[:, 0]


class ViTNoFinalNorm(_ViT):
    def forward(self, images):
        return self.head(self.pooled(self.encode(images)))


class ViTNormAfterPooling(_ViT):
    def forward(self, images):
        return self.head(self.norm(self.pooled(self.encode(images))))


class ViTNoEmbeddingDropout(_ViT):
    """self.dropout never applied to the encoder's input: only training mode shows it."""

    def embed(self, images):
        return _add_cls_and_positions(self.patches(images), self.cls_token, self.position_embedding)


class ViTDropoutBeforePositions(_ViT):
    """Dropout on [CLS] + patches, the positions added afterwards: only training mode shows it."""

    def embed(self, images):
        tokens = self.patches(images)
        cls = repeat(self.cls_token, "1 1 d -> b 1 d", b=tokens.shape[0])
        return self.dropout(torch.cat([cls, tokens], dim=1)) + self.position_embedding


# --- vit_parameter_count ---


def _count(image_size, patch_size, in_channels, n_classes, d_model, n_layers, n_heads, d_ff, *,
           cls_position=True, norms=True, channels=True):
    if image_size % patch_size:
        raise ValueError(f"image_size={image_size} is not divisible by patch_size={patch_size}")
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
    n_patches = (image_size // patch_size) ** 2
    patch_dim = patch_size * patch_size * (in_channels if channels else 1)
    embeddings = patch_dim * d_model + d_model + d_model + (n_patches + (1 if cls_position else 0)) * d_model
    block = 4 * d_model * d_model + 4 * d_model + 2 * d_model * d_ff + d_ff + d_model + (4 * d_model if norms else 0)
    head = (2 * d_model if norms else 0) + d_model * n_classes + n_classes
    return embeddings + n_layers * block + head


def count_positions_without_cls(*args):
    return _count(*args, cls_position=False)


def count_without_layernorms(*args):
    return _count(*args, norms=False)


def count_patch_embedding_without_channels(*args):
    return _count(*args, channels=False)


# --- interpolate_position_embeddings ---


def _split(position_embedding):
    side = math.isqrt(position_embedding.shape[1] - 1)
    if side * side != position_embedding.shape[1] - 1:
        raise ValueError("position_embedding must hold [CLS] then a square grid of patch positions")
    return position_embedding[:, :1], position_embedding[:, 1:], side


def interp_reshape_without_permute(position_embedding, grid_size):
    cls, patches, side = _split(position_embedding)
    d_model = patches.shape[-1]
    grid = patches.reshape(1, d_model, side, side)
    resized = F.interpolate(grid, size=(grid_size, grid_size), mode="bicubic", align_corners=True)
    return torch.cat([cls, resized.reshape(1, grid_size * grid_size, d_model)], dim=1)


def interp_as_one_sequence(position_embedding, grid_size):
    _split(position_embedding)
    resized = F.interpolate(position_embedding.transpose(1, 2), size=1 + grid_size * grid_size, mode="linear",
                            align_corners=True)
    return resized.transpose(1, 2)


def interp_calls_torchvision(position_embedding, grid_size):
    _split(position_embedding)
    patch = 16  # any patch size: only the grid matters
    state = OrderedDict({"encoder.pos_embedding": position_embedding})
    return vision_transformer.interpolate_embeddings(grid_size * patch, patch, state)["encoder.pos_embedding"]


def interp_flattened_column_major(position_embedding, grid_size):
    cls, patches, side = _split(position_embedding)
    grid = rearrange(patches, "1 (h w) d_model -> 1 d_model h w", h=side)
    resized = F.interpolate(grid, size=(grid_size, grid_size), mode="bicubic", align_corners=True)
    return torch.cat([cls, rearrange(resized, "1 d_model h w -> 1 (w h) d_model")], dim=1)


# --- attention_rollout ---


def _rollout(attentions, *, mix=lambda a, eye: 0.5 * a.mean(dim=1) + 0.5 * eye, normalise=True, reverse=False):
    if attentions.dim() != 5:
        raise ValueError(f"attentions must be (layers, batch, heads, seq, seq); got {tuple(attentions.shape)}")
    seq = attentions.shape[-1]
    eye = torch.eye(seq, dtype=attentions.dtype)
    rollout = eye.expand(attentions.shape[1], seq, seq)
    for layer in attentions:
        mixed = mix(layer, eye)
        if normalise:
            mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = rollout @ mixed if reverse else mixed @ rollout
    return rollout


def rollout_reversed_order(attentions):
    """rollout @ mixed: the first layer ends up leftmost."""
    return _rollout(attentions, reverse=True)


def rollout_no_residual(attentions):
    """The heads' mean attention multiplied through the layers, the residual connection forgotten."""
    return _rollout(attentions, mix=lambda a, eye: a.mean(dim=1))


def rollout_max_over_heads(attentions):
    return _rollout(attentions, mix=lambda a, eye: 0.5 * a.amax(dim=1) + 0.5 * eye)


def rollout_not_renormalised(attentions):
    """Rows not renormalised: right while every attention row sums to 1, wrong after dropout."""
    return _rollout(attentions, normalise=False)


def rollout_last_layer_only(attentions):
    return _rollout(attentions[-1:])


def rollout_per_head(attentions):
    """Each head rolled out on its own, then the heads averaged."""
    if attentions.dim() != 5:
        raise ValueError(f"attentions must be (layers, batch, heads, seq, seq); got {tuple(attentions.shape)}")
    return torch.stack([_rollout(attentions[:, :, h : h + 1]) for h in range(attentions.shape[2])]).mean(0)


def rollout_no_shape_check(attentions):
    """No shape check: a (layers, heads, seq, seq) stack is read as batch = heads and a wrong rollout comes back."""
    seq = attentions.shape[-1]
    eye = torch.eye(seq, dtype=attentions.dtype)
    rollout = eye
    for layer in attentions:
        mixed = 0.5 * layer.mean(dim=-3) + 0.5 * eye
        rollout = (mixed / mixed.sum(dim=-1, keepdim=True)) @ rollout
    return rollout


MUTANTS: list[Mutant] = [
    Mutant("patchify_view_no_permute", "patchify",
           "images.reshape(batch, -1, p·p·channels): the right shape, but a 'patch' is a run of memory across rows "
           "and channels, not a p×p block (a shape-only test lets it through)",
           patchify_view_no_permute),
    Mutant("patchify_unfold_view", "patchify",
           "unfold(2, p, p).unfold(3, p, p) then .view(batch, -1, channels·p·p) without moving channels last: "
           "'patch' 0 is three blocks of channel 0 (published in gupta-abhay/pytorch-vit, fixed after issue #7)",
           patchify_unfold_view),
    Mutant("patchify_channels_first", "patchify",
           "F.unfold(...).transpose(1, 2): right blocks, flattened as (channels p1 p2) instead of the documented "
           "(p1 p2 channels), so the conv weights rearranged for the ViT meet the wrong pixels",
           patchify_channels_first),
    Mutant("patchify_column_major", "patchify", "patches numbered column by column, (w h) instead of (h w)",
           patchify_column_major),
    Mutant("patchify_silent_crop", "patchify",
           "an image size not divisible by patch_size is silently cropped instead of raising a clear error",
           patchify_silent_crop),
    Mutant("conv_weight_reshaped", "patch_embedding_from_conv",
           "conv.weight.reshape(d_model, -1) flattens the kernel as (channels p1 p2), not patchify's (p1 p2 channels): "
           "the Linear no longer equals the conv", conv_weight_reshaped),
    Mutant("conv_refuses_valid_padding", "patch_embedding_from_conv",
           "conv.padding compared with (0, 0) only: the same patch conv made with padding='valid' (a PyTorch habit; "
           "conv.padding is then the string) is refused", conv_refuses_valid_padding),
    Mutant("conv_bias_not_copied", "patch_embedding_from_conv",
           "the conv's bias is not copied: the Linear keeps its random initial bias", conv_bias_not_copied),
    Mutant("cls_not_expanded", "add_cls_and_positions",
           "torch.cat([cls_token, tokens]) with the (1, 1, d_model) token not expanded over the batch: works for a "
           "batch of one, fails for any other", cls_not_expanded),
    Mutant("positions_before_cls", "add_cls_and_positions",
           "positions added to the patches before [CLS] is prepended: [CLS] gets no position and every patch its "
           "left neighbour's", positions_before_cls),
    Mutant("cls_appended_last", "add_cls_and_positions", "[CLS] appended after the patches instead of first",
           cls_appended_last),
    Mutant("cls_positions_sliced", "add_cls_and_positions",
           "a position table longer than the patches need is silently cut to its first rows (a model trained at "
           "another image size then runs with positions that belong to another grid)", cls_positions_sliced),
    Mutant("cls_through_data", "add_cls_and_positions",
           "cls_token.data used: no gradient reaches the [CLS] token, which then never learns", cls_through_data),
    Mutant("vit_classifies_from_last_token", "VisionTransformer",
           "the head reads the last token (x[:, -1], a decoder habit) instead of [CLS] at position 0",
           ViTClassifiesFromLastToken),
    Mutant("vit_mean_including_cls", "VisionTransformer",
           "the head reads the mean of all tokens, [CLS] included, instead of the [CLS] output",
           ViTMeanIncludingCLS),
    Mutant("vit_pool_ignored", "VisionTransformer",
           "pool='mean' ignored: the head always reads the [CLS] output", ViTPoolIgnored),
    Mutant("vit_no_final_norm", "VisionTransformer", "the final LayerNorm before the head is skipped",
           ViTNoFinalNorm),
    Mutant("vit_norm_after_pooling", "VisionTransformer",
           "the final LayerNorm applied to the pooled vector instead of every token's output", ViTNormAfterPooling),
    Mutant("vit_no_embedding_dropout", "VisionTransformer",
           "training mode only: the embeddings' dropout is never applied; every eval-mode check passes",
           ViTNoEmbeddingDropout),
    Mutant("vit_dropout_before_positions", "VisionTransformer",
           "training mode only: dropout on [CLS] + patches, the positions added afterwards; every eval-mode check "
           "passes", ViTDropoutBeforePositions),
    Mutant("count_positions_without_cls", "vit_parameter_count",
           "one position vector per patch, forgetting [CLS]'s row (n_patches instead of 1 + n_patches)",
           count_positions_without_cls),
    Mutant("count_without_layernorms", "vit_parameter_count",
           "the LayerNorms' scales and shifts are not counted", count_without_layernorms),
    Mutant("count_patch_embedding_without_channels", "vit_parameter_count",
           "the patch embedding counted as p·p → d_model, forgetting the channels", count_patch_embedding_without_channels),
    Mutant("interp_reshape_without_permute", "interpolate_position_embeddings",
           "(1, n_patches, d_model) reshaped straight to (1, d_model, h, w) and back: features and positions "
           "scrambled, the same view-without-permute mistake as in patchify", interp_reshape_without_permute),
    Mutant("interp_as_one_sequence", "interpolate_position_embeddings",
           "the whole table, [CLS] included, stretched as a 1-D sequence: the 2-D grid of patches is lost",
           interp_as_one_sequence),
    Mutant("interp_calls_torchvision", "interpolate_position_embeddings",
           "torchvision's interpolate_embeddings called instead of writing the interpolation (the function the "
           "check compares with, which the notebook says not to call): right numbers, delegated",
           interp_calls_torchvision, delegates=True),
    Mutant("interp_flattened_column_major", "interpolate_position_embeddings",
           "the resized grid flattened column by column, (w h), while patches are numbered row by row",
           interp_flattened_column_major),
    Mutant("rollout_reversed_order", "attention_rollout",
           "the layers multiplied in the wrong order (rollout @ mixed): the first layer ends up leftmost",
           rollout_reversed_order),
    Mutant("rollout_no_residual", "attention_rollout",
           "the residual connection left out: only the attention is multiplied through the layers (the raw "
           "'attention flow' the rollout paper corrects)", rollout_no_residual),
    Mutant("rollout_max_over_heads", "attention_rollout", "the heads fused with their max instead of their mean",
           rollout_max_over_heads),
    Mutant("rollout_not_renormalised", "attention_rollout",
           "rows not renormalised after 0.5·A + 0.5·I: right while attention rows sum to 1, wrong after dropout",
           rollout_not_renormalised),
    Mutant("rollout_last_layer_only", "attention_rollout", "only the last layer's mixed attention, no product",
           rollout_last_layer_only),
    Mutant("rollout_per_head", "attention_rollout",
           "each head rolled out separately and the rollouts averaged, instead of averaging each layer's heads first",
           rollout_per_head),
    Mutant("rollout_no_shape_check", "attention_rollout",
           "no check of the shape the exercise states: a stack without a batch axis comes back as a wrong rollout",
           rollout_no_shape_check),
]
