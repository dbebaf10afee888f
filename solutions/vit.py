"""Chapter 5 — the Vision Transformer (ViT).

An image becomes a sequence: cut it into non-overlapping p×p patches (row-major
order), flatten each patch to p·p·channels numbers, project each to d_model
with one shared linear map — the same thing as a convolution with
kernel = stride = p — prepend a learned [CLS] token, add learned position
embeddings, run a pre-norm Transformer encoder and classify from the [CLS]
output. With the ViT-B/16 sizes this module has exactly the parameters of
``torchvision.models.vit_b_16`` and ``from_torchvision`` copies them over.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange, repeat
from einops.layers.torch import Rearrange
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


@dataclass(frozen=True)
class ViTConfig:
    image_size: int  # side of the square input image, in pixels
    patch_size: int  # side of one square patch; must divide image_size
    in_channels: int  # 1 for grey, 3 for RGB
    n_classes: int  # size of the classification head
    d_model: int  # width of every token
    n_layers: int  # number of encoder blocks
    n_heads: int  # attention heads per block; must divide d_model
    d_mlp: int  # hidden width of the MLP in each block (4·d_model in ViT-B)
    dropout: float = 0.0  # after the embeddings, attention and MLP (not on attention weights)

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size", "in_channels", "n_classes", "d_model", "n_layers", "n_heads", "d_mlp"):
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


class EncoderBlock(nn.Module):
    """Pre-norm block: x + MHA(LN(x)), then x + MLP(LN(x)), as in ViT and torchvision."""

    def __init__(self, d_model: int, n_heads: int, d_mlp: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm_attention = nn.LayerNorm(d_model, eps=1e-6)
        self.attention = MultiHeadAttention(d_model, n_heads)
        self.dropout = nn.Dropout(dropout)
        self.norm_mlp = nn.LayerNorm(d_model, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_mlp), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_mlp, d_model), nn.Dropout(dropout)
        )

    def forward(self, x: Float[Tensor, "batch seq d_model"]) -> Float[Tensor, "batch seq d_model"]:
        x = x + self.dropout(self.attention(self.norm_attention(x)))
        return x + self.mlp(self.norm_mlp(x))


class VisionTransformer(nn.Module):
    """ViT: patch embedding, [CLS] token, learned positions, pre-norm encoder, head on [CLS]."""

    def __init__(
        self,
        image_size: int,
        patch_size: int,
        in_channels: int,
        n_classes: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        d_mlp: int,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        config = ViTConfig(image_size, patch_size, in_channels, n_classes, d_model, n_layers, n_heads, d_mlp, dropout)
        self.config = config
        # A shared linear map on flattened patches == Conv2d(kernel=stride=patch_size).
        self.patchify = Rearrange(
            "batch channels (h p1) (w p2) -> batch (h w) (p1 p2 channels)", p1=patch_size, p2=patch_size
        )
        self.patch_embedding = nn.Linear(config.patch_dim, d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.position_embedding = nn.Parameter(torch.empty(1, config.n_patches + 1, d_model).normal_(std=0.02))
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(EncoderBlock(d_model, n_heads, d_mlp, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model, eps=1e-6)
        self.head = nn.Linear(d_model, n_classes)

    def _check_images(self, images: Tensor) -> None:
        c = self.config
        expected = (c.in_channels, c.image_size, c.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(
                f"images must be (batch, {c.in_channels}, {c.image_size}, {c.image_size}); "
                f"got shape {tuple(images.shape)}"
            )

    def embed(self, images: Float[Tensor, "batch channels height width"]) -> Float[Tensor, "batch seq d_model"]:
        """Patch embeddings with [CLS] prepended and positions added: the encoder's input."""
        self._check_images(images)
        patches = self.patch_embedding(self.patchify(images))
        cls = repeat(self.cls_token, "1 1 d_model -> batch 1 d_model", batch=images.shape[0])
        return self.dropout(torch.cat([cls, patches], dim=1) + self.position_embedding)

    def forward(self, images: Float[Tensor, "batch channels height width"]) -> Float[Tensor, "batch n_classes"]:
        x = self.embed(images)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])

    @torch.no_grad()
    def attention_maps(
        self, images: Float[Tensor, "batch channels height width"]
    ) -> Float[Tensor, "batch layers heads height width"]:
        """How much [CLS] attends to each patch, per layer and head, laid out on the patch grid."""
        x = self.embed(images)
        maps = []
        for block in self.blocks:
            weights = block.attention.attention_weights(block.norm_attention(x))  # (batch, heads, seq_q, seq_k)
            maps.append(weights[:, :, 0, 1:])  # from [CLS] to every patch
            x = block(x)
        return rearrange(
            torch.stack(maps, dim=1), "batch layers heads (h w) -> batch layers heads h w", h=self.config.grid_size
        )

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
            d_mlp=model.mlp_dim,
            dropout=model.dropout,
        ).to(device=conv.weight.device, dtype=conv.weight.dtype)
        with torch.no_grad():
            # Conv2d weight (d_model, channels, p1, p2) → Linear weight over the (p1 p2 channels) flattening.
            ours.patch_embedding.weight.copy_(
                rearrange(conv.weight, "d_model channels p1 p2 -> d_model (p1 p2 channels)")
            )
            ours.patch_embedding.bias.copy_(conv.bias)
            ours.cls_token.copy_(model.class_token)
            ours.position_embedding.copy_(model.encoder.pos_embedding)
            for block, theirs in zip(ours.blocks, layers):
                block.norm_attention.load_state_dict(theirs.ln_1.state_dict())
                block.attention.load_state_dict(MultiHeadAttention.from_torch(theirs.self_attention).state_dict())
                block.norm_mlp.load_state_dict(theirs.ln_2.state_dict())
                block.mlp[0].load_state_dict(theirs.mlp[0].state_dict())
                block.mlp[3].load_state_dict(theirs.mlp[3].state_dict())
            ours.norm.load_state_dict(model.encoder.ln.state_dict())
            ours.head.load_state_dict(model.heads.head.state_dict())
        return ours
