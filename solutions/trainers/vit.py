"""``python -m solutions.train vit``: a small Vision Transformer (or a CNN baseline) on images.

Default: the embedded 8×8 digits (no download), 4×4 = 16 patches of 2×2 pixels.
``--dataset mnist|cifar10`` downloads through torchvision (online only);
``--data DIR`` trains on your images in torchvision's ImageFolder layout
(``DIR/<class>/<image>``, any size, resized to ``--image-size``), and
``--data FILE.npz`` on your arrays ``images`` (N, C, H, W) or (N, H, W) and
``labels`` (N,). Both hold out a stratified 20% of each class for the test
accuracy, never trained on. The training loop is chapter 5's, :func:`solutions.cnn.fit`
(the same for the ViT and the CNN, and under ``torchrun``). A test image is classified
by the mean softmax over it and its four one-pixel moves (:func:`evaluate_shifted`,
test-time augmentation; ``--no-tta``: the image alone); the accuracy from the image
alone, chapter 5's :func:`solutions.cnn.evaluate`, is reported beside it.

Same names as the other trainers: ``KIND``, ``add_arguments``, ``build_model``,
``evaluate``, ``run``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from solutions import distributed
from solutions.checkpoint import save_checkpoint
from solutions.cnn import SmallCNN, evaluate, fit
from solutions.data.digits import FOLDER_LAYOUT, load_digits, load_image_folder, load_npz, load_torchvision
from solutions.vit import VisionTransformer

KIND = "vit"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        f"--data DIR: images in {FOLDER_LAYOUT}; any size, grey or colour, centre-cropped and resized to "
        "--image-size. --data FILE.npz: arrays 'images' (N, C, H, W) or (N, H, W), square, and integer 'labels' "
        "(N,) in 0..n_classes-1. Either way 20% of each class is held out for the test accuracy and never "
        "trained on; --out DIR saves DIR/model.pt with the class names."
    )
    parser.add_argument("--dataset", choices=("digits", "mnist", "cifar10"), default="digits",
                        help="digits = the embedded 8×8 UCI digits (default, offline); mnist and cifar10 are "
                             "downloaded by torchvision into --data-root (needs the internet once)")
    parser.add_argument("--data-root", type=Path, default=Path("~/.cache/transformer-deep-dive").expanduser(),
                        help="where torchvision keeps MNIST/CIFAR-10 (default: ~/.cache/transformer-deep-dive)")
    parser.add_argument("--image-size", type=int, default=None,
                        help="resize the images to this side in pixels (default: for a --data folder, the images' "
                             "own side when all are square and the same size up to 64 px, else 32; otherwise "
                             "the data's own size)")
    parser.add_argument("--model", choices=("vit", "cnn"), default="vit",
                        help="vit (default) or a small CNN baseline, to compare inductive biases")
    parser.add_argument("--epochs", type=int, default=100, help="passes over the training set (default: 100)")
    parser.add_argument("--time-budget", type=float, default=90.0,
                        help="end the learning-rate schedule early, in time, when the epochs cannot fit in this many "
                             "seconds of training (default: 90, so that the whole run stays within 2 minutes on a "
                             "busy machine; 0 = none)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per step (default: 64)")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak AdamW learning rate (default: 1e-3)")
    parser.add_argument("--weight-decay", type=float, default=0.05,
                        help="AdamW weight decay on matrices only (default: 0.05)")
    parser.add_argument("--warmup-epochs", type=float, default=3.0,
                        help="linear warm-up length before the cosine decay (default: 3)")
    parser.add_argument("--label-smoothing", type=float, default=0.1,
                        help="cross-entropy label smoothing (default: 0.1)")
    parser.add_argument("--no-augment", action="store_true",
                        help="turn off random ±1-pixel shifts (and the test-time ones: --no-tta)")
    parser.add_argument("--no-tta", action="store_true",
                        help="predict from each test image alone; by default the prediction is the mean of the "
                             "softmax over the image and its four 1-pixel shifts (test-time augmentation), and the "
                             "accuracy from the image alone is reported beside it")
    parser.add_argument("--patch-size", type=int, default=None,
                        help="patch side in pixels (default: 2 for images up to 16 px, else the smallest "
                             "giving at most 8×8 patches)")
    parser.add_argument("--d-model", type=int, default=64, help="ViT token width (default: 64)")
    parser.add_argument("--n-layers", type=int, default=3, help="ViT encoder blocks (default: 3)")
    parser.add_argument("--n-heads", type=int, default=4, help="ViT attention heads (default: 4)")
    parser.add_argument("--d-mlp", type=int, default=128, help="ViT MLP hidden width (default: 128)")
    parser.add_argument("--dropout", type=float, default=0.0, help="ViT dropout (default: 0)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for training (default: 1 for images up to 16 px, where the ops are too "
                             "small to gain from more and lose badly on a busy machine; else PyTorch's default)")
    parser.add_argument("--cnn-channels", type=int, default=32, help="CNN baseline width (default: 32)")


def default_patch_size(image_size: int) -> int:
    if image_size <= 16 and image_size % 2 == 0:
        return 2
    return next(p for p in range(1, image_size + 1) if image_size % p == 0 and image_size // p <= 8)


def load_data(args: argparse.Namespace) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor], str, list[str]]:
    """(train, test, a description of the source, class names); ``--image-size`` applied."""
    if args.data is not None and args.data.is_dir():
        train, test, classes = load_image_folder(args.data, args.image_size, seed=args.seed)
        return train, test, f"the image folder {args.data}", classes
    if args.data is not None:
        if not args.data.exists():
            raise ValueError(f"--data {args.data}: no such file or folder; expected a folder in {FOLDER_LAYOUT}, "
                             "or an .npz file")
        if args.data.suffix != ".npz":
            raise ValueError(f"--data {args.data}: expected a folder in {FOLDER_LAYOUT}, or an .npz file")
        train, test = load_npz(args.data, seed=args.seed)
        source = str(args.data)
    elif args.dataset == "digits":
        train, test, source = load_digits("train", seed=args.seed), load_digits("test", seed=args.seed), "digits"
    else:
        (train, test), source = load_torchvision(args.dataset, args.data_root), args.dataset
    if args.image_size is not None and args.image_size != train[0].shape[-1]:
        train, test = ((resize(x, args.image_size), y) for x, y in (train, test))
    n_classes = int(max(train[1].max(), test[1].max())) + 1
    return train, test, source, [str(label) for label in range(n_classes)]


def resize(
    images: Float[Tensor, "batch channels height width"], side: int
) -> Float[Tensor, "batch channels side side"]:
    """Bilinear resize (antialiased when shrinking) to ``side`` × ``side``."""
    return F.interpolate(images, size=(side, side), mode="bilinear", antialias=True, align_corners=False)


def model_config(args: argparse.Namespace, in_channels: int, image_size: int, n_classes: int) -> dict:
    """The model's config dict (what the checkpoint stores): ``model`` = "vit" or "cnn", then its arguments."""
    if args.model == "cnn":
        return {"model": "cnn", "in_channels": in_channels, "n_classes": n_classes, "channels": args.cnn_channels}
    patch_size = args.patch_size or default_patch_size(image_size)
    return {"model": "vit", "image_size": image_size, "patch_size": patch_size, "in_channels": in_channels,
            "n_classes": n_classes, "d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads,
            "d_ff": args.d_mlp, "dropout": args.dropout}


