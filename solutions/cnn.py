"""The CNN baseline of chapter 5, and the one training loop that the ViT and the CNN share.

A CNN has locality (3×3 kernels), translation equivariance (weight sharing) and
a hierarchy (pooling) built in; a ViT must learn them from data. Comparing the
two is only fair when everything but the model is the same: the same images in
the same order, the same augmentation, batch size, number of steps, optimizer
and learning-rate schedule. :func:`fit` is that one loop, used unchanged for
both, and :func:`evaluate` the one accuracy.

This module imports nothing of the ViT, so it stays usable where chapter 5's
answers are hidden.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int64
from torch import Tensor, nn
from tqdm.auto import tqdm


class SmallCNN(nn.Module):
    """The baseline: three 3×3 convolutions (locality and weight sharing built in), one pooling, a linear head."""

    def __init__(self, in_channels: int, n_classes: int, channels: int = 32) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("n_classes", n_classes), ("channels", channels)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.BatchNorm2d(2 * channels), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * channels, 2 * channels, 3, padding=1), nn.BatchNorm2d(2 * channels), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(2 * channels, n_classes)

    def forward(self, images: Float[Tensor, "batch channels height width"]) -> Float[Tensor, "batch n_classes"]:
        return self.head(self.features(images))


def random_shift(
    images: Float[Tensor, "batch channels height width"], generator: torch.Generator, max_shift: int = 1
) -> Float[Tensor, "batch channels height width"]:
    """Shift each image by up to ``max_shift`` pixels in each direction, filling with zeros."""
    batch, _, height, width = images.shape
    padded = F.pad(images, (max_shift,) * 4)
    dy, dx = torch.randint(0, 2 * max_shift + 1, (2, batch, 1), generator=generator)
    rows = (dy + torch.arange(height))[:, :, None]  # (batch, height, 1)
    cols = (dx + torch.arange(width))[:, None, :]  # (batch, 1, width)
    shifted = padded[torch.arange(batch)[:, None, None], :, rows, cols]  # (batch, height, width, channels)
    return shifted.permute(0, 3, 1, 2).contiguous()


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay weight matrices and kernels; not biases, norms, [CLS] or position embeddings."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        skip = param.dim() < 2 or "position_embedding" in name or "cls_token" in name
        (no_decay if skip else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """The learning-rate factor at ``step``: linear warm-up over ``warmup`` steps, then a cosine down to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def fit(
    model: nn.Module,
    images: Float[Tensor, "batch channels height width"],
    labels: Int64[Tensor, " batch"],
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 2e-3,
    weight_decay: float = 0.05,
    warmup_fraction: float = 0.1,
    label_smoothing: float = 0.1,
    augment: bool = True,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """Train ``model`` for exactly ``steps`` AdamW steps on shuffled batches; returns the loss of every step.

    The batches, their order and the random ±1-pixel shifts depend only on ``seed``,
    so two models fitted with the same arguments see exactly the same data.
    """
    if images.dim() != 4 or labels.shape != images.shape[:1]:
        raise ValueError(f"images must be (batch, channels, height, width) and labels (batch,); got shapes "
                         f"{tuple(images.shape)} and {tuple(labels.shape)}")
    if len(images) == 0:
        raise ValueError("images is empty: there is nothing to train on")
    for name, value in (("steps", steps), ("batch_size", batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    if not 0.0 <= warmup_fraction < 1.0:
        raise ValueError(f"warmup_fraction must be in [0, 1); got {warmup_fraction}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1); got {label_smoothing}")
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr)
    warmup = max(1, int(warmup_fraction * steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_cosine(step, warmup, steps))
    generator = torch.Generator().manual_seed(seed)
    batch_size = min(batch_size, len(images))
    losses: list[float] = []
    model.train()
    with tqdm(total=steps, desc=f"train {type(model).__name__}", unit="step", disable=not progress) as bar:
        while len(losses) < steps:
            order = torch.randperm(len(images), generator=generator)
            # Whole batches only: a last batch of one image would break BatchNorm and weigh that image more.
            for start in range(0, len(order) - batch_size + 1, batch_size):
                index = order[start:start + batch_size]
                batch = random_shift(images[index], generator) if augment else images[index]
                logits = model(batch.to(device))
                loss = F.cross_entropy(logits, labels[index].to(device), label_smoothing=label_smoothing)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                losses.append(loss.item())
                bar.update()
                if len(losses) == steps:
                    break
    model.eval()
    return losses


@torch.inference_mode()
def evaluate(
    model: nn.Module,
    images: Float[Tensor, "batch channels height width"],
    labels: Int64[Tensor, " batch"],
    batch_size: int = 512,
) -> float:
    """Accuracy of ``model`` (in eval mode) on ``images``: the fraction whose largest logit is the label."""
    if images.dim() != 4 or labels.shape != images.shape[:1] or len(images) == 0:
        raise ValueError(f"images must be a non-empty (batch, channels, height, width) and labels (batch,); got "
                         f"shapes {tuple(images.shape)} and {tuple(labels.shape)}")
    model.eval()
    device = next(model.parameters()).device
    correct = 0
    for start in range(0, len(images), batch_size):
        logits = model(images[start:start + batch_size].to(device))
        correct += (logits.argmax(-1).cpu() == labels[start:start + batch_size]).sum().item()
    return correct / len(images)
