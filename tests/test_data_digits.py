"""The embedded 8×8 digits and the user .npz loader (no downloads)."""

from __future__ import annotations

import hashlib
import zipfile

import numpy as np
import pytest
import torch

from solutions.data.digits import DIGITS_FILE, load_digits, load_npz, stratified_split

DIGITS_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"


def test_digits_file_is_the_documented_one():
    assert hashlib.sha256(DIGITS_FILE.read_bytes()).hexdigest() == DIGITS_SHA256
    assert DIGITS_FILE.with_name("README_digits.md").is_file()


@pytest.mark.parametrize("split, n", [("train", 1438), ("test", 359), ("all", 1797)])
def test_load_digits_shapes_dtypes_and_range(split, n):
    images, labels = load_digits(split)
    assert images.shape == (n, 1, 8, 8) and images.dtype == torch.float32
    assert labels.shape == (n,) and labels.dtype == torch.int64
    assert images.min() == 0.0 and images.max() == 1.0
    assert set(labels.tolist()) == set(range(10))


def test_load_digits_pixels_are_multiples_of_one_sixteenth():
    images, _ = load_digits("all")
    torch.testing.assert_close(images * 16, (images * 16).round())


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_load_digits_split_is_disjoint_stratified_and_covers_all(seed):
    all_images, all_labels = load_digits("all")
    train_x, train_y = load_digits("train", seed=seed)
    test_x, test_y = load_digits("test", seed=seed)
    assert len(train_x) + len(test_x) == len(all_images)
    # Disjoint: match images by their bytes (the data set has no exact duplicates across the split).
    train_keys = {row.numpy().tobytes() for row in train_x.flatten(1)}
    test_keys = {row.numpy().tobytes() for row in test_x.flatten(1)}
    assert not train_keys & test_keys
    # Stratified: each class holds out 20% of its images, up to rounding.
    per_class = torch.bincount(all_labels, minlength=10)
    held_out = torch.bincount(test_y, minlength=10)
    assert torch.all((held_out - 0.2 * per_class).abs() <= 0.5)
    assert torch.equal(torch.bincount(train_y, minlength=10) + held_out, per_class)


def test_load_digits_is_deterministic_and_seed_dependent():
    a, b = load_digits("test", seed=0), load_digits("test", seed=0)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(load_digits("test", seed=1)[0], a[0])


def test_load_digits_rejects_unknown_split():
    with pytest.raises(ValueError, match="split must be one of"):
        load_digits("validation")


@pytest.mark.parametrize("fraction", [0.0, 1.0])
def test_stratified_split_rejects_bad_fraction(fraction):
    with pytest.raises(ValueError, match="test_fraction"):
        stratified_split(np.arange(10) % 2, fraction, seed=0)


@pytest.mark.parametrize("image_shape", [(12, 12), (3, 12, 12)])
def test_load_npz_reads_user_images(tmp_path, image_shape):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(50, *image_shape), dtype=np.uint8)
    labels = np.repeat(np.arange(5), 10)
    path = tmp_path / "mine.npz"
    np.savez(path, images=images, labels=labels)
    (train_x, train_y), (test_x, test_y) = load_npz(path)
    channels = 1 if len(image_shape) == 2 else image_shape[0]
    assert train_x.shape == (40, channels, 12, 12) and test_x.shape == (10, channels, 12, 12)
    assert train_x.dtype == torch.float32 and float(train_x.max()) <= 1.0
    assert torch.equal(torch.bincount(test_y), torch.full((5,), 2))


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"pixels": np.zeros((4, 8, 8)), "labels": np.zeros(4, dtype=int)}, r"missing array\(s\) \['images'\]"),
        ({"images": np.zeros((4, 8, 8))}, r"missing array\(s\) \['labels'\]"),
        ({"images": np.zeros((4, 64)), "labels": np.zeros(4, dtype=int)}, r"images must be \(N, C, H, W\) or \(N, H, W\)"),
        ({"images": np.zeros((4, 8, 8)), "labels": np.zeros(3, dtype=int)}, r"labels must be \(N,\) with N=4"),
        ({"images": np.zeros((4, 8, 8)), "labels": np.full(4, 0.5)}, "labels must be non-negative integers"),
        ({"images": np.zeros((4, 8, 6)), "labels": np.zeros(4, dtype=int)}, "images must be square"),
    ],
)
def test_load_npz_rejects_bad_files(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=message):
        load_npz(path)


def test_load_npz_rejects_missing_and_unreadable_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_npz(tmp_path / "absent.npz")
    (tmp_path / "text.npz").write_text("not numpy")
    with pytest.raises(ValueError, match=r"not an \.npz archive; save one with np\.savez"):
        load_npz(tmp_path / "text.npz")
    with zipfile.ZipFile(tmp_path / "damaged.npz", "w") as archive:  # a zip whose members are not arrays
        archive.writestr("images.npy", b"not an array")
        archive.writestr("labels.npy", b"not an array")
    with pytest.raises(ValueError, match="not a readable .npz file"):
        load_npz(tmp_path / "damaged.npz")