# The views of a test image whose predictions are averaged (test-time augmentation): the image and the image
# moved by one pixel along one axis, zero-filled, as random_shift moves training images. Adding the four diagonal
# moves gained less on the digits.
TEST_SHIFTS = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))


@torch.inference_mode()
def evaluate_shifted(
    model: nn.Module, images: Float[Tensor, "batch channels height width"], labels: Tensor, batch_size: int = 512
) -> float:
    """Accuracy of the mean softmax over each image's ``TEST_SHIFTS`` views (test-time augmentation)."""
    model.eval()
    device = next(model.parameters()).device
    height, width = images.shape[-2:]
    padded = F.pad(images, (1, 1, 1, 1))
    correct = 0
    for start in range(0, len(images), batch_size):
        chunk = padded[start:start + batch_size].to(device)
        probabilities = sum(model(chunk[..., 1 + dy:1 + dy + height, 1 + dx:1 + dx + width]).softmax(-1)
                            for dy, dx in TEST_SHIFTS)
        correct += (probabilities.argmax(-1).cpu() == labels[start:start + batch_size]).sum().item()
    return correct / len(images)


def build_model(config: dict) -> nn.Module:
    """The ViT or the CNN baseline of a config dict from :func:`model_config`."""
    kwargs = {key: value for key, value in config.items() if key != "model"}
    return SmallCNN(**kwargs) if config["model"] == "cnn" else VisionTransformer(**kwargs)


