"""Chapter 5 — the Vision Transformer (ViT).

An image becomes a sequence: cut it into non-overlapping p×p patches (row-major
order), flatten each patch to p·p·channels numbers, project each to d_model
with one shared linear map — the same thing as a convolution with
kernel = stride = p — prepend a learned [CLS] token, add learned 1-D position
embeddings, run a pre-norm Transformer encoder and classify from the [CLS]
output (``pool="cls"``) or from the mean of the patch tokens' outputs
(``pool="mean"``, as SimpleViT and timm's ``global_pool="avg"`` do). With the
ViT-B/16 sizes this module has exactly the parameters of
``torchvision.models.vit_b_16`` and ``from_torchvision`` copies them over.
:func:`attention_rollout` (Abnar & Zuidema, 2020) follows attention through
every layer and its residual connection.

The position embeddings are a table with one row per patch of the training
image size (ViT's ``max_len``): another image size needs them interpolated on
the 2-D grid of patches, which ``interpolate_position_embeddings`` does the way
torchvision does (bicubic, corners aligned).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from jaxtyping import Float
from torch import Tensor, nn

from solutions.multihead import MultiHeadAttention


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def patchify(
    images: Float[Tensor, "batch channels height width"], patch_size: int
) -> Float[Tensor, "batch patch patch_values"]:
    """Cut images into row-major ``patch_size``² patches, each flattened as ``(p1 p2 channels)``."""
    if images.dim() != 4:
        raise ValueError(f"images must be (batch, channels, height, width); got shape {tuple(images.shape)}")
    if patch_size < 1:
        raise ValueError(f"patch_size must be a positive integer; got {patch_size}")
    height, width = images.shape[-2:]
    if height % patch_size or width % patch_size:
        common = sorted(set(_divisors(height)) & set(_divisors(width)))
        raise ValueError(
            f"patch_size={patch_size} does not divide the image size {height}×{width}; "
            f"pick patch_size from {common}"
        )
    return rearrange(
        images, "batch channels (h p1) (w p2) -> batch (h w) (p1 p2 channels)", p1=patch_size, p2=patch_size
    )


def patch_embedding_from_conv(conv: nn.Conv2d) -> nn.Linear:
    """A Linear on :func:`patchify`'s ``(p1 p2 channels)`` patches computing what the patch convolution ``conv`` does."""
    if not isinstance(conv, nn.Conv2d):
        raise ValueError(f"conv must be an nn.Conv2d; got {type(conv).__name__}")
    p1, p2 = conv.kernel_size
    if p1 != p2 or conv.stride != conv.kernel_size or conv.padding not in ((0, 0), "valid") \
            or conv.dilation != (1, 1) or conv.groups != 1:
        raise ValueError(
            "conv must be a patch embedding, Conv2d(kernel_size=stride=patch, padding=0) with a square kernel, "
            f"no dilation or groups; got kernel_size={conv.kernel_size}, stride={conv.stride}, "
            f"padding={conv.padding}, dilation={conv.dilation}, groups={conv.groups}"
        )
    weight = conv.weight
    linear = nn.Linear(conv.in_channels * p1 * p2, conv.out_channels, bias=conv.bias is not None,
                       device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        # Conv2d weight (d_model, channels, p1, p2) → one row per output feature, in patchify's order.
        linear.weight.copy_(rearrange(weight, "d_model channels p1 p2 -> d_model (p1 p2 channels)"))
        if conv.bias is not None:
            linear.bias.copy_(conv.bias)
    return linear


def add_cls_and_positions(
    tokens: Float[Tensor, "batch patch d_model"],
    cls_token: Float[Tensor, "1 1 d_model"],
    position_embedding: Float[Tensor, "1 seq d_model"],
) -> Float[Tensor, "batch seq d_model"]:
    """Prepend ``cls_token`` to every sequence of the batch, then add one position vector per token ([CLS]'s first)."""
    if tokens.dim() != 3:
        raise ValueError(f"tokens must be (batch, n_patches, d_model); got shape {tuple(tokens.shape)}")
    batch, n_patches, d_model = tokens.shape
    if tuple(cls_token.shape) != (1, 1, d_model):
        raise ValueError(f"cls_token must be (1, 1, d_model={d_model}); got shape {tuple(cls_token.shape)}")
    if tuple(position_embedding.shape) != (1, n_patches + 1, d_model):
        raise ValueError(
            f"position_embedding must be (1, 1 + n_patches, d_model) = (1, {n_patches + 1}, {d_model}); got shape "
            f"{tuple(position_embedding.shape)}. At another image size, interpolate the position embeddings "
            "to the new grid first (interpolate_position_embeddings)"
        )
    cls = repeat(cls_token, "1 1 d_model -> batch 1 d_model", batch=batch)
    return torch.cat([cls, tokens], dim=1) + position_embedding


def interpolate_position_embeddings(
    position_embedding: Float[Tensor, "1 seq d_model"], grid_size: int
) -> Float[Tensor, "1 new_seq d_model"]:
    """Resize the patch positions to a ``grid_size``×``grid_size`` grid (bicubic, corners aligned); [CLS]'s is kept."""
    if position_embedding.dim() != 3 or position_embedding.shape[0] != 1:
        raise ValueError(
            f"position_embedding must be (1, 1 + n_patches, d_model); got shape {tuple(position_embedding.shape)}"
        )
    if not isinstance(grid_size, int) or grid_size < 1:
        raise ValueError(f"grid_size must be a positive integer (patches along one side); got {grid_size!r}")
    n_patches = position_embedding.shape[1] - 1
    side = math.isqrt(max(n_patches, 0))
    if n_patches < 1 or side * side != n_patches:
        raise ValueError(
            f"position_embedding must hold [CLS] then a square grid of patch positions; got {n_patches} patch "
            "positions, which is not a square number"
        )
    cls, patches = position_embedding[:, :1], position_embedding[:, 1:]
    # The 1-D table is a row-major grid: put d_model first so that each feature is one 2-D image to resize.
    grid = rearrange(patches, "1 (h w) d_model -> 1 d_model h w", h=side)
    resized = F.interpolate(grid, size=(grid_size, grid_size), mode="bicubic", align_corners=True)
    return torch.cat([cls, rearrange(resized, "1 d_model h w -> 1 (h w) d_model")], dim=1)


POOLS = ("cls", "mean")


@dataclass(frozen=True)
class ViTConfig:
    image_size: int  # side of the square input image, in pixels
    patch_size: int  # side of one square patch; must divide image_size
    in_channels: int  # 1 for grey, 3 for RGB
    n_classes: int  # size of the classification head
    d_model: int  # width of every token
    n_layers: int  # number of encoder layers
    n_heads: int  # attention heads per layer; must divide d_model
    d_ff: int  # hidden width of the feed-forward network in each layer (4·d_model in ViT-B)
    dropout: float = 0.0  # after the embeddings, attention and feed-forward (not on attention weights)
    pool: str = "cls"  # what the head reads: "cls" = the [CLS] token's output, "mean" = the patch tokens' mean

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size", "in_channels", "n_classes", "d_model", "n_layers", "n_heads", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size={self.image_size} is not divisible by patch_size={self.patch_size}; "
                f"pick patch_size from {_divisors(self.image_size)}"
            )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"pick n_heads from {_divisors(self.d_model)}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout}")
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {POOLS}; got {self.pool!r}")

    @property
    def grid_size(self) -> int:
        """Patches along one side of the image."""
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.grid_size**2

    @property
    def patch_dim(self) -> int:
        """Numbers in one flattened patch: p·p·channels."""
        return self.patch_size**2 * self.in_channels


