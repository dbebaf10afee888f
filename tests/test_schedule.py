"""solutions.schedule: the Noam formula, its shape, and the LambdaLR wiring."""

from __future__ import annotations

import math

import pytest
import torch

from solutions.schedule import noam_lr, noam_scheduler


@pytest.mark.parametrize("d_model, warmup, factor", [(512, 4000, 1.0), (128, 200, 2.0), (64, 1, 0.5)])
def test_noam_lr_formula(d_model, warmup, factor):
    for step in (1, 2, warmup // 2 + 1, warmup, warmup + 1, 10 * warmup):
        expected = factor / math.sqrt(d_model) * min(1 / math.sqrt(step), step / warmup**1.5)
        assert noam_lr(step, d_model, warmup, factor) == pytest.approx(expected, rel=1e-12)
    assert noam_lr(0, d_model, warmup, factor) == noam_lr(1, d_model, warmup, factor)


def test_noam_lr_warmup_then_decay():
    lrs = [noam_lr(s, 512, 4000) for s in range(1, 20001)]
    peak = max(range(len(lrs)), key=lrs.__getitem__) + 1
    assert peak == 4000
    assert lrs[3999] == pytest.approx((512 * 4000) ** -0.5)  # the peak: (d_model · warmup)^-0.5
    assert all(a < b for a, b in zip(lrs[:3999], lrs[1:4000]))  # linear rise
    assert all(a > b for a, b in zip(lrs[4000:], lrs[4001:]))  # inverse-sqrt decay
    assert lrs[15999] == pytest.approx(lrs[3999] / 2)  # 4x the steps after the peak = half the lr


@pytest.mark.parametrize("warmup, factor", [(10, 1.0), (50, 3.0)])
def test_noam_scheduler_sets_noam_lr(warmup, factor):
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.Adam([param], lr=1.0)
    scheduler = noam_scheduler(optimizer, 64, warmup, factor)
    for step in range(0, 120):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(noam_lr(step, 64, warmup, factor), rel=1e-12)
        param.grad = torch.ones(3)
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize("kwargs, name", [
    (dict(step=-1, d_model=8, warmup=4), "step"),
    (dict(step=1, d_model=0, warmup=4), "d_model"),
    (dict(step=1, d_model=8, warmup=0), "warmup"),
    (dict(step=1, d_model=8, warmup=4, factor=0.0), "factor"),
    (dict(step=1.5, d_model=8, warmup=4), "step"),
])
def test_noam_lr_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        noam_lr(**kwargs)


def test_noam_scheduler_rejects_bad_arguments():
    param = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="lr=1.0"):
        noam_scheduler(torch.optim.Adam([param], lr=1e-3), 64, 10)
    with pytest.raises(ValueError, match="warmup"):
        noam_scheduler(torch.optim.Adam([param], lr=1.0), 64, 0)
    with pytest.raises(ValueError, match="optimizer"):
        noam_scheduler("adam", 64, 10)  # type: ignore[arg-type]