def run(args: argparse.Namespace) -> dict:
    threads = torch.get_num_threads()
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)  # set_num_threads is process-wide: give it back


def _check_args(args: argparse.Namespace) -> None:
    if not 0.0 <= args.label_smoothing < 1.0:
        raise ValueError(f"--label-smoothing must be in [0, 1); got {args.label_smoothing}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1; got {args.threads}")
    if args.image_size is not None and args.image_size < 1:
        raise ValueError(f"--image-size must be at least 1; got {args.image_size}")
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1; got {getattr(args, name)}")
    if not 0 <= args.warmup_epochs < args.epochs:
        raise ValueError(f"--warmup-epochs must be at least 0 and fewer than --epochs {args.epochs}; "
                         f"got {args.warmup_epochs}")
    if args.time_budget < 0:
        raise ValueError(f"--time-budget must be >= 0 seconds (0 = no limit); got {args.time_budget}")


def _run(args: argparse.Namespace) -> dict:
    _check_args(args)
    world = args.world
    (train_x, train_y), (test_x, test_y), source, classes = load_data(args)
    world.check_same("training images", train_x, train_y)
    in_channels, image_size = train_x.shape[1], train_x.shape[-1]
    if args.threads is not None or image_size <= 16:
        torch.set_num_threads(args.threads or 1)
    config = model_config(args, in_channels, image_size, len(classes))
    model = build_model(config).to(world.device)
    distributed.reseed(world, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    if not args.quiet:
        print(f"{args.model} with {n_params:,} parameters on {source}: {len(classes)} classes, "
              f"{len(train_x)} train / {len(test_x)} test images of {in_channels}×{image_size}×{image_size}"
              + (f"; {world.size} processes" if world.size > 1 else ""))
    steps_per_epoch = len(train_x) // min(args.batch_size, len(train_x))  # whole batches only
    start = time.perf_counter()
    losses = fit(model, train_x, train_y, steps=args.epochs * steps_per_epoch, batch_size=args.batch_size,
                 lr=args.lr, weight_decay=args.weight_decay, warmup_fraction=args.warmup_epochs / args.epochs,
                 label_smoothing=args.label_smoothing, augment=not args.no_augment, seed=args.seed,
                 progress=not args.quiet, time_budget=args.time_budget or None, world=world,
                 accumulation_steps=args.accumulation_steps)
    train_seconds = time.perf_counter() - start
    if not world.is_main:
        return {}  # rank 0 evaluates and writes
    epochs_done = round(len(losses) / steps_per_epoch, 2)

    one_view = evaluate(model, test_x, test_y)
    tta = not (args.no_tta or args.no_augment)
    accuracy = evaluate_shifted(model, test_x, test_y) if tta else one_view
    print(f"{args.model} test accuracy: {accuracy:.2%} on {len(test_x)} held-out images (20% of each class, never "
          "trained on)" + (f", each the mean over the image and its 4 one-pixel moves ({one_view:.2%} from the "
                           "image alone)" if tta else "")
          + f"; {epochs_done} epochs in {train_seconds:.1f} s" + (f" on {world.size} processes" if world.size > 1 else ""))
    metrics = {"accuracy": accuracy, "accuracy_one_view": one_view, "test_time_shifts": tta, "model": args.model,
               "epochs": epochs_done, "steps": len(losses), "train_seconds": round(train_seconds, 2),
               "parameters": n_params, "world_size": world.size, "accumulation_steps": args.accumulation_steps}
    if args.loss_log is not None:
        args.loss_log.parent.mkdir(parents=True, exist_ok=True)
        args.loss_log.write_text("".join(f"{loss!r}\n" for loss in losses))
    if args.out is not None:
        data = {"source": source, "seed": args.seed, "train_images": len(train_x), "test_images": len(test_x),
                "image_size": image_size, "in_channels": in_channels}
        path = save_checkpoint(args.out, kind=KIND, config=config, model=model, vocab={"classes": classes},
                               metrics=metrics, data=data)
        if not args.quiet:
            print(f"checkpoint saved to {path}")
    return metrics
