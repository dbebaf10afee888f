"""solutions.data.translation: the number grammar, splits by number, Vocab, and the TSV loader's errors."""

from __future__ import annotations

import random

import pytest

from solutions.data.translation import (
    MAX_NUMBER, Vocab, english, german, german_word, load_numbers, load_tsv, number_splits, pad_batch, split_pairs,
    split_text_pairs,
)

# Written German number words, checked by hand against a dictionary.
GERMAN = {
    0: "null", 1: "eins", 7: "sieben", 11: "elf", 12: "zwölf", 16: "sechzehn", 17: "siebzehn", 20: "zwanzig",
    21: "einundzwanzig", 30: "dreißig", 42: "zweiundvierzig", 99: "neunundneunzig", 100: "einhundert",
    101: "einhunderteins", 121: "einhunderteinundzwanzig", 1000: "eintausend", 1001: "eintausendeins",
    21000: "einundzwanzigtausend", 100000: "einhunderttausend", 101001: "einhunderteintausendeins",
    342506: "dreihundertzweiundvierzigtausendfünfhundertsechs",
    999999: "neunhundertneunundneunzigtausendneunhundertneunundneunzig",
}
ENGLISH = {
    0: "zero", 1: "one", 13: "thirteen", 42: "forty - two", 100: "one hundred", 101: "one hundred one",
    1021: "one thousand twenty - one", 342506: "three hundred forty - two thousand five hundred six",
    999999: "nine hundred ninety - nine thousand nine hundred ninety - nine",
}


@pytest.mark.parametrize("n", sorted(GERMAN))
def test_german_matches_written_words(n):
    assert german_word(german(n)) == GERMAN[n]


@pytest.mark.parametrize("n", sorted(ENGLISH))
def test_english_matches_written_words(n):
    assert " ".join(english(n)) == ENGLISH[n]


def parse_german(pieces):
    """An independent reader of the German pieces (the inverse of german())."""
    values = {w: i for i, w in enumerate(
        "null ein zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn vierzehn fünfzehn "
        "sechzehn siebzehn achtzehn neunzehn".split())}
    values["eins"] = 1
    tens = {w: 10 * i for i, w in enumerate("_ _ zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig".split())}
    total, group, pending = 0, 0, 0
    for p in pieces:
        if p in values:
            pending = values[p]
        elif p == "und":
            continue
        elif p in tens:
            group += tens[p] + pending
            pending = 0
        elif p == "hundert":
            group += 100 * pending
            pending = 0
        elif p == "tausend":
            total += 1000 * (group + pending)
            group = pending = 0
    return total + group + pending


def test_german_and_english_cover_the_range_consistently():
    for n in list(range(0, 2000)) + list(range(0, MAX_NUMBER + 1, 997)) + [MAX_NUMBER]:
        pieces = german(n)
        assert parse_german(pieces) == n
        assert ("eins" in pieces) == (n % 100 == 1)  # "eins" only at the very end
        assert pieces[-1] != "ein"
        assert len(english(n)) <= 11 and len(pieces) <= 11


@pytest.mark.parametrize("bad", [-1, MAX_NUMBER + 1, 1.0, "3", True])
def test_number_words_reject_out_of_range(bad):
    with pytest.raises(ValueError, match="n must be"):
        german(bad)
    with pytest.raises(ValueError, match="n must be"):
        english(bad)


@pytest.mark.parametrize("seed", [0, 1])
def test_number_splits_are_disjoint_and_deterministic(seed):
    train, validation, test = number_splits(5000, 300, 600, seed)
    assert (len(train), len(validation), len(test)) == (5000, 300, 600)
    assert len(set(validation)) == 300 and len(set(test)) == 600
    assert not set(train) & set(test) and not set(train) & set(validation) and not set(validation) & set(test)
    assert (train, validation, test) == number_splits(5000, 300, 600, seed)
    assert all(100 <= n <= MAX_NUMBER for n in validation + test)
    assert set(range(100)) <= set(train)  # the words of the language are all seen in training
    assert any(n >= 100_000 for n in train) and any(n < 10 for n in train)


def test_load_numbers_pairs_and_vocabularies():
    data = load_numbers(n_train=3000, n_validation=50, n_test=100, seed=3)
    assert len(data.train) == 3000 and len(data.validation) == 50 and len(data.test) == 100
    held = {tuple(s) for s, _ in data.test}
    assert not held & {tuple(s) for s, _ in data.train}
    for source, target in data.test + data.train[:100]:
        assert parse_german(target) is not None and " ".join(target) == " ".join(german(parse_german(target)))
        assert english(parse_german(target)) == source
    # Every token of every split is in the vocabularies (built from training).
    for source, target in data.test:
        assert Vocab.unk_id not in data.src_vocab.encode(source)
        assert Vocab.unk_id not in data.tgt_vocab.encode(target)
    assert data.max_lengths() <= (11, 11)
    assert load_numbers(n_train=3000, n_validation=50, n_test=100, seed=3) == data