def vit_parameter_count(
    image_size: int,
    patch_size: int,
    in_channels: int,
    n_classes: int,
    d_model: int,
    n_layers: int,
    n_heads: int,
    d_ff: int,
) -> int:
    """Parameters of ``VisionTransformer(image_size, patch_size, ...)``, by formula (no model is built)."""
    config = ViTConfig(image_size, patch_size, in_channels, n_classes, d_model, n_layers, n_heads, d_ff)
    patch_embedding = config.patch_dim * d_model + d_model
    cls_and_positions = d_model + (config.n_patches + 1) * d_model  # one position per patch and one for [CLS]
    attention = 4 * d_model * d_model + 4 * d_model  # W_Q, W_K, W_V, W_O and their biases
    feed_forward = 2 * d_model * d_ff + d_ff + d_model
    norms = 2 * 2 * d_model  # two LayerNorms per layer, each a scale and a shift
    head = 2 * d_model + d_model * n_classes + n_classes  # the final LayerNorm, then the classifier
    return patch_embedding + cls_and_positions + n_layers * (attention + feed_forward + norms) + head


class FeedForward(nn.Module):
    """The layer's feed-forward network, as torchvision's MLPBlock: ``linear2(gelu(linear1(x)))``, dropout after each
    linear layer."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.activation = nn.GELU()
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Float[Tensor, "batch seq d_model"]) -> Float[Tensor, "batch seq d_model"]:
        return self.dropout(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class EncoderLayer(nn.Module):
    """Pre-norm: x + MHA(LN(x)), then x + FFN(LN(x)), as in ViT and torchvision."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model, eps=1e-6)
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.dropout = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(d_model, eps=1e-6)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)

    def forward(self, x: Float[Tensor, "batch seq d_model"]) -> Float[Tensor, "batch seq d_model"]:
        x = x + self.dropout(self.self_attn(self.norm1(x)))
        return x + self.feed_forward(self.norm2(x))


