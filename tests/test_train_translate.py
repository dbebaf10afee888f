"""python -m solutions.train translate: a short run learns, writes its metrics and a checkpoint that loads back."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from solutions.data.translation import Vocab, load_numbers
from solutions.train import build_parser, main
from solutions.trainers.translate import build_model, evaluate, load_checkpoint, save_checkpoint

SMALL = ["--train-size", "20000", "--d-model", "64", "--d-ff", "128", "--n-layers", "2", "--batch-size", "64",
         "--warmup", "200", "--quiet"]


def untrained_metrics() -> dict:
    torch.manual_seed(0)
    data = load_numbers(n_train=20000)
    args = argparse.Namespace(d_model=64, n_heads=4, n_layers=2, d_ff=128, dropout=0.1, norm_first=False)
    model = build_model(data, args).eval()
    return evaluate(model, data.test, data.src_vocab, data.tgt_vocab, torch.device("cpu"))


@pytest.mark.slow
def test_train_translate_learns_and_saves(tmp_path):
    metrics_path, out = tmp_path / "metrics.json", tmp_path / "run"
    metrics = main(["translate", *SMALL, "--steps", "600", "--metrics-json", str(metrics_path), "--out", str(out)])
    assert set(metrics) == {"exact_match", "bleu"}
    assert json.loads(metrics_path.read_text()) == pytest.approx(metrics)
    before = untrained_metrics()
    assert before["exact_match"] < 0.01
    assert metrics["exact_match"] > before["exact_match"] + 0.2
    assert metrics["bleu"] > before["bleu"] + 40
    # The checkpoint gives back the same model: re-evaluating it reproduces the metrics.
    model, src_vocab, tgt_vocab = load_checkpoint(out / "model.pt")
    data = load_numbers(n_train=20000)
    assert src_vocab == data.src_vocab and tgt_vocab == data.tgt_vocab
    assert evaluate(model, data.test, src_vocab, tgt_vocab, torch.device("cpu")) == pytest.approx(metrics)


def test_checkpoint_roundtrip_gives_same_logits(tmp_path):
    data = load_numbers(n_train=500, n_validation=10, n_test=20)
    args = argparse.Namespace(d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.1, norm_first=True)
    torch.manual_seed(0)
    model = build_model(data, args).eval()
    save_checkpoint(tmp_path / "model.pt", model, data.src_vocab, data.tgt_vocab, {"exact_match": 0.0})
    loaded, src_vocab, tgt_vocab = load_checkpoint(tmp_path / "model.pt")
    assert loaded.config == model.config and not loaded.training
    assert (src_vocab, tgt_vocab) == (data.src_vocab, data.tgt_vocab)
    src, tgt_in = torch.randint(4, len(src_vocab), (3, 6)), torch.randint(4, len(tgt_vocab), (3, 5))
    torch.testing.assert_close(loaded(src, tgt_in), model(src, tgt_in), rtol=0, atol=0)


@pytest.mark.slow
def test_train_translate_on_user_tsv(tmp_path):
    """A toy TSV (reverse the words) trains through --data with a random held-out split."""
    gen = torch.Generator().manual_seed(0)
    words = "red green blue cat dog sun moon tree".split()
    lines = []
    for _ in range(300):
        sentence = [words[i] for i in torch.randint(0, len(words), (int(torch.randint(1, 5, (1,), generator=gen)),),
                                                  generator=gen)]
        lines.append(" ".join(sentence) + "\t" + " ".join(reversed(sentence)).upper())
    (tmp_path / "mine.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    metrics = main(["translate", "--data", str(tmp_path / "mine.tsv"), "--steps", "60", "--d-model", "32",
                    "--d-ff", "64", "--n-layers", "1", "--warmup", "20", "--quiet",
                    "--metrics-json", str(tmp_path / "m.json")])
    assert set(json.loads((tmp_path / "m.json").read_text())) == {"exact_match", "bleu"}
    assert 0.0 <= metrics["exact_match"] <= 1.0 and 0.0 <= metrics["bleu"] <= 100.0


def test_train_translate_bad_tsv_reports_line(tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("a b\tc d\nno tab\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=r"error: .*bad.tsv, line 2"):
        main(["translate", "--data", str(bad), "--steps", "1", "--quiet"])


@pytest.mark.parametrize("option, value", [
    ("--steps", "0"), ("--batch-size", "0"), ("--time-budget", "-1"), ("--label-smoothing", "1.5"),
    ("--threads", "0"), ("--d-model", "0"),
])
def test_train_translate_rejects_bad_options(option, value):
    with pytest.raises(SystemExit, match=f"error: {option}"):
        main(["translate", option, value, "--quiet"])


def test_train_translate_rejects_heads_not_dividing_width():
    with pytest.raises(SystemExit, match="n_heads"):
        main(["translate", "--d-model", "30", "--n-heads", "4", "--steps", "1", "--quiet"])


def test_train_translate_help_documents_every_option():
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["translate"]  # noqa: SLF001
    text = sub.format_help()
    for option in ("--steps", "--time-budget", "--batch-size", "--warmup", "--lr-factor", "--label-smoothing",
                   "--clip-norm", "--train-size", "--threads", "--d-model", "--n-heads", "--n-layers", "--d-ff",
                   "--dropout", "--norm-first", "--data", "--out", "--metrics-json"):
        assert option in text
    for action in sub._actions:  # noqa: SLF001
        assert action.help, f"{action.option_strings} has no help"
    assert "source<TAB>target" in text


@pytest.mark.slow
def test_train_translate_time_budget_stops_early(tmp_path, capsys):
    main(["translate", *SMALL, "--steps", "100000", "--time-budget", "2", "--train-size", "500"])
    out = capsys.readouterr().out
    steps = int(out.split("trained ")[1].split(" steps")[0])
    assert 1 <= steps < 100000