def test_vocab_roundtrip_and_specials():
    vocab = Vocab.build([["b", "a"], ["c", "a"]])
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2, 3)
    assert vocab.itos[:4] == ["<pad>", "<bos>", "<eos>", "<unk>"] and len(vocab) == 7
    ids = vocab.encode(["a", "c", "zzz"])
    assert ids == [4, 6, 3]
    assert vocab.decode([1] + ids + [2, 5, 0]) == ["a", "c", "<unk>"]  # stops at EOS
    assert Vocab.from_dict(vocab.to_dict()) == vocab


def test_pad_batch_right_pads():
    batch = pad_batch([[5, 6, 7], [8], []])
    assert batch.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match="sequences"):
        pad_batch([])


def test_load_tsv_reads_pairs(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("the cat\tdie Katze\n\nhello  world \t hallo Welt\r\n", encoding="utf-8")
    assert load_tsv(path) == [(["the", "cat"], ["die", "Katze"]), (["hello", "world"], ["hallo", "Welt"])]


@pytest.mark.parametrize("content, line, words", [
    (b"a\tb\nno tab here\n", 2, "no tab"),
    (b"a\tb\nc\td\te\n", 2, "2 tabs"),
    (b"a\tb\n  \tx\n", 2, "source side is empty"),
    (b"a\t\n", 1, "target side is empty"),
    (b"a\tb\nc\td\n\xff\xfe\tx\n", 3, "UTF-8"),
])
def test_load_tsv_errors_name_file_and_line(tmp_path, content, line, words):
    path = tmp_path / "bad.tsv"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"bad.tsv, line {line}: .*{words}"):
        load_tsv(path)


def test_load_tsv_missing_and_empty_files(tmp_path):
    with pytest.raises(ValueError, match="missing.tsv: no such file"):
        load_tsv(tmp_path / "missing.tsv")
    with pytest.raises(ValueError, match="a folder, not a file; --data needs a TSV file"):
        load_tsv(tmp_path)
    for content in (b"", b"\n\n  \n"):
        (tmp_path / "empty.tsv").write_bytes(content)
        with pytest.raises(ValueError, match="empty.tsv: the file is empty"):
            load_tsv(tmp_path / "empty.tsv")


def test_split_pairs_is_a_random_partition():
    pairs = [([f"s{i}"], [f"t{i}"]) for i in range(200)]
    data = split_pairs(pairs, test_fraction=0.1, validation_fraction=0.05, seed=1)
    assert (len(data.train), len(data.validation), len(data.test)) == (170, 10, 20)
    assert sorted(data.train + data.validation + data.test) == sorted(pairs)
    assert data.test != pairs[:20]  # shuffled
    repeated = pairs + pairs[:5]
    assert split_pairs(repeated, test_fraction=0.1, validation_fraction=0.05, seed=1) == data  # repeats dropped
    with pytest.raises(ValueError, match="at least 3 different sources"):
        split_pairs(pairs[:2] + [(["s0"], ["other"])])
    with pytest.raises(ValueError, match="test_fraction"):
        split_pairs(pairs, test_fraction=1.5)


def test_split_text_pairs_holds_out_distinct_sources_and_reports_duplicates():
    distinct = [(f"s{i}", f"t{i}") for i in range(100)] + [("s5", "other"), ("s7", "another")]
    pairs = distinct + distinct[:30]  # 30 repeated lines
    random.Random(0).shuffle(pairs)
    splits = split_text_pairs(pairs, test_fraction=0.2, seed=3, source="p.tsv")
    assert splits.duplicates == 30
    assert sorted(splits.train + splits.test) == sorted(distinct)  # each distinct pair once
    test_sources = {s for s, _ in splits.test}
    assert len(test_sources) == 20 and not test_sources & {s for s, _ in splits.train}
    for source in ("s5", "s7"):  # a source with two targets keeps both in one split
        assert sum(s == source for s, _ in splits.test) in (0, 2)
    assert splits.description.startswith(
        "p.tsv: 132 lines, 30 duplicates dropped; 102 distinct pairs with 100 distinct sources (2 with more than one "
        "target, kept in one split), split at random by source (seed 3) into ")
    assert splits.description.endswith(" test pairs; no test source occurs in training")
    assert split_text_pairs(pairs, test_fraction=0.2, seed=3, source="p.tsv") == splits  # deterministic
