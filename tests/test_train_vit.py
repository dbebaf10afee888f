"""``python -m solutions.train vit``: short real runs, the --data format, the metrics file."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import solutions.train as train
from solutions.checkpoint import load_checkpoint
from solutions.data.digits import load_image_folder
from solutions.trainers.vit import TEST_SHIFTS, SmallCNN, build_model, evaluate, evaluate_shifted
from solutions.vit import VisionTransformer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def vit_only(monkeypatch):
    """The real dispatcher with only the vit task registered, so these tests do not depend on the others."""
    monkeypatch.setattr(train, "TASKS", {"vit": train.TASKS["vit"]})
    return train.train


@pytest.mark.train
@pytest.mark.slow
def test_train_vit_short_run_beats_chance(vit_only, tmp_path):
    metrics_path = tmp_path / "metrics.json"
    metrics = vit_only(["vit", "--quiet", "--device", "cpu", "--epochs", "20", "--n-layers", "2",
                        "--lr", "3e-3", "--warmup-epochs", "1", "--time-budget", "40",
                        "--out", str(tmp_path / "run"), "--metrics-json", str(metrics_path)])
    assert metrics["accuracy"] > 0.7  # chance is 0.1 on ten balanced classes
    saved = json.loads(metrics_path.read_text())
    assert {"accuracy", "model", "epochs", "parameters"} <= set(saved)
    assert saved["accuracy"] == metrics["accuracy"] and saved["model"] == "vit"
    checkpoint = load_checkpoint(tmp_path / "run", kind="vit")
    model = build_model(checkpoint.config)
    model.load_state_dict(checkpoint.state_dict)  # the checkpoint rebuilds the model it came from
    assert isinstance(model, VisionTransformer) and checkpoint.vocab["classes"] == [str(d) for d in range(10)]
    assert checkpoint.metrics["accuracy"] == metrics["accuracy"]


@pytest.mark.train
@pytest.mark.slow
def test_train_vit_cnn_baseline_beats_chance(vit_only):
    metrics = vit_only(["vit", "--quiet", "--device", "cpu", "--model", "cnn", "--epochs", "3", "--warmup-epochs", "1"])
    assert metrics["model"] == "cnn" and metrics["accuracy"] > 0.5


@pytest.mark.train
def test_train_vit_on_user_npz(vit_only, tmp_path):
    # Two classes a ViT can tell apart at once: bright top half vs bright bottom half, 3 channels, 12×12.
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 40)
    images = rng.uniform(0, 0.2, size=(80, 3, 12, 12)).astype(np.float32)
    images[labels == 0, :, :6] += 0.8
    images[labels == 1, :, 6:] += 0.8
    np.savez(tmp_path / "mine.npz", images=images, labels=labels)
    metrics = vit_only(["vit", "--quiet", "--device", "cpu", "--data", str(tmp_path / "mine.npz"),
                        "--epochs", "15", "--d-model", "32", "--n-layers", "1", "--batch-size", "16",
                        "--lr", "3e-3", "--warmup-epochs", "1"])
    assert metrics["accuracy"] >= 0.9


def write_image_folder(root, per_class: int = 24, seed: int = 0) -> None:
    """Three classes told apart by where the bright half is (top, bottom, left); PNG and JPEG files of
    different sizes, colour and grey, as photos arrive."""
    rng = np.random.default_rng(seed)
    for label, name in enumerate(("top", "bottom", "left")):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            side = int(rng.integers(10, 20))
            pixels = rng.uniform(0, 60, size=(side, side, 3))
            half = side // 2
            region = (slice(0, half), slice(None)) if label == 0 else (
                (slice(half, None), slice(None)) if label == 1 else (slice(None), slice(0, half)))
            pixels[region] += 180
            image = Image.fromarray(pixels.astype(np.uint8))
            image = image.convert("L") if i % 3 == 0 else image
            image.save(root / name / (f"{i}.jpg" if i % 4 == 0 else f"{i}.png"))


@pytest.mark.train
def test_train_vit_on_image_folder_learns_and_saves_class_names(vit_only, tmp_path, capsys):
    write_image_folder(tmp_path / "photos")
    metrics = vit_only(["vit", "--data", str(tmp_path / "photos"), "--image-size", "12", "--epochs", "15",
                        "--d-model", "32", "--n-layers", "1", "--batch-size", "16", "--lr", "3e-3",
                        "--warmup-epochs", "1", "--out", str(tmp_path / "run")])
    assert metrics["accuracy"] >= 0.9  # chance is 1/3
    out = capsys.readouterr().out
    assert "3 classes, 57 train / 15 test images of 3×12×12" in out and "never trained on" in out
    checkpoint = load_checkpoint(tmp_path / "run", kind="vit")
    assert checkpoint.vocab["classes"] == ["bottom", "left", "top"]  # sorted folder names, as ImageFolder
    assert checkpoint.data["test_images"] == 15 and checkpoint.config["image_size"] == 12
    model = build_model(checkpoint.config)
    model.load_state_dict(checkpoint.state_dict)
    test_x, test_y = load_image_folder(tmp_path / "photos", 12)[1]
    assert evaluate(model, test_x, test_y) == metrics["accuracy_one_view"]
    assert evaluate_shifted(model, test_x, test_y) == metrics["accuracy"] and metrics["test_time_shifts"]


def test_load_image_folder_resizes_and_keeps_grey_as_one_channel(tmp_path):
    for name, size in (("a", (20, 10)), ("b", (7, 7))):
        (tmp_path / name).mkdir()
        for i in range(5):
            Image.new("L", size, color=40 * i).save(tmp_path / name / f"{i}.png")
    (train_x, train_y), (test_x, test_y), classes = load_image_folder(tmp_path, image_size=9)
    assert classes == ["a", "b"] and train_x.shape[1:] == (1, 9, 9) and test_x.shape[1:] == (1, 9, 9)
    assert len(train_x) + len(test_x) == 10 and sorted(test_y.tolist()) == [0, 1]
    assert 0.0 <= float(train_x.min()) and float(train_x.max()) <= 1.0
    (tmp_path / "b" / "0.png").unlink()
    Image.new("RGB", (7, 7), color=(200, 10, 10)).save(tmp_path / "b" / "0.png")
    assert load_image_folder(tmp_path, image_size=9)[0][0].shape[1] == 3  # one colour image: all RGB


def test_load_image_folder_decodes_one_full_size_photo_at_a_time(tmp_path):
    """Ten 3000×3000 photos (36 MB each once decoded): the loader's peak memory grows by about one photo, not ten."""
    grey = Image.linear_gradient("L").resize((3000, 3000))
    photo = Image.merge("RGB", (grey, grey.transpose(Image.Transpose.ROTATE_90), grey.point(lambda v: 255 - v)))
    photo.save(tmp_path / "photo.png", compress_level=1)
    photo.save(tmp_path / "photo.jpg", quality=90)
    for name in ("a", "b"):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for i in range(5):
            suffix = ".jpg" if i % 2 else ".png"
            shutil.copy(tmp_path / f"photo{suffix}", tmp_path / "photos" / name / f"{i}{suffix}")
    probe = ("import resource, sys\n"
             "from solutions.data.digits import load_image_folder\n"
             "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             "(train_x, _), (test_x, _), _ = load_image_folder(sys.argv[1], image_size=32)\n"
             "grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
             "print(grown * 1024, len(train_x) + len(test_x), tuple(train_x.shape[1:]))\n")
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "photos")], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    grown, n, shape = done.stdout.split(maxsplit=2)
    assert (int(n), shape.strip()) == (10, "(3, 32, 32)")
    one_photo = 3000 * 3000 * 4  # Pillow keeps RGB as 4 bytes per pixel
    assert int(grown) < 3 * one_photo, f"peak memory grew by {int(grown) / 2**20:.0f} MB while loading"


