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

from solutions.checkpoint import load_checkpoint, save_checkpoint
from solutions.data.text import load_text_dataset
from solutions.data.tokenizer import BPETokenizer
from solutions.distributed import World
from solutions.generate import load_gpt
from solutions.generate import main as generate_main
from solutions.gpt import GPT, GPTConfig, generate
from solutions.trainers import gpt as trainer

TINY = ["--steps", "200", "--batch-size", "16", "--block-size", "32", "--d-model", "64", "--n-layers", "2",
        "--warmup", "10", "--lr", "1e-2", "--eval-chars", "8000", "--samples", "1", "--sample-tokens", "20",
        "--time-budget", "1e9"]


def parse(argv: list[str]) -> argparse.Namespace:
    """The options solutions.train adds to every task, then the gpt trainer's own; one process on the CPU."""
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--metrics-json", type=Path, default=None)
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--accumulation-steps", type=int, default=1)
    p.add_argument("--loss-log", type=Path, default=None)
    trainer.add_arguments(p)
    args = p.parse_args(argv)
    args.world = World(device=torch.device("cpu"))
    args.device = args.world.device
    return args


@pytest.mark.train
@pytest.mark.slow
def test_train_gpt_short_run_beats_unigram_and_saves(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    torch.manual_seed(0)
    metrics = trainer.run(parse(TINY + ["--quiet", "--out", str(tmp_path)]))
    # An untrained model scores about ln(vocab) ≈ 4.7; the unigram baseline is ≈ 3.3.
    assert metrics["val_loss"] < metrics["unigram_loss"] - 0.1
    assert metrics["val_loss"] < math.log(110) - 1.0
    out = capsys.readouterr().out
    assert "val_loss" in out and "unigram" in out and "--- sample 1 ---" in out
    checkpoint = load_checkpoint(tmp_path, kind="gpt")
    model = trainer.build_model(checkpoint.config)
    model.load_state_dict(checkpoint.state_dict)
    assert len(checkpoint.vocab["tokenizer"]["chars"]) == model.config.vocab
    assert checkpoint.metrics["val_loss"] == metrics["val_loss"]
    assert generate(model, torch.zeros(1, 1, dtype=torch.long), 10).shape == (1, 11)


@pytest.mark.train
def test_train_gpt_user_data(tmp_path: Path) -> None:
    text = "the cat sat on the mat. " * 400
    (tmp_path / "mine.txt").write_text(text)
    args = parse(TINY + ["--quiet", "--steps", "30", "--data", str(tmp_path / "mine.txt")])
    metrics = trainer.run(args)
    assert set(metrics) >= {"val_loss", "unigram_loss"}
    assert math.isfinite(metrics["val_loss"])
    assert metrics["val_loss"] < metrics["unigram_loss"]  # a repeated sentence is easy to predict


@pytest.mark.train
def test_train_gpt_bpe_tokens_and_generate_cli(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text = "".join(f"the {w} sat on the mat.\n" for w in ("cat", "dog", "bird", "cow") * 150)
    (tmp_path / "mine.txt").write_text(text)
    args = parse(TINY + ["--quiet", "--steps", "30", "--data", str(tmp_path / "mine.txt"), "--tokenizer", "bpe",
                         "--vocab-size", "60", "--samples", "1", "--eval-chars", "2000",
                         "--out", str(tmp_path / "run")])
    metrics = trainer.run(args)
    assert metrics["tokenizer"] == "bpe" and metrics["val_loss"] < metrics["unigram_loss"]
    assert "--- sample 1 ---" in capsys.readouterr().out
    model, tokenizer = load_gpt(tmp_path / "run")
    assert isinstance(tokenizer, BPETokenizer) and len(tokenizer) <= 60
    assert tokenizer.decode(tokenizer.encode(text[:200])) == text[:200]  # newlines survive BPE
    capsys.readouterr()
    # The CLI prints the prompt and its greedy continuation: the same tokens as generate() on the loaded model.
    assert generate_main([str(tmp_path / "run"), "--prompt", "the cat", "--temperature", "0",
                          "--max-new-tokens", "8"]) == 0
    expected = generate(model, torch.tensor([tokenizer.encode("the cat")]), 8, temperature=0)
    assert capsys.readouterr().out == tokenizer.decode(expected[0].tolist()) + "\n"


@pytest.mark.train
def test_train_gpt_samples_from_a_held_out_bpe_piece_that_decodes_to_no_text(tmp_path: Path, capsys) -> None:
    """The samples start from the held-out text's first token; here it is a bare "▁" piece, whose text (empty)
    encodes to no token at all, so a prompt made from its text would be empty."""
    (tmp_path / "mine.txt").write_text("".join(f"the {w} sat on the mat number {i}.\n" for i in range(300)
                                               for w in ("cat", "dog")))
    args = parse(TINY + ["--steps", "2", "--data", str(tmp_path / "mine.txt"), "--tokenizer", "bpe",
                         "--vocab-size", "80", "--block-size", "16", "--samples", "1", "--sample-tokens", "5",
                         "--eval-chars", "500"])
    data = load_text_dataset(args.data, args.val_fraction, args.block_size + 1, "bpe", args.vocab_size)
    assert data.vocab.encode(data.vocab.decode(data.val[:1])) == []  # the case this test is about
    trainer.run(args)
    out = capsys.readouterr().out
    assert "--- sample 1 ---" in out


@pytest.mark.train
def test_generate_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "mine.txt").write_text("abcabcabc " * 100)
    trainer.run(parse(TINY + ["--quiet", "--steps", "2", "--samples", "0", "--data", str(tmp_path / "mine.txt"),
                              "--out", str(tmp_path / "run")]))
    save_checkpoint(tmp_path / "vit", kind="vit", config={}, model=torch.nn.Linear(1, 1), vocab={}, metrics={})
    for argv, message in (
        ([str(tmp_path / "vit"), "--prompt", "a"], "a 'vit' checkpoint, but a 'gpt' one is needed"),
        ([str(tmp_path / "run"), "--prompt", "xyz"], "character 'x' is not in the vocabulary"),
        ([str(tmp_path / "run"), "--prompt", "a" * 40], "this model's context is 32 tokens"),
        ([str(tmp_path / "run"), "--prompt", "ab", "--max-new-tokens", "31"], "--max-new-tokens must be in 0..30"),
    ):
        capsys.readouterr()
        assert generate_main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


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
    decay, no_decay = trainer.parameter_groups(model, 0.1)
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


@pytest.mark.train
@pytest.mark.subprocess
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
