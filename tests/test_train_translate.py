"""python -m solutions.train translate and python -m solutions.translate: training on the embedded numbers and on
your own pairs, the checkpoint round trip, and one clear error line for each bad input."""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys

import pytest
import torch

from solutions.checkpoint import load_checkpoint, save_checkpoint
from solutions.data.tokenizer import train_tokenizer
from solutions.data.translation import number_text_splits, read_tsv, split_text_pairs
from solutions.train import build_parser, main, train
from solutions.trainers.translate import PREDICTIONS_FILE, build_model, evaluate, model_config
from solutions.translate import Translator, load_translator
from solutions.translate import main as translate_main

SMALL = ["--train-size", "20000", "--d-model", "64", "--d-ff", "128", "--n-layers", "2", "--batch-size", "64",
         "--warmup", "200", "--quiet"]
MODEL = argparse.Namespace(d_model=64, n_heads=4, n_layers=2, d_ff=128, dropout=0.1, norm_first=False)


def untrained_metrics() -> dict:
    torch.manual_seed(0)
    splits = number_text_splits(n_train=20000)
    src_tok = train_tokenizer("word", [s for s, _ in splits.train])
    tgt_tok = train_tokenizer("word", [t for _, t in splits.train])
    model = build_model(model_config(MODEL, src_tok, tgt_tok, splits.train)).eval()
    return evaluate(Translator(model, src_tok, tgt_tok), splits.test)[0]


@pytest.mark.train
@pytest.mark.slow
def test_train_translate_learns_and_saves(tmp_path):
    metrics_path, out = tmp_path / "metrics.json", tmp_path / "run"
    metrics = train(["translate", *SMALL, "--steps", "600", "--metrics-json", str(metrics_path), "--out", str(out)])
    assert {"exact_match", "bleu", "chrf", "bleu_signature", "chrf_signature"} <= set(metrics)
    assert metrics["test_pairs"] == 1000 and "tok:13a" in metrics["bleu_signature"]
    assert json.loads(metrics_path.read_text()) == pytest.approx(metrics)
    before = untrained_metrics()
    assert before["exact_match"] < 0.01
    assert metrics["exact_match"] > before["exact_match"] + 0.2
    assert metrics["bleu"] > before["bleu"] + 40
    # The checkpoint gives back the same model and word tokenizers: re-evaluating it reproduces the metrics.
    translator = load_translator(out)
    splits = number_text_splits(n_train=20000)
    assert translator.source_tokenizer == train_tokenizer("word", [s for s, _ in splits.train])
    again = evaluate(translator, splits.test)[0]
    assert again == pytest.approx({key: metrics[key] for key in again})
    assert metrics["world_size"] == 1 and metrics["steps"] == 600


def test_checkpoint_roundtrip_gives_same_logits(tmp_path):
    splits = number_text_splits(n_train=500, n_validation=10, n_test=20)
    src_tok = train_tokenizer("word", [s for s, _ in splits.train])
    tgt_tok = train_tokenizer("word", [t for _, t in splits.train])
    args = argparse.Namespace(d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.1, norm_first=True)
    torch.manual_seed(0)
    config = model_config(args, src_tok, tgt_tok, splits.train)
    model = build_model(config).eval()
    save_checkpoint(tmp_path, kind="translate", config=config, model=model, metrics={"exact_match": 0.0},
                    vocab={"source": src_tok.to_dict(), "target": tgt_tok.to_dict()})
    checkpoint = load_checkpoint(tmp_path, kind="translate")
    loaded = build_model(checkpoint.config).eval()
    loaded.load_state_dict(checkpoint.state_dict)
    assert loaded.config == model.config and checkpoint.metrics == {"exact_match": 0.0}
    translator = load_translator(tmp_path / "model.pt")
    assert (translator.source_tokenizer, translator.target_tokenizer) == (src_tok, tgt_tok)
    src, tgt_in = torch.randint(4, len(src_tok), (3, 6)), torch.randint(4, len(tgt_tok), (3, 5))
    torch.testing.assert_close(loaded(src, tgt_in), model(src, tgt_in), rtol=0, atol=0)
    torch.testing.assert_close(translator.model(src, tgt_in), model(src, tgt_in), rtol=0, atol=0)


DIGIT_WORDS = "zero one two three four five six seven eight nine".split()
# A tiny model that learns the digit task below in a few seconds on one core.
TINY = ["--d-model", "32", "--d-ff", "64", "--n-layers", "1", "--batch-size", "32", "--warmup", "100",
        "--dropout", "0", "--lr-factor", "1", "--quiet"]