def write_cut_png(path) -> None:
    """A PNG cut in half, as an interrupted copy leaves it: its header reads, its pixels do not."""
    Image.effect_noise((64, 64), 64).save(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("make, message", [
    (lambda root: (root / "only").mkdir(), r"found 1 class folder \['only'\]; a classifier needs at least 2"),
    (lambda root: [(root / c).mkdir() for c in "ab"], r"the class folder 'a' has no images"),
    (lambda root: (root / "a" / "notes.txt").write_text("hi"), r"a/notes.txt is not an image file"),
    (lambda root: (root / "a" / "broken.png").write_bytes(b"not a png"), r"a/broken.png cannot be read as an image"),
    (lambda root: write_cut_png(root / "a" / "cut.png"), r"a/cut.png cannot be read as an image"),
])
def test_train_vit_bad_image_folder_is_one_error_line(vit_only, tmp_path, capsys, make, message):
    root = tmp_path / "photos"
    root.mkdir()
    if "class folder" not in message:
        write_image_folder(root, per_class=3)
        (root / "a").mkdir()
        Image.new("RGB", (8, 8)).save(root / "a" / "ok.png")
    make(root)
    assert train.main(["vit", "--quiet", "--data", str(root)]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(f"error: --data [^\\n]*{message}[^\\n]*\\n", err), err
    if "class folder" in message:
        assert "ImageFolder layout" in err


def test_train_vit_data_must_be_folder_or_npz(vit_only, tmp_path, capsys):
    (tmp_path / "images.csv").write_text("1,2\n")
    assert train.main(["vit", "--quiet", "--data", str(tmp_path / "images.csv")]) == 2
    assert "expected a folder in DIR/<class name>/<image>" in capsys.readouterr().err


def test_train_vit_bad_npz_is_an_error_not_a_traceback(vit_only, tmp_path, capsys):
    np.savez(tmp_path / "bad.npz", pictures=np.zeros((4, 8, 8)), labels=np.zeros(4, dtype=int))
    assert train.main(["vit", "--quiet", "--data", str(tmp_path / "bad.npz")]) == 2
    assert re.fullmatch(r"error: --data .*missing array\(s\) \['images'\][^\n]*\n", capsys.readouterr().err)


@pytest.mark.parametrize("make, message", [
    (lambda path: path.write_text("not an archive"), r"not an \.npz archive; save one with np\.savez"),
    (lambda path: np.savez(path, images=np.array([None] * 4, dtype=object), labels=np.zeros(4, dtype=int)),
     r"must be numeric arrays, not object arrays"),
])
def test_train_vit_npz_that_is_not_one_or_holds_objects_is_one_error_line(vit_only, tmp_path, capsys, make, message):
    """Never numpy's advice to load the file with allow_pickle: one line that says what to save instead."""
    make(tmp_path / "mine.npz")
    assert train.main(["vit", "--quiet", "--data", str(tmp_path / "mine.npz")]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(f"error: --data [^\\n]*{message}[^\\n]*\\n", err), err
    assert "allow_pickle" not in err  # numpy's advice to unpickle the file is not repeated


def test_train_vit_data_that_does_not_exist_says_so(vit_only, tmp_path, capsys):
    assert train.main(["vit", "--quiet", "--data", str(tmp_path / "nowhere")]) == 2
    assert re.fullmatch(r"error: --data [^\n]*nowhere: no such file or folder; expected a folder in [^\n]*\n",
                        capsys.readouterr().err)


@pytest.mark.parametrize("option", ["--epochs", "--batch-size"])
def test_train_vit_rejects_nonpositive_sizes(vit_only, option, capsys):
    assert train.main(["vit", "--quiet", option, "0"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {option} must be at least 1")


def test_train_vit_help_mentions_every_option(vit_only, capsys):
    with pytest.raises(SystemExit):
        vit_only(["vit", "--help"])
    text = capsys.readouterr().out
    for option in ("--dataset", "--model", "--epochs", "--time-budget", "--batch-size", "--data", "--d-model",
                   "--patch-size", "--metrics-json", "--out", "--image-size", "ImageFolder"):
        assert option in text


def test_small_cnn_output_shape():
    assert SmallCNN(3, 7)(torch.randn(2, 3, 16, 16)).shape == (2, 7)


def test_train_parser_accepts_every_dataset_choice():
    parser = argparse.ArgumentParser()
    from solutions.trainers.vit import add_arguments

    add_arguments(parser)
    for name in ("digits", "mnist", "cifar10"):
        assert parser.parse_args(["--dataset", name]).dataset == name


def test_train_vit_mnist_offline_says_what_to_do(vit_only, monkeypatch, tmp_path):
    import torchvision

    def offline(*args, **kwargs):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")  # what torchvision raises with no network

    monkeypatch.setattr(torchvision.datasets, "MNIST", offline)  # never touches the network
    with pytest.raises(ValueError, match=r"could not load mnist .*go online once.*--dataset digits"):
        vit_only(["vit", "--quiet", "--dataset", "mnist", "--data-root", str(tmp_path)])


def moved(images: torch.Tensor, down: int, right: int) -> torch.Tensor:
    """``images`` moved by (down, right) pixels, what leaves the frame dropped and what enters it zero."""
    out = torch.roll(images, shifts=(down, right), dims=(-2, -1))
    if down:
        out[..., 0 if down > 0 else -1, :] = 0
    if right:
        out[..., :, 0 if right > 0 else -1] = 0
    return out


def test_evaluate_shifted_averages_the_image_and_its_four_one_pixel_moves():
    class Recorder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(36, 3)
            self.seen: list[torch.Tensor] = []

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            self.seen.append(images.clone())
            return self.linear(images.flatten(1))

    torch.manual_seed(0)
    images, labels = torch.randn(40, 1, 6, 6), torch.randint(0, 3, (40,))
    model = Recorder()
    torch.nn.init.normal_(model.linear.weight)  # predictions that differ from image to image and view to view
    accuracy = evaluate_shifted(model, images, labels)
    views = [moved(images, 0, 0), moved(images, 1, 0), moved(images, -1, 0), moved(images, 0, 1), moved(images, 0, -1)]
    assert len(model.seen) == len(TEST_SHIFTS) == 5
    assert all(any(torch.equal(seen, view) for seen in model.seen) for view in views)
    with torch.no_grad():
        mean = sum(model.linear(view.flatten(1)).softmax(-1) for view in views) / 5
    single = model.linear(images.flatten(1)).argmax(-1)
    assert len(set(mean.argmax(-1).tolist())) == 3 and not torch.equal(mean.argmax(-1), single)  # the views count
    assert accuracy == (mean.argmax(-1) == labels).sum().item() / len(labels)


def test_train_vit_no_tta_reports_the_image_alone(vit_only, tmp_path):
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 20)
    images = rng.uniform(0, 0.2, size=(40, 1, 8, 8)).astype(np.float32)
    images[labels == 0, :, :4] += 0.8
    np.savez(tmp_path / "mine.npz", images=images, labels=labels)
    metrics = vit_only(["vit", "--quiet", "--device", "cpu", "--data", str(tmp_path / "mine.npz"), "--epochs", "2",
                        "--warmup-epochs", "1", "--d-model", "16", "--n-layers", "1", "--batch-size", "16", "--no-tta"])
    assert metrics["test_time_shifts"] is False and metrics["accuracy"] == metrics["accuracy_one_view"]
