"""Image data for chapter 5: the embedded 8×8 digits, a user's .npz or image folder, MNIST/CIFAR-10 when online.

The default, ``load_digits``, reads ``digits.csv.gz`` shipped next to this file:
the UCI "Optical Recognition of Handwritten Digits" test set (1,797 images of
8×8 pixels with values 0..16, CC BY 4.0; see README_digits.md). No download.
"""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path

import numpy as np
import torch
from jaxtyping import Float, Int64
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor

DIGITS_FILE = Path(__file__).with_name("digits.csv.gz")
DIGITS_MAX = 16.0  # each pixel counts the "on" pixels of a 4×4 block of the 32×32 bitmap
SPLITS = ("train", "test", "all")


def _read_digits_csv() -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(DIGITS_FILE, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    return table[:, :64].reshape(-1, 8, 8), table[:, 64]


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test): each class contributes round(test_fraction · its count) to test."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1); got {test_fraction}")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_test = int(round(test_fraction * len(members)))
        test.append(members[:n_test])
        train.append(members[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def load_digits(
    split: str = "train", seed: int = 0, test_fraction: float = 0.2
) -> tuple[Float[Tensor, "batch 1 8 8"], Int64[Tensor, " batch"]]:
    """The embedded digits as float images in [0, 1] and int64 labels 0..9.

    ``split`` is "train", "test" or "all"; the split is stratified by class and
    depends only on ``seed`` and ``test_fraction`` (the same on every machine).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}; got {split!r}")
    pixels, labels = _read_digits_csv()
    if split != "all":
        train, test = stratified_split(labels, test_fraction, seed)
        keep = train if split == "train" else test
        pixels, labels = pixels[keep], labels[keep]
    images = torch.from_numpy(pixels).float().div_(DIGITS_MAX).unsqueeze(1)
    return images, torch.from_numpy(labels).long()


def load_npz(
    path: str | Path, test_fraction: float = 0.2, seed: int = 0
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """A user's ``.npz`` with ``images`` (N, C, H, W) or (N, H, W) and integer ``labels`` (N,).

    Images are scaled to [0, 1] when they look like bytes (max > 1); labels must
    be 0..n_classes-1. Returns ((train_images, train_labels), (test_images, test_labels)),
    split stratified by class.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--data {path}: no such file")
    if not zipfile.is_zipfile(path):  # else np.load tries it as a pickle and suggests allow_pickle
        raise ValueError(f"--data {path}: not an .npz archive; save one with "
                         "np.savez(path, images=images, labels=labels)")
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as err:  # a zip that numpy cannot read
        raise ValueError(f"--data {path}: not a readable .npz file ({err})") from None
    missing = [key for key in ("images", "labels") if key not in archive.files]
    if missing:
        raise ValueError(
            f"--data {path}: missing array(s) {missing}; found {archive.files}. "
            "Save with np.savez(path, images=images, labels=labels)"
        )
    try:
        images, labels = archive["images"], archive["labels"]
    except ValueError as err:
        if "pickle" in str(err):  # object arrays: loading them would unpickle code from the file
            raise ValueError(f"--data {path}: 'images' and 'labels' must be numeric arrays, not object arrays "
                             "(those need pickle, which is never loaded from --data)") from None
        raise ValueError(f"--data {path}: not a readable .npz file ({err})") from None
    except Exception as err:  # a damaged member: bad zip data, truncated array
        raise ValueError(f"--data {path}: not a readable .npz file ({err})") from None
    if not (isinstance(images, np.ndarray) and isinstance(labels, np.ndarray)):  # members np.save did not write
        raise ValueError(f"--data {path}: not a readable .npz file ('images' or 'labels' is not an .npy array)")
    if images.ndim == 3:
        images = images[:, None]
    if images.ndim != 4:
        raise ValueError(f"--data {path}: images must be (N, C, H, W) or (N, H, W); got shape {images.shape}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"--data {path}: labels must be (N,) with N={images.shape[0]} like images; got shape {labels.shape}"
        )
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ValueError(f"--data {path}: labels must be non-negative integers (class ids 0..n_classes-1)")
    if images.shape[-1] != images.shape[-2]:
        raise ValueError(f"--data {path}: images must be square; got height×width {images.shape[-2]}×{images.shape[-1]}")
    if images.shape[0] < 2:
        raise ValueError(f"--data {path}: need at least 2 images; got {images.shape[0]}")
    images = images.astype(np.float32)
    if images.max() > 1.0:
        images = images / 255.0 if images.max() > 16.0 else images / images.max()
    train, test = stratified_split(labels, test_fraction, seed)
    if len(test) == 0 or len(train) == 0:
        raise ValueError(f"--data {path}: too few images per class to hold out a test split")
    x, y = torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64))
    return (x[train], y[train]), (x[test], y[test])


# torchvision's ImageFolder accepts these suffixes (case-insensitive).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")
FOLDER_LAYOUT = (
    "DIR/<class name>/<image>: one sub-folder per class, holding only images (torchvision's ImageFolder layout)"
)


