"""solutions.losses against F.cross_entropy(label_smoothing=ε)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from solutions.losses import label_smoothed_cross_entropy


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 4, 6)])
@pytest.mark.parametrize("vocab", [2, 11])
@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("ignore_index", [None, 0, -100])
def test_label_smoothed_cross_entropy_matches_torch(shape, vocab, epsilon, ignore_index):
    gen = torch.Generator().manual_seed(hash((shape, vocab)) % 1000)
    logits = torch.randn(*shape, vocab, generator=gen, dtype=torch.float64) * 3
    target = torch.randint(0, vocab, shape, generator=gen)
    if ignore_index is not None:
        target.view(-1)[::3] = ignore_index
        target.view(-1)[1] = 1  # keep at least one position
    expected = F.cross_entropy(
        logits.reshape(-1, vocab), target.reshape(-1), label_smoothing=epsilon,
        **({} if ignore_index is None else {"ignore_index": ignore_index}),
    )
    got = label_smoothed_cross_entropy(logits, target, epsilon, ignore_index)
    torch.testing.assert_close(got, expected)


def test_label_smoothed_cross_entropy_gradient_matches_torch():
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 9, requires_grad=True)
    target = torch.randint(0, 9, (4, 6))
    target[:, -2:] = 0
    label_smoothed_cross_entropy(logits, target, 0.1, ignore_index=0).backward()
    ours = logits.grad.clone()
    logits.grad = None
    F.cross_entropy(logits.reshape(-1, 9), target.reshape(-1), label_smoothing=0.1, ignore_index=0).backward()
    torch.testing.assert_close(ours, logits.grad)


def test_label_smoothed_cross_entropy_minimum_is_the_smoothed_target():
    """The loss is minimised by p = (1-ε)·onehot + ε/V, not by the one-hot itself."""
    vocab, epsilon = 5, 0.1
    target = torch.tensor([2])
    smoothed = torch.full((vocab,), epsilon / vocab)
    smoothed[2] += 1 - epsilon
    at_smoothed = label_smoothed_cross_entropy(smoothed.log()[None], target, epsilon)
    sharper = torch.zeros(vocab)
    sharper[2] = 10.0
    assert at_smoothed < label_smoothed_cross_entropy(sharper[None], target, epsilon)
    entropy = -(smoothed * smoothed.log()).sum()
    torch.testing.assert_close(at_smoothed, entropy)


def test_label_smoothed_cross_entropy_all_ignored_is_nan_like_torch():
    logits, target = torch.randn(3, 4), torch.zeros(3, dtype=torch.long)
    expected = F.cross_entropy(logits, target, label_smoothing=0.1, ignore_index=0)
    got = label_smoothed_cross_entropy(logits, target, 0.1, ignore_index=0)
    assert torch.isnan(expected) and torch.isnan(got)


@pytest.mark.parametrize("logits, target, kwargs, name", [
    (torch.randn(3, 4), torch.zeros(3, dtype=torch.long), dict(epsilon=1.5), "epsilon"),
    (torch.randn(3, 4), torch.zeros(3, dtype=torch.long), dict(epsilon=-0.1), "epsilon"),
    (torch.randn(3, 4), torch.zeros(2, dtype=torch.long), {}, "logits"),
    (torch.randn(3, 4), torch.zeros(3), {}, "target"),
    (torch.randn(3, 4), torch.tensor([0, 1, 4]), {}, "target"),
])
def test_label_smoothed_cross_entropy_rejects_bad_arguments(logits, target, kwargs, name):
    with pytest.raises(ValueError, match=name):
        label_smoothed_cross_entropy(logits, target, **kwargs)
