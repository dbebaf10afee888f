"""solutions.cnn: the CNN baseline and the one training loop that chapter 5's ViT and CNN share."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from solutions.cnn import SmallCNN, evaluate, fit, parameter_groups, random_shift, warmup_cosine


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one thread avoids OpenMP overhead on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def two_halves(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Class 0 is bright in the top half, class 1 in the bottom half: any working model separates them."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 2
    images = 0.2 * torch.rand(n, 1, 8, 8, generator=gen)
    images[labels == 0, :, :4] += 0.8
    images[labels == 1, :, 4:] += 0.8
    return images, labels


class Recorder(nn.Module):
    """A linear classifier that remembers every batch it was trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 2)
        self.seen: list[torch.Tensor] = []

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen.append(images.clone())
        return self.linear(images.flatten(1))


@pytest.mark.parametrize("channels, size", [(1, 8), (3, 12)])
def test_small_cnn_logits_shape_and_grad_reaches_every_parameter(channels, size):
    torch.manual_seed(0)
    model = SmallCNN(channels, 10, channels=8)
    logits = model(torch.randn(4, channels, size, size))
    assert logits.shape == (4, 10)
    logits.square().sum().backward()
    assert [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0] == []


def test_small_cnn_is_translation_equivariant_before_pooling():
    # The first convolution commutes with a shift (away from the border): locality and weight sharing.
    torch.manual_seed(0)
    conv = SmallCNN(1, 10, channels=4).features[0]
    image = torch.zeros(1, 1, 8, 8)
    image[0, 0, 2:4, 2:4] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    shifted = torch.roll(image, shifts=(2, 1), dims=(2, 3))
    with torch.no_grad():
        torch.testing.assert_close(conv(shifted), torch.roll(conv(image), shifts=(2, 1), dims=(2, 3)))


def test_small_cnn_rejects_bad_sizes():
    with pytest.raises(ValueError, match="channels must be a positive integer"):
        SmallCNN(1, 10, channels=0)


def test_random_shift_moves_each_image_by_at_most_one_pixel():
    images = torch.arange(2 * 3 * 5 * 5, dtype=torch.float32).reshape(2, 3, 5, 5) + 1
    shifted = random_shift(images, torch.Generator().manual_seed(0))
    padded = F.pad(images, (1, 1, 1, 1))
    for b in range(2):
        candidates = [padded[b, :, dy:dy + 5, dx:dx + 5] for dy in range(3) for dx in range(3)]
        assert any(torch.equal(shifted[b], c) for c in candidates), f"image {b} is not a ±1-pixel shift"
    assert not torch.equal(random_shift(images, torch.Generator().manual_seed(1)),
                           random_shift(images, torch.Generator().manual_seed(2)))


def test_warmup_cosine_rises_then_falls_to_zero():
    factors = [warmup_cosine(step, 10, 100) for step in range(101)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(1.0) and factors[100] == pytest.approx(0.0)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:]))


def test_parameter_groups_do_not_decay_biases_norms_cls_or_positions():
    from solutions.vit import VisionTransformer

    model = VisionTransformer(8, 2, 1, 10, 16, 1, 2, 32)
    decay, no_decay = parameter_groups(model, 0.05)
    names = {id(p): name for name, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    decayed = {names[id(p)] for p in decay["params"]}
    assert {names[id(p)] for p in no_decay["params"]} >= {"cls_token", "position_embedding", "norm.weight", "head.bias"}
    assert {"patch_embedding.weight", "head.weight", "layers.0.feed_forward.linear1.weight"} <= decayed
    assert not decayed & {"cls_token", "position_embedding"} and all(p.dim() >= 2 for p in decay["params"])


def test_fit_same_seed_same_batches_for_any_model():
    images, labels = two_halves(40)
    first, second = Recorder(), Recorder()
    fit(first, images, labels, steps=7, batch_size=16, seed=3, progress=False)
    torch.manual_seed(99)  # the model's own randomness must not change the data it sees
    fit(second, images, labels, steps=7, batch_size=16, seed=3, progress=False)
    assert len(first.seen) == 7 and all(torch.equal(a, b) for a, b in zip(first.seen, second.seen))
    other = Recorder()
    fit(other, images, labels, steps=7, batch_size=16, seed=4, progress=False)
    assert not all(torch.equal(a, b) for a, b in zip(first.seen, other.seen))


def test_fit_uses_whole_batches_only():
    images, labels = two_halves(40)
    model = Recorder()
    losses = fit(model, images, labels, steps=5, batch_size=16, progress=False)
    assert len(losses) == 5 and {len(batch) for batch in model.seen} == {16}
    assert not model.training  # left in eval mode, ready for evaluate


def test_fit_learns_a_separable_problem():
    torch.manual_seed(0)
    images, labels = two_halves(64)
    model = SmallCNN(1, 2, channels=8)
    losses = fit(model, images, labels, steps=40, batch_size=16, lr=3e-3, progress=False)
    assert losses[-1] < losses[0]
    test_images, test_labels = two_halves(32, seed=1)
    assert evaluate(model, test_images, test_labels) == 1.0


def test_evaluate_is_the_fraction_of_correct_argmax():
    class Fixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dummy = nn.Parameter(torch.zeros(1))

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return torch.stack([images[:, 0, 0, 0], -images[:, 0, 0, 0]], dim=-1)  # class 0 iff pixel > 0

    images = torch.tensor([1.0, -1.0, 2.0, -3.0, 0.5]).reshape(5, 1, 1, 1)
    labels = torch.tensor([0, 1, 1, 1, 1])
    assert evaluate(Fixed(), images, labels, batch_size=2) == pytest.approx(3 / 5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=0), "steps must be a positive integer"),
    (dict(steps=2, batch_size=0), "batch_size must be a positive integer"),
    (dict(steps=2, warmup_fraction=1.0), r"warmup_fraction must be in \[0, 1\)"),
    (dict(steps=2, label_smoothing=-0.1), r"label_smoothing must be in \[0, 1\)"),
])
def test_fit_rejects_bad_arguments(kwargs, message):
    images, labels = two_halves(8)
    with pytest.raises(ValueError, match=message):
        fit(Recorder(), images, labels, progress=False, **kwargs)