def _renamed(name: str, value: int | None, old_name: str, old_value: int | None) -> int:
    """The value of the keyword ``name``, given as itself or under its former name ``old_name`` (deprecated)."""
    if old_value is None:
        if value is None:
            raise TypeError(f"missing the argument {name}")
        return value
    if value is not None:
        raise TypeError(f"give {name} only: {old_name} is its former name")
    warnings.warn(f"{old_name} is deprecated and will be removed: call it {name}", DeprecationWarning, stacklevel=3)
    return old_value


class VisionTransformer(nn.Module):
    """ViT: patch embedding, [CLS] token, learned positions, pre-norm encoder, head on [CLS] (or the patches' mean)."""

    def __init__(
        self,
        image_size: int,
        patch_size: int,
        in_channels: int,
        n_classes: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_ff: int | None = None,
        dropout: float = 0.0,
        *,
        pool: str = "cls",
        d_mlp: int | None = None,
    ) -> None:
        super().__init__()
        d_ff = _renamed("d_ff", d_ff, "d_mlp", d_mlp)  # d_mlp: the name until this release
        config = ViTConfig(image_size, patch_size, in_channels, n_classes, d_model, n_layers, n_heads, d_ff, dropout,
                           pool)
        self.config = config
        # A shared linear map on flattened patches == Conv2d(kernel=stride=patch_size).
        self.patch_embedding = nn.Linear(config.patch_dim, d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        # Small, as in ViT and torchvision: std 1 would drown the patch embeddings at the start of training.
        self.position_embedding = nn.Parameter(torch.empty(1, config.n_patches + 1, d_model).normal_(std=0.02))
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(EncoderLayer(d_model, n_heads, d_ff, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model, eps=1e-6)
        self.head = nn.Linear(d_model, n_classes)

    def _check_images(self, images: Tensor) -> None:
        c = self.config
        expected = (c.in_channels, c.image_size, c.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"images must be (batch, {c.in_channels}, {c.image_size}, {c.image_size}); "
                f"got shape {tuple(images.shape)}; for another image size use model.for_image_size(size)"
            )

    def embed(self, images: Float[Tensor, "batch channels height width"]) -> Float[Tensor, "batch seq d_model"]:
        """Patch embeddings with [CLS] prepended and positions added: the encoder's input."""
        self._check_images(images)
        tokens = self.patch_embedding(patchify(images, self.config.patch_size))
        return self.dropout(add_cls_and_positions(tokens, self.cls_token, self.position_embedding))

    def forward(self, images: Float[Tensor, "batch channels height width"]) -> Float[Tensor, "batch n_classes"]:
        """Class logits from the encoder's output, after the final norm: [CLS]'s, or the mean of the patch tokens'."""
        x = self.embed(images)
        for layer in self.layers:
            x = layer(x)
        x = self.norm(x)
        return self.head(x[:, 0] if self.config.pool == "cls" else x[:, 1:].mean(dim=1))

    @torch.no_grad()
    def attention_weights(
        self, images: Float[Tensor, "batch channels height width"]
    ) -> Float[Tensor, "layers batch heads seq seq"]:
        """Every layer's attention weights over the tokens ([CLS] first), as the forward pass computes them."""
        x = self.embed(images)
        weights = []
        for layer in self.layers:
            weights.append(layer.self_attn.attention_weights(layer.norm1(x)))
            x = layer(x)
        return torch.stack(weights)

    @torch.no_grad()
    def attention_maps(
        self, images: Float[Tensor, "batch channels height width"]
    ) -> Float[Tensor, "batch layers heads height width"]:
        """How much [CLS] attends to each patch, per layer and head, laid out on the patch grid."""
        from_cls = self.attention_weights(images)[:, :, :, 0, 1:]
        return rearrange(from_cls, "layers batch heads (h w) -> batch layers heads h w", h=self.config.grid_size)

    def for_image_size(self, image_size: int) -> "VisionTransformer":
        """A copy for ``image_size`` images: the same weights, the position embeddings interpolated to the new grid."""
        c = self.config
        other = VisionTransformer(image_size, c.patch_size, c.in_channels, c.n_classes, c.d_model, c.n_layers,
                                  c.n_heads, c.d_ff, c.dropout, pool=c.pool)
        other = other.to(device=self.position_embedding.device, dtype=self.position_embedding.dtype)
        state = self.state_dict()
        state["position_embedding"] = interpolate_position_embeddings(
            self.position_embedding.detach(), other.config.grid_size
        )
        other.load_state_dict(state)
        return other.train(self.training)

    @classmethod
    def from_torchvision(cls, model: nn.Module) -> "VisionTransformer":
        """An equivalent model with the weights of a ``torchvision.models.VisionTransformer`` copied."""
        conv = getattr(model, "conv_proj", None)
        if not isinstance(conv, nn.Conv2d) or not hasattr(model, "encoder") or not hasattr(model, "heads"):
            raise ValueError(
                f"model must be a torchvision.models.VisionTransformer with a plain conv_proj; got {type(model).__name__}"
            )
        if len(model.heads) != 1:
            raise ValueError("model has a representation layer (representation_size); only a single head is supported")
        layers = list(model.encoder.layers)
        if not layers:
            raise ValueError("model has no encoder layers")
        ours = cls(
            image_size=model.image_size,
            patch_size=model.patch_size,
            in_channels=conv.in_channels,
            n_classes=model.heads.head.out_features,
            d_model=model.hidden_dim,
            n_layers=len(layers),
            n_heads=layers[0].num_heads,
            d_ff=model.mlp_dim,
            dropout=model.dropout,
        ).to(device=conv.weight.device, dtype=conv.weight.dtype)
        # Our submodule -> torchvision's, in every layer (their MLPBlock is a Sequential: Linear at 0 and 3).
        layer_names = {"norm1": "ln_1", "norm2": "ln_2", "feed_forward.linear1": "mlp.0", "feed_forward.linear2": "mlp.3"}
        with torch.no_grad():
            ours.patch_embedding.load_state_dict(patch_embedding_from_conv(conv).state_dict())
            ours.cls_token.copy_(model.class_token)
            ours.position_embedding.copy_(model.encoder.pos_embedding)
            for layer, theirs in zip(ours.layers, layers):
                for name, their_name in layer_names.items():
                    layer.get_submodule(name).load_state_dict(theirs.get_submodule(their_name).state_dict())
                layer.self_attn.load_state_dict(MultiHeadAttention.from_torch(theirs.self_attention).state_dict())
            ours.norm.load_state_dict(model.encoder.ln.state_dict())
            ours.head.load_state_dict(model.heads.head.state_dict())
        return ours


def attention_rollout(attentions: Float[Tensor, "layers batch heads seq seq"]) -> Float[Tensor, "batch seq seq"]:
    """Abnar & Zuidema's rollout: each layer's heads averaged and mixed half and half with the identity (the residual
    connection), rows renormalised to 1; the product over the layers, the last one on the left."""
    if attentions.dim() != 5 or attentions.shape[-1] != attentions.shape[-2]:
        raise ValueError(f"attentions must be (layers, batch, heads, seq, seq); got shape {tuple(attentions.shape)}")
    seq = attentions.shape[-1]
    identity = torch.eye(seq, dtype=attentions.dtype, device=attentions.device)
    rollout = identity.expand(attentions.shape[1], seq, seq)
    for layer in attentions:
        mixed = 0.5 * layer.mean(dim=1) + 0.5 * identity
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = mixed @ rollout  # the information of layer l's tokens is a mix of layer l-1's
    return rollout

