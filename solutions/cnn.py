"""The CNN baseline of chapter 5, and the one training loop that the ViT and the CNN share.

A CNN has locality (3×3 kernels), translation equivariance (weight sharing) and
a hierarchy (pooling) built in; a ViT must learn them from data. Comparing the
two is only fair when everything but the model is the same: the same images in
the same order, the same augmentation, batch size, number of steps, optimizer
and learning-rate schedule. :func:`fit` is that one loop, used unchanged for
both (by chapter 5's notebook and by ``python -m solutions.train vit``, also
under ``torchrun``), and :func:`evaluate` the one accuracy.

This module imports nothing of the ViT, so it stays usable where chapter 5's
answers are hidden.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int64
from torch import Tensor, nn
from tqdm.auto import tqdm

from solutions.distributed import World


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
    time_budget: float | None = None,
    world: World = World(),
    accumulation_steps: int = 1,
) -> list[float]:
    """Train ``model`` for ``steps`` AdamW steps on shuffled batches; returns the loss of every step.

    The batches, their order and the random ±1-pixel shifts depend only on ``seed``,
    so two models fitted with the same arguments see exactly the same data.
    ``time_budget`` (seconds) ends training early: from step 50 on, every 10 steps,
    the mean time per step so far says how many steps fit, and the cosine is made
    to end there (never past ``steps``): a busy spell shortens it, and a faster
    pace afterwards lengthens it back. Under ``torchrun``
    (``world``, see :mod:`solutions.distributed`) every process draws the same
    batch and trains on its share of it, in ``accumulation_steps`` micro-batches.
    """
    if images.dim() != 4 or labels.shape != images.shape[:1]:
        raise ValueError(f"images must be (batch, channels, height, width) and labels (batch,); got shapes "
                         f"{tuple(images.shape)} and {tuple(labels.shape)}")
    if len(images) == 0:
        raise ValueError("images is empty: there is nothing to train on")
    for name, value in (("steps", steps), ("batch_size", batch_size), ("accumulation_steps", accumulation_steps)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    if not 0.0 <= warmup_fraction < 1.0:
        raise ValueError(f"warmup_fraction must be in [0, 1); got {warmup_fraction}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1); got {label_smoothing}")
    if time_budget is not None and not time_budget > 0:
        raise ValueError(f"time_budget must be a number of seconds > 0, or None for no limit; got {time_budget}")
    optimizer = torch.optim.AdamW(parameter_groups(model, weight_decay), lr=lr)
    # A mutable schedule: when the time budget cannot hold every step, the cosine is shortened to end in time.
    schedule = {"warmup": max(1, int(warmup_fraction * steps)), "total": steps}
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, schedule["warmup"], schedule["total"])
    )
    generator = torch.Generator().manual_seed(seed)
    batch_size = min(batch_size, len(images))
    pieces = world.micro_batches(batch_size, accumulation_steps)
    trained = world.wrap(model)
    losses: list[float] = []
    start, probe = time.perf_counter(), min(50, steps)
    trained.train()
    with tqdm(total=steps, desc=f"train {type(model).__name__}", unit="step", disable=not progress) as bar:
        while len(losses) < schedule["total"]:
            order = torch.randperm(len(images), generator=generator)
            # Whole batches only: a last batch of one image would break BatchNorm and weigh that image more.
            for start_row in range(0, len(order) - batch_size + 1, batch_size):
                index = order[start_row:start_row + batch_size]
                batch = random_shift(images[index], generator) if augment else images[index]
                optimizer.zero_grad(set_to_none=True)
                mine = _backward(trained, batch, labels[index], pieces, world, label_smoothing)
                # The mean time over the processes: the same on every process, so all stop at the same step.
                batch_loss, elapsed = world.sum(mine, time.perf_counter() - start)
                elapsed /= world.size
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                losses.append(batch_loss)
                bar.update()
                if len(losses) % 10 == 0:
                    bar.set_postfix(loss=f"{batch_loss:.4f}")
                estimate = len(losses) == probe or (len(losses) > probe and len(losses) % 10 == 0)
                if time_budget is not None and estimate:
                    _fit_to_budget(schedule, steps, len(losses), elapsed, time_budget, len(images) // batch_size,
                                   say=progress, first=len(losses) == probe)
                    bar.total = schedule["total"]
                if time_budget is not None and elapsed > time_budget:
                    schedule["total"] = len(losses)
                if len(losses) >= schedule["total"]:
                    break
    model.eval()
    return losses


def _backward(
    trained: nn.Module, images: Tensor, labels: Tensor, pieces: list[slice], world: World, label_smoothing: float
) -> float:
    """Gradients of one global batch: this process's micro-batches (``pieces``), each 1/len(pieces) of its share;
    ``DistributedDataParallel`` averages them over the processes. Returns this process's part of the batch's loss."""
    device = next(trained.parameters()).device
    mine = 0.0
    for i, rows in enumerate(pieces):
        with world.gradient_sync(trained, sync=i == len(pieces) - 1):
            logits = trained(images[rows].to(device))
            loss = F.cross_entropy(logits, labels[rows].to(device), label_smoothing=label_smoothing)
            (loss / len(pieces)).backward()
        mine += loss.item() / (len(pieces) * world.size)
    return mine


def _fit_to_budget(schedule: dict, planned: int, step: int, seconds: float, time_budget: float,
                   steps_per_epoch: int, *, say: bool, first: bool) -> None:
    """After ``step`` steps in ``seconds``: end the cosine at the last step the time budget holds at the mean pace
    so far, between ``step`` and the ``planned`` steps. Estimated again and again, not once: a run whose first 50
    steps went at half its later pace (the machine busy at its start) was cut to half its epochs by the first
    estimate alone."""
    affordable = max(step, min(planned, int(time_budget / (seconds / step))))
    if first and affordable < planned:  # the first estimate also shortens the warm-up
        schedule["warmup"] = min(schedule["warmup"], max(1, affordable // 10))
    if say and abs(affordable - schedule["total"]) >= steps_per_epoch:
        tqdm.write(f"time budget {time_budget:g} s: training {affordable} of {planned} steps "
                   f"({affordable / steps_per_epoch:.1f} epochs)")
    schedule["total"] = affordable


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