def test_fit_and_evaluate_reject_mismatched_data():
    images, labels = two_halves(8)
    with pytest.raises(ValueError, match="images must be"):
        fit(Recorder(), images, labels[:5], steps=1, progress=False)
    with pytest.raises(ValueError, match="images must be"):
        evaluate(Recorder(), images[:0], labels[:0])


def test_fit_accumulation_steps_give_the_same_training():
    """Four micro-batches of 4 whose gradients add up take the same steps as one batch of 16."""
    images, labels = two_halves(48)
    runs = []
    for accumulation in (1, 4):
        torch.manual_seed(0)
        model = Recorder()
        losses = fit(model, images, labels, steps=6, batch_size=16, seed=1, progress=False,
                     accumulation_steps=accumulation)
        runs.append((losses, model.linear.weight.detach().clone(), model.seen))
    (losses_one, weight_one, seen_one), (losses_four, weight_four, seen_four) = runs
    assert [len(b) for b in seen_four] == [4] * 24 and torch.equal(torch.cat(seen_four[:4]), seen_one[0])
    torch.testing.assert_close(torch.tensor(losses_four), torch.tensor(losses_one), rtol=1e-6, atol=0)
    torch.testing.assert_close(weight_four, weight_one, rtol=0, atol=1e-6)


def test_fit_rejects_a_batch_that_does_not_split_into_micro_batches():
    images, labels = two_halves(40)
    with pytest.raises(ValueError, match=r"--batch-size 16 cannot be split into 1 process\(es\) x 3 accumulation "
                                         r"step\(s\) = 3 equal micro-batches; use a multiple of 3, e.g. 18 or 15"):
        fit(Recorder(), images, labels, steps=1, batch_size=16, accumulation_steps=3, progress=False)


def _fit_on_a_fake_clock(monkeypatch, step_seconds, **kwargs) -> tuple[list[float], list[tuple[int, int]]]:
    """``cnn.fit`` on two_halves(64) with a clock whose n-th reading (0: the start, then one per step) advances by
    ``step_seconds(n)``: its losses and the (step, total) the cosine schedule was asked for at each step."""
    import types

    import solutions.cnn as cnn

    clock, calls = [0.0], [0]

    def tick() -> float:
        clock[0] += step_seconds(calls[0])
        calls[0] += 1
        return clock[0]

    monkeypatch.setattr(cnn, "time", types.SimpleNamespace(perf_counter=tick))
    factors = []
    real_cosine = cnn.warmup_cosine
    monkeypatch.setattr(cnn, "warmup_cosine", lambda step, warmup, total: factors.append((step, total)) or
                        real_cosine(step, warmup, total))
    images, labels = two_halves(64)
    return cnn.fit(Recorder(), images, labels, batch_size=16, progress=False, **kwargs), factors


def test_fit_time_budget_ends_the_cosine_in_time(monkeypatch):
    """A clock where every step takes 0.1 s and a budget of 10 s: after 50 steps (5 s) the 200 planned steps cannot
    fit, so the schedule is shortened to the 100 that can, and training stops there."""
    losses, factors = _fit_on_a_fake_clock(monkeypatch, lambda n: 0.1, steps=200, time_budget=10.0)
    assert len(losses) == 100
    assert factors[-1] == (100, 100)  # the learning rate reached the end of the cosine at the last step
    images, labels = two_halves(64)
    with pytest.raises(ValueError, match="time_budget must be a number of seconds > 0"):
        fit(Recorder(), images, labels, steps=2, time_budget=0, progress=False)


def test_fit_time_budget_estimated_again_lengthens_after_a_slow_start(monkeypatch):
    """The first 50 steps take 0.2 s each, the next 0.1 s: the 100 planned steps take 15 s and fit a budget of 16 s.
    The first estimate (0.2 s a step: 80 steps) is revised as the pace improves, and every planned step is trained,
    the cosine ending at the last one."""
    losses, factors = _fit_on_a_fake_clock(monkeypatch, lambda n: 0.2 if n <= 50 else 0.1, steps=100,
                                           time_budget=16.0)
    totals = [total for _, total in factors]
    assert len(losses) == 100 and totals[-1] == 100
    assert min(totals) == 80  # what the first 50 steps alone promised
