"""solutions.data.tokenizer: word, char and BPE tokenizers round-trip text, share the special ids, save and load."""

from __future__ import annotations

import pytest

from solutions.data.tokenizer import BPETokenizer, tokenizer_from_dict, train_tokenizer
from solutions.data.translation import Vocab

TRAIN = [f"{m} {d}, {y}\t{y}-{d:02d}" for m in ("March", "May", "June") for d in range(1, 29) for y in (1999, 2021)]
TEXTS = [line.split("\t")[0] for line in TRAIN] + [line.split("\t")[1] for line in TRAIN]


@pytest.mark.parametrize("kind", ["bpe", "char", "word"])
def test_tokenizer_special_ids_and_save_load(kind):
    tokenizer = train_tokenizer(kind, TEXTS)
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (0, 1, 2, 3)
    assert (Vocab.pad_id, Vocab.bos_id, Vocab.eos_id) == (0, 1, 2)
    ids = tokenizer.encode("March 7, 2021")
    assert ids and min(ids) >= 4  # ordinary text never encodes to a special id
    loaded = tokenizer_from_dict(tokenizer.to_dict())
    assert loaded == tokenizer and loaded.encode("March 7, 2021") == ids
    # decode stops at EOS and skips PAD and BOS, like Vocab.decode.
    assert tokenizer.decode([tokenizer.bos_id, *ids, tokenizer.eos_id, *ids]) == tokenizer.decode(ids)
    assert tokenizer.decode(ids + [tokenizer.pad_id]) == tokenizer.decode(ids)


@pytest.mark.parametrize("text", ["2021-03-07", "March 7, 2021", "May  3,1999", "June\n1999", "2021"])
def test_bpe_and_char_decode_gives_back_the_exact_text(text):
    for kind in ("bpe", "char"):
        tokenizer = train_tokenizer(kind, TEXTS + ["a\nb"])
        assert tokenizer.decode(tokenizer.encode(text)) == text, kind


def test_word_tokenizer_splits_on_whitespace_only():
    tokenizer = train_tokenizer("word", TEXTS)
    assert tokenizer.decode(tokenizer.encode("  March   7, ")) == "March 7,"
    assert tokenizer.encode("2021-03-07") == [tokenizer.unk_id]  # one unseen "word": why word tokens fail here


def test_bpe_learns_frequent_pieces_within_the_vocab_size():
    tokenizer = train_tokenizer("bpe", TEXTS, vocab_size=40)
    assert len(tokenizer) <= 40
    assert len(tokenizer.pieces("March")) < len("▁March")  # merged: fewer pieces than characters
    # ▁ marks the start of the text; digits are split, so every year shares the same ten pieces.
    assert tokenizer.pieces("2021") == ["▁", "2", "0", "2", "1"]
    bigger = train_tokenizer("bpe", TEXTS, vocab_size=2000)
    assert len(tokenizer) < len(bigger) < 2000  # a soft limit: the small text has fewer pieces to learn
    assert bigger.pieces("March") == ["▁March"]


def test_bpe_training_is_deterministic():
    assert train_tokenizer("bpe", TEXTS) == train_tokenizer("bpe", list(TEXTS))


@pytest.mark.parametrize("kind, texts, vocab_size, match", [
    ("bpe", TEXTS, 5, "--vocab-size must be an int of at least 6"),
    ("bpe", ["", ""], 100, "no text to train"),
    ("bpe", ["abcdefghijklmnopqrstuvwxyz0123456789"], 10, "Raise --vocab-size"),
    ("sentencepiece", TEXTS, None, "tokenizer must be one of"),
])
def test_train_tokenizer_rejects_bad_arguments(kind, texts, vocab_size, match):
    with pytest.raises(ValueError, match=match):
        train_tokenizer(kind, texts, vocab_size)


def test_tokenizer_from_dict_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        tokenizer_from_dict({"kind": "bytes"})
    assert isinstance(tokenizer_from_dict(train_tokenizer("bpe", TEXTS).to_dict()), BPETokenizer)
