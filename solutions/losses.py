"""Chapter 4 — label-smoothed cross-entropy.

Instead of a one-hot target, train towards

    q = (1 - ε) · onehot(y) + ε / V

and minimise the cross-entropy ``-Σ_v q_v · log p_v``. The model is never
asked to be 100% sure: perplexity gets worse, BLEU and calibration better.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor


def _check_smoothing_args(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int | None) -> None:
    """ValueError unless ``logits`` is ``(..., vocab)`` over ``target``'s shape, ``target`` holds class ids in
    ``[0, vocab)`` wherever it is not ``ignore_index`` (PyTorch's -100, a padding id...) and ``epsilon`` is in [0, 1]."""
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1]; got {epsilon}")
    if logits.dim() < 1 or logits.shape[:-1] != target.shape:
        raise ValueError(
            f"logits must be (..., vocab) with ... = target's shape; got logits {tuple(logits.shape)} "
            f"and target {tuple(target.shape)}"
        )
    if target.is_floating_point() or target.dtype == torch.bool:
        raise ValueError(f"target must hold integer class ids; got dtype {target.dtype}")
    kept = target if ignore_index is None else target[target != ignore_index]
    vocab = logits.shape[-1]
    if kept.numel() and (kept.min() < 0 or kept.max() >= vocab):
        raise ValueError(f"target holds ids in [{int(kept.min())}, {int(kept.max())}], outside [0, {vocab}) "
                         f"(ignore_index={ignore_index})")


def label_smoothed_cross_entropy(
    logits: Float[Tensor, "... vocab"],
    target: Int[Tensor, "..."],
    epsilon: float = 0.1,
    ignore_index: int | None = None,
) -> Float[Tensor, ""]:
    """Mean over the non-ignored positions; equal to ``F.cross_entropy(..., label_smoothing=epsilon)``."""
    _check_smoothing_args(logits, target, epsilon, ignore_index)
    vocab = logits.shape[-1]
    logits, target = logits.reshape(-1, vocab), target.reshape(-1)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    safe_target = target.masked_fill(~keep, 0)  # any valid id (ignore_index may be -100): these rows are dropped
    smoothed = (1.0 - epsilon) * F.one_hot(safe_target, vocab).to(logits.dtype) + epsilon / vocab
    loss = -(smoothed * F.log_softmax(logits, dim=-1)).sum(dim=-1)
    # 0/0 = nan when every position is ignored, as F.cross_entropy gives.
    return loss[keep].sum() / keep.sum()