def _class_files(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Sorted class folder names and every (file, class index) below them; hidden files and folders skipped."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if len(classes) < 2:
        raise ValueError(f"--data {root}: found {len(classes)} class folder{'' if len(classes) == 1 else 's'} "
                         f"{classes}; a classifier needs at least 2. Expected {FOLDER_LAYOUT}")
    files = []
    for label, name in enumerate(classes):
        members = sorted(p for p in (root / name).rglob("*")
                         if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
        if not members:
            raise ValueError(f"--data {root}: the class folder '{name}' has no images. Expected {FOLDER_LAYOUT}")
        files += [(path, label) for path in members]
    return classes, files


def _image_size(path: Path, root: Path) -> tuple[int, int]:
    """(width, height) of an image file, read from its header: nothing is decoded yet."""
    where = f"--data {root}: {path.relative_to(root)}"
    if path.suffix.lower() not in IMAGE_EXTENSIONS:
        raise ValueError(f"{where} is not an image file (suffix {path.suffix or 'none'!r}, expected one of "
                         f"{', '.join(IMAGE_EXTENSIONS)}); move it out of the class folders")
    try:
        with Image.open(path) as image:
            return image.size
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"{where} cannot be read as an image ({type(err).__name__}); fix or remove it") from None


def _read_resized(path: Path, root: Path, side: int) -> np.ndarray:
    """One image as (side, side, 3) uint8 RGB: decoded, centre-cropped and resized, the full size dropped at once.

    A JPEG is decoded straight at 1/2, 1/4 or 1/8 scale when that still covers ``side``
    (``draft``), so a folder of 12-megapixel photos never holds more than one decoded photo.
    """
    try:
        with Image.open(path) as image:
            image.draft("RGB", (side, side))
            rgb = image if image.mode == "RGB" else image.convert("RGB")
            return np.asarray(ImageOps.fit(rgb, (side, side), Image.Resampling.BILINEAR))
    except (UnidentifiedImageError, OSError) as err:
        where = f"--data {root}: {path.relative_to(root)}"
        raise ValueError(f"{where} cannot be read as an image ({type(err).__name__}); fix or remove it") from None


def default_image_size(sizes: list[tuple[int, int]]) -> int:
    """The images' own side when all are square and the same size up to 64 px; else 32."""
    if len(set(sizes)) == 1 and sizes[0][0] == sizes[0][1] and sizes[0][0] <= 64:
        return sizes[0][0]
    return 32


def load_image_folder(
    root: str | Path, image_size: int | None = None, test_fraction: float = 0.2, seed: int = 0
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor], list[str]]:
    """Images in torchvision's ImageFolder layout (``root/<class>/<image>``), as float tensors in [0, 1].

    Any size and mode: each image is centre-cropped to a square and resized to
    ``image_size`` (default: :func:`default_image_size`) as soon as it is decoded, so
    only the small arrays are kept. One channel when every
    image is grey, else three (RGB). Class ids follow the sorted folder names.
    Returns ((train_images, train_labels), (test_images, test_labels), class_names),
    the test split being a stratified ``test_fraction`` of each class.
    """
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"--data {root}: no such folder. Expected {FOLDER_LAYOUT}, or an .npz file")
    if image_size is not None and (not isinstance(image_size, int) or image_size < 1):
        raise ValueError(f"--image-size must be a positive int; got {image_size!r}")
    classes, files = _class_files(root)
    sizes = [_image_size(path, root) for path, _ in files]  # headers only: checks every file before decoding
    side = image_size or default_image_size(sizes)
    pixels = np.stack([_read_resized(path, root, side) for path, _ in files])
    grey = bool((pixels == pixels[..., :1]).all())
    pixels = pixels[..., :1] if grey else pixels  # (N, side, side, 1 or 3)
    labels = np.array([label for _, label in files], dtype=np.int64)
    train, test = stratified_split(labels, test_fraction, seed)
    if len(test) == 0:
        raise ValueError(f"--data {root}: too few images to hold out {test_fraction:.0%} of a class for the test; "
                         "put at least 3 images in each class folder")
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).float().div_(255.0).contiguous()
    y = torch.from_numpy(labels)
    return (x[train], y[train]), (x[test], y[test]), classes


def load_torchvision(name: str, root: str | Path) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """MNIST or CIFAR-10 through torchvision, downloaded into ``root`` (needs the internet the first time)."""
    import torchvision

    classes = {"mnist": torchvision.datasets.MNIST, "cifar10": torchvision.datasets.CIFAR10}
    if name not in classes:
        raise ValueError(f"dataset must be one of {sorted(classes)}; got {name!r}")
    splits = []
    for train in (True, False):
        try:
            dataset = classes[name](root=str(root), train=train, download=True)
        except Exception as err:  # typically no network
            raise ValueError(
                f"could not load {name} into {root} ({err}). It is downloaded on first use: go online once, "
                f"or copy the torchvision {name} files into {root}, or use the embedded --dataset digits"
            ) from None
        data = torch.as_tensor(np.asarray(dataset.data))
        images = data.unsqueeze(1) if data.dim() == 3 else data.permute(0, 3, 1, 2)  # MNIST (N,H,W); CIFAR (N,H,W,C)
        splits.append((images.float().div_(255.0), torch.as_tensor(np.asarray(dataset.targets)).long()))
    return splits[0], splits[1]
