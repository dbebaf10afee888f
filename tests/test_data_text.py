"""solutions.data.text: the embedded text loads, the vocabulary round-trips, bad files are named."""

from __future__ import annotations

import gzip
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from solutions.data.text import CharVocab, get_batch, load_char_dataset, load_text, unigram_entropy


def test_load_text_embedded_is_english_of_the_promised_size() -> None:
    text = load_text()
    assert 300_000 <= len(text.encode()) <= 1_000_000
    assert text.startswith(":(TM):")
    assert text.count(" the ") > 3000


def test_char_dataset_embedded_split_and_baseline() -> None:
    data = load_char_dataset()
    text = load_text()
    assert len(data.train) + len(data.val) == len(text)
    assert abs(len(data.val) / len(text) - 0.1) < 0.001
    assert data.vocab.decode(data.train[:200]) == text[:200]
    assert data.vocab.decode(data.val[-50:]) == text[-50:]
    assert 2.5 < data.unigram_loss < 4.0
    assert data.train.dtype == torch.long and int(data.train.max()) < len(data.vocab)


@pytest.mark.parametrize("text", ["hello world", "naïve café — ok\n", "aaaa"])
def test_char_vocab_round_trip(text: str) -> None:
    vocab = CharVocab(text)
    assert len(vocab) == len(set(text))
    assert vocab.decode(vocab.encode(text)) == text
    assert vocab.decode(torch.tensor(vocab.encode(text))) == text


def test_char_vocab_unknown_character_raises() -> None:
    with pytest.raises(ValueError, match="'z'"):
        CharVocab("abc").encode("abz")


def test_unigram_entropy_matches_definition() -> None:
    text = "aab" * 10 + "c"
    counts, n = Counter(text), len(text)
    assert math.isclose(unigram_entropy(text), -sum(c / n * math.log(c / n) for c in counts.values()))
    assert unigram_entropy("aaaa") == 0.0
    assert math.isclose(unigram_entropy("abcd"), math.log(4))


def test_get_batch_targets_are_inputs_shifted() -> None:
    data = torch.arange(100)
    x, y = get_batch(data, 8, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 16)
    assert torch.equal(y, x + 1)
    with pytest.raises(ValueError, match="block_size"):
        get_batch(data[:10], 2, 16)


def test_load_text_user_file_utf8_and_gz(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("héllo\nworld\n", encoding="utf-8")
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress("zipped text\n".encode()))
    assert load_text(tmp_path / "a.txt") == "héllo\nworld\n"
    assert load_text(tmp_path / "b.txt.gz") == "zipped text\n"


def test_load_text_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nope.txt"):
        load_text(tmp_path / "nope.txt")
    with pytest.raises(ValueError, match="a folder, not a file"):
        load_text(tmp_path)


@pytest.mark.parametrize("content", [b"", b"  \n\n"])
def test_load_text_empty_file_raises(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "empty.txt").write_bytes(content)
    with pytest.raises(ValueError, match="empty.txt.*empty"):
        load_text(tmp_path / "empty.txt")


def test_load_text_non_utf8_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "latin.txt").write_bytes("line one\nline two\ncaf\xe9 three\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin.txt.*line 3, column 4"):
        load_text(tmp_path / "latin.txt")


def test_load_char_dataset_too_short_for_block(tmp_path: Path) -> None:
    (tmp_path / "short.txt").write_text("just a few words\n")
    with pytest.raises(ValueError, match="block-size"):
        load_char_dataset(tmp_path / "short.txt", min_val_chars=129)
