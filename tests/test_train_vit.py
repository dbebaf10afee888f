"""``python -m solutions.train vit``: short real runs, the --data format, the metrics file."""

from __future__ import annotations

import argparse
import json
import re

import numpy as np
import pytest
import torch

import solutions.train as train
from solutions.trainers.vit import SmallCNN, parameter_groups, random_shift, warmup_cosine
from solutions.vit import VisionTransformer


@pytest.fixture
def vit_only(monkeypatch):
    """The real dispatcher with only the vit task registered, so these tests do not depend on the others."""
    monkeypatch.setattr(train, "TASKS", {"vit": train.TASKS["vit"]})
    return train.train


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
    checkpoint = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    model = VisionTransformer(**checkpoint["config"])
    model.load_state_dict(checkpoint["state_dict"])  # the checkpoint rebuilds the model it came from


@pytest.mark.slow
def test_train_vit_cnn_baseline_beats_chance(vit_only):
    metrics = vit_only(["vit", "--quiet", "--device", "cpu", "--model", "cnn", "--epochs", "3"])
    assert metrics["model"] == "cnn" and metrics["accuracy"] > 0.5


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


def test_train_vit_bad_npz_is_an_error_not_a_traceback(vit_only, tmp_path, capsys):
    np.savez(tmp_path / "bad.npz", pictures=np.zeros((4, 8, 8)), labels=np.zeros(4, dtype=int))
    assert train.main(["vit", "--quiet", "--data", str(tmp_path / "bad.npz")]) == 2
    assert re.fullmatch(r"error: --data .*missing array\(s\) \['images'\][^\n]*\n", capsys.readouterr().err)


@pytest.mark.parametrize("option", ["--epochs", "--batch-size"])
def test_train_vit_rejects_nonpositive_sizes(vit_only, option, capsys):
    assert train.main(["vit", "--quiet", option, "0"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {option} must be at least 1")


def test_train_vit_help_mentions_every_option(vit_only, capsys):
    with pytest.raises(SystemExit):
        vit_only(["vit", "--help"])
    text = capsys.readouterr().out
    for option in ("--dataset", "--model", "--epochs", "--time-budget", "--batch-size", "--data", "--d-model",
                   "--patch-size", "--metrics-json", "--out"):
        assert option in text


def test_random_shift_moves_content_by_at_most_one_pixel():
    generator = torch.Generator().manual_seed(0)
    images = torch.zeros(64, 1, 8, 8)
    images[:, :, 4, 4] = 1.0
    shifted = random_shift(images, generator)
    assert shifted.shape == images.shape and torch.all(shifted.sum(dim=(1, 2, 3)) == 1.0)
    rows, cols = shifted[:, 0].flatten(1).argmax(1).div(8, rounding_mode="floor"), shifted[:, 0].flatten(1).argmax(1) % 8
    assert set(rows.tolist()) == {3, 4, 5} and set(cols.tolist()) == {3, 4, 5}


def test_parameter_groups_decay_only_weight_matrices():
    model = VisionTransformer(8, 2, 1, 10, 16, 1, 2, 32)
    decay, no_decay = parameter_groups(model, 0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} >= {"cls_token", "position_embedding", "norm.weight", "head.bias"}
    assert all(p.dim() == 2 for p in decay["params"]) and decay["weight_decay"] == 0.05
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_warmup_cosine_rises_then_decays_to_zero():
    values = [warmup_cosine(step, warmup=10, total=100) for step in range(101)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(values[9:], values[10:]))
    assert values[100] == pytest.approx(0.0, abs=1e-12)


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
