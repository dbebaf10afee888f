"""solutions.data.shapes: the generated colour shapes of chapter 5 are deterministic, balanced, and need colour."""

from __future__ import annotations

import pytest
import torch

from solutions.data.shapes import CLASSES, COLOURS, SHAPES, load_shapes


def test_shapes_splits_are_deterministic_and_disjoint():
    train, labels = load_shapes("train")
    again, labels_again = load_shapes("train")
    assert torch.equal(train, again) and torch.equal(labels, labels_again)
    test, _ = load_shapes("test")
    assert train.shape == (5000, 3, 28, 28) and test.shape == (1000, 3, 28, 28)
    assert not torch.equal(train[:1000], test)  # another seed, other images
    assert train.dtype == torch.float32 and 0.0 <= float(train.min()) and float(train.max()) <= 1.0


def test_shapes_classes_are_balanced_and_named():
    _, labels = load_shapes("train")
    counts = torch.bincount(labels, minlength=len(CLASSES))
    assert len(CLASSES) == len(SHAPES) * len(COLOURS) == 10
    assert counts.min() > 400 and counts.max() < 600  # about 500 each
    assert CLASSES[0] == "red disc" and CLASSES[9] == "blue cross"


def test_shapes_colours_differ_in_hue_not_in_luminance():
    """A grey copy cannot tell the two class colours apart; the colour channels can."""
    luminance = {name: 0.299 * r + 0.587 * g + 0.114 * b for name, (r, g, b) in COLOURS.items()}
    assert abs(luminance["red"] - luminance["blue"]) < 0.01
    images, labels = load_shapes("test")
    # The pixels where the shape is drawn: far from the background's dull colours in the red - blue difference.
    red_minus_blue = images[:, 0] - images[:, 2]
    strongest = red_minus_blue.flatten(1).abs().amax(1)
    assert (strongest > 0.4).float().mean() > 0.95
    is_red = labels % 2 == 0
    sign = red_minus_blue.flatten(1).gather(1, red_minus_blue.flatten(1).abs().argmax(1, keepdim=True))[:, 0]
    assert ((sign > 0) == is_red).float().mean() > 0.95


def test_shapes_rejects_an_unknown_split():
    with pytest.raises(ValueError, match="split"):
        load_shapes("validation")