def write_digit_task(path, n: int = 2000, seed: int = 0) -> None:
    """Digit words → the digits with no spaces ("three one four" → "314"): ~7,000 distinct targets."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        digits = [rng.randrange(10) for _ in range(rng.randint(1, 4))]
        lines.append(" ".join(DIGIT_WORDS[d] for d in digits) + "\t" + "".join(map(str, digits)))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.train
def test_train_translate_no_space_targets_learns_with_default_tokenizer(tmp_path, capsys):
    write_digit_task(tmp_path / "digits.tsv")
    out = tmp_path / "run"
    metrics = train(["translate", "--data", str(tmp_path / "digits.tsv"), "--steps", "500", *TINY,
                     "--out", str(out)])
    assert metrics["exact_match"] >= 0.9 and metrics["chrf"] >= 85  # word tokens: each target seen about once
    checkpoint = load_checkpoint(out, kind="translate")
    lines = (tmp_path / "digits.tsv").read_text(encoding="utf-8").splitlines()
    distinct = len(set(lines))  # short digit strings recur: about half the lines are repeats
    assert checkpoint.data["tokenizer"] == "bpe" and checkpoint.data["test_pairs"] == round(0.1 * distinct)
    assert checkpoint.data["duplicates_dropped"] == len(lines) - distinct > 0
    assert "never trained on" in capsys.readouterr().out
    # The held-out sources are not in the training split, and the saved predictions are what was scored.
    rows = [line.split("\t") for line in (out / PREDICTIONS_FILE).read_text(encoding="utf-8").splitlines()]
    assert len(rows) == round(0.1 * distinct)
    train_sources = {source for source, _ in split_text_pairs(read_tsv(tmp_path / "digits.tsv"), seed=0).train}
    assert not train_sources & {row[0] for row in rows}
    assert sum(row[1] == row[2] for row in rows) / len(rows) == pytest.approx(metrics["exact_match"])
    # Round trip: the checkpoint, in Python and on the command line, reproduces the trainer's predictions.
    sources, predictions = [row[0] for row in rows], [row[2] for row in rows]
    assert load_translator(out)(sources) == predictions
    (tmp_path / "sources.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    assert translate_main([str(out), "--input", str(tmp_path / "sources.txt")]) == 0
    assert capsys.readouterr().out.splitlines() == predictions
    # Beam search through the CLI, from standard input; an empty line stays empty.
    result = subprocess.run([sys.executable, "-m", "solutions.translate", str(out), "--beam", "3"],
                            input="three one four\n\nnine\n", capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[1] == "" and len(result.stdout.split("\n")) == 4


@pytest.mark.train
def test_train_translate_word_tokenizer_cannot_learn_no_space_targets(tmp_path):
    """What the default avoids: with word tokens a target never seen in training can never come out."""
    write_digit_task(tmp_path / "digits.tsv")
    train(["translate", "--data", str(tmp_path / "digits.tsv"), "--steps", "500", *TINY, "--tokenizer", "word",
           "--out", str(tmp_path / "run")])
    seen = {target for _, target in split_text_pairs(read_tsv(tmp_path / "digits.tsv"), seed=0).train}
    rows = [line.split("\t") for line in (tmp_path / "run" / PREDICTIONS_FILE).read_text().splitlines()]
    unseen = [row for row in rows if row[1] not in seen]
    assert len(unseen) > 50 and not any(reference == prediction for _, reference, prediction in unseen)


@pytest.mark.parametrize("content, message", [
    ("a b\tc d\nno tab\n", r"bad.tsv, line 2: expected 'source<TAB>target' with exactly one tab; found no tab"),
    ("", r"bad.tsv: the file is empty"),
    ("a\tb\n\tc\n", r"bad.tsv, line 2: the source side is empty"),
])
def test_train_translate_bad_tsv_is_one_error_line(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.tsv"
    bad.write_text(content, encoding="utf-8")
    assert main(["translate", "--data", str(bad), "--steps", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(f"error: [^\\n]*{message}[^\\n]*\\n", err), err  # one line, no traceback


@pytest.mark.parametrize("option, value", [
    ("--steps", "0"), ("--batch-size", "0"), ("--time-budget", "-1"), ("--label-smoothing", "1.5"),
    ("--threads", "0"), ("--d-model", "0"),
])
def test_train_translate_rejects_bad_options(option, value, capsys):
    assert main(["translate", option, value, "--quiet"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {option}")


def test_train_translate_rejects_heads_not_dividing_width(capsys):
    assert main(["translate", "--d-model", "30", "--n-heads", "4", "--steps", "1", "--quiet"]) == 2
    assert "n_heads" in capsys.readouterr().err


def test_translate_cli_rejects_checkpoint_of_another_kind(tmp_path, capsys):
    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path / "vit", kind="vit", config={}, model=model, vocab={"classes": ["a", "b"]}, metrics={})
    assert translate_main([str(tmp_path / "vit")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match(r"error: .*model.pt: a 'vit' checkpoint, but a 'translate' one", err)
    torch.save({"state_dict": model.state_dict()}, tmp_path / "old.pt")  # an older, headerless checkpoint
    assert translate_main([str(tmp_path / "old.pt")]) == 2
    assert "not a checkpoint of this library" in capsys.readouterr().err
    assert translate_main([str(tmp_path / "nowhere")]) == 2
    assert "no checkpoint there" in capsys.readouterr().err


def test_train_translate_help_documents_every_option():
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["translate"]  # noqa: SLF001
    text = sub.format_help()
    for option in ("--steps", "--time-budget", "--batch-size", "--warmup", "--lr-factor", "--label-smoothing",
                   "--clip-norm", "--train-size", "--threads", "--d-model", "--n-heads", "--n-layers", "--d-ff",
                   "--dropout", "--norm-first", "--data", "--out", "--metrics-json", "--tokenizer", "--vocab-size"):
        assert option in text
    for action in sub._actions:  # noqa: SLF001
        assert action.help, f"{action.option_strings} has no help"
    assert "source<TAB>target" in text and "10% of the distinct sources" in text and "%%" not in text


@pytest.mark.train
@pytest.mark.slow
def test_train_translate_time_budget_stops_early(tmp_path, capsys):
    train(["translate", *SMALL, "--steps", "100000", "--time-budget", "2", "--train-size", "500"])
    out = capsys.readouterr().out
    steps = int(out.split("trained ")[1].split(" steps")[0])
    assert 1 <= steps < 100000
