"""Chapter 4 — the Noam learning-rate schedule.

    lr(step) = factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)

A linear warm-up for ``warmup`` steps (Adam's second-moment estimates are poor
at first, and a post-norm Transformer diverges without it), then an
inverse-square-root decay. The peak, at ``step = warmup``, is
``factor · (d_model · warmup)^-0.5``.
"""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def _check_noam_args(d_model: int, warmup: int, factor: float) -> None:
    for name, value in (("d_model", d_model), ("warmup", warmup)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")
    if not factor > 0:
        raise ValueError(f"factor must be > 0; got {factor!r}")


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The learning rate at ``step`` (step 0 is taken as 1, so the first update is not zero)."""
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be a non-negative int; got {step!r}")
    _check_noam_args(d_model, warmup, factor)
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def noam_scheduler(optimizer: Optimizer, d_model: int, warmup: int, factor: float = 1.0) -> LambdaLR:
    """A ``LambdaLR`` that sets the learning rate to ``noam_lr(step, …)``; make the optimizer with ``lr=1.0``.

    LambdaLR multiplies each group's initial lr by the lambda, so any other lr
    would silently scale the schedule.
    """
    if not isinstance(optimizer, Optimizer):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer; got {type(optimizer).__name__}")
    _check_noam_args(d_model, warmup, factor)
    for i, group in enumerate(optimizer.param_groups):
        lr = group.get("initial_lr", group["lr"])
        if lr != 1.0:
            raise ValueError(
                f"param group {i} has lr={lr}; make the optimizer with lr=1.0 "
                "(the schedule gives the whole learning rate; use factor to scale it)"
            )
    return LambdaLR(optimizer, lambda step: noam_lr(step, d_model, warmup, factor))
