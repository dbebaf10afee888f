"""solutions.trainers.gpt: a short training clearly beats the unigram baseline; options and errors."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from solutions.gpt import GPT, GPTConfig, generate
from solutions.trainers import gpt as trainer

TINY = ["--steps", "200", "--batch-size", "16", "--block-size", "32", "--d-model", "64", "--n-layers", "2",
        "--warmup", "10", "--lr", "1e-2", "--eval-chars", "8000", "--samples", "1", "--sample-tokens", "20",
        "--time-budget", "1e9"]


def parse(argv: list[str]) -> argparse.Namespace:
    """The options solutions.train adds to every task, then the gpt trainer's own."""
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--metrics-json", type=Path, default=None)
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    trainer.add_arguments(p)
    args = p.parse_args(argv)
    args.device = torch.device(args.device)
    return args


@pytest.mark.slow
def test_train_gpt_short_run_beats_unigram_and_saves(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    torch.manual_seed(0)
    metrics = trainer.run(parse(TINY + ["--quiet", "--out", str(tmp_path)]))
    # An untrained model scores about ln(vocab) ≈ 4.7; the unigram baseline is ≈ 3.3.
    assert metrics["val_loss"] < metrics["unigram_loss"] - 0.1
    assert metrics["val_loss"] < math.log(110) - 1.0
    out = capsys.readouterr().out
    assert "val_loss" in out and "unigram" in out and "--- sample 1 ---" in out
    checkpoint = torch.load(tmp_path / "model.pt", weights_only=False)
    model = GPT(GPTConfig(**checkpoint["config"]))
    model.load_state_dict(checkpoint["model"])
    assert len(checkpoint["chars"]) == model.config.vocab
    assert generate(model, torch.zeros(1, 1, dtype=torch.long), 10).shape == (1, 11)


def test_train_gpt_user_data(tmp_path: Path) -> None:
    text = "the cat sat on the mat. " * 400
    (tmp_path / "mine.txt").write_text(text)
    args = parse(TINY + ["--quiet", "--steps", "30", "--data", str(tmp_path / "mine.txt")])
    metrics = trainer.run(args)
    assert set(metrics) >= {"val_loss", "unigram_loss"}
    assert math.isfinite(metrics["val_loss"])
    assert metrics["val_loss"] < metrics["unigram_loss"]  # a repeated sentence is easy to predict


@pytest.mark.parametrize("extra, match", [
    (["--data", "/nonexistent/file.txt"], "file.txt"),
    (["--steps", "0"], "--steps"),
    (["--block-size", "0"], "--block-size"),
    (["--n-heads", "3"], "n_heads"),
])
def test_train_gpt_bad_options_raise_value_error(extra: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        trainer.run(parse(TINY + ["--quiet"] + extra))


def test_train_gpt_param_groups_skip_decay_on_biases_norms_embeddings() -> None:
    model = GPT(GPTConfig(vocab=20, max_len=16, d_model=32, n_heads=4, n_layers=2))
    decay, no_decay = trainer._param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert decayed and all(n.endswith("weight") and "norm" not in n and "embedding" not in n for n in decayed)
    assert "token_embedding.weight" in {names[id(p)] for p in no_decay["params"]}
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_train_gpt_lr_warmup_then_cosine() -> None:
    assert trainer.lr_factor(0.0, 0, 10) == pytest.approx(0.1)
    assert trainer.lr_factor(0.01, 9, 10) == pytest.approx(1.0)
    assert trainer.lr_factor(0.5, 100, 10) == pytest.approx(0.55)
    assert trainer.lr_factor(1.0, 1000, 10) == pytest.approx(0.1)


@pytest.mark.skipif(
    any(importlib.util.find_spec(f"solutions.trainers.{t}") is None for t in ("translate", "vit")),
    reason="python -m solutions.train needs every task's trainer module",
)
def test_train_cli_gpt_help_and_metrics_json(tmp_path: Path) -> None:
    help_text = subprocess.run([sys.executable, "-m", "solutions.train", "gpt", "--help"],
                               capture_output=True, text=True, check=True).stdout
    for option in ("--steps", "--time-budget", "--batch-size", "--block-size", "--sample-tokens", "--n-kv-heads"):
        assert option in help_text
    metrics_path = tmp_path / "m.json"
    subprocess.run([sys.executable, "-m", "solutions.train", "gpt", "--quiet", "--metrics-json", str(metrics_path),
                    *TINY, "--steps", "10"], check=True, capture_output=True)
    assert "val_loss" in json.loads(metrics_path.read_text())
