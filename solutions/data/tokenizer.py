"""Text → token ids for your own data: words, characters or BPE sub-words.

Every tokenizer here has the same interface and the special ids of
:class:`~solutions.data.translation.Vocab` (``<pad>`` 0, ``<bos>`` 1,
``<eos>`` 2, ``<unk>`` 3): ``encode(text) -> ids`` (no BOS/EOS),
``decode(ids) -> text`` (stops at EOS, skips PAD and BOS), ``len()``,
``to_dict()`` and :func:`tokenizer_from_dict` to save it inside a checkpoint.

- ``word``: split on whitespace, one id per distinct word of the training
  text. Right for text that is already tokenised (the embedded number words);
  hopeless when a side has no spaces: every distinct string becomes one token
  that is seen once, and nothing generalises.
- ``char``: one id per distinct character. Never too coarse; sequences are long.
- ``bpe``: byte-pair encoding (Sennrich et al., 2016), as in "Attention Is All
  You Need": start from characters and merge the most frequent adjacent pair
  until there are ``vocab_size`` pieces, so frequent strings become one token
  and rare ones fall back to smaller pieces. Trained with sentencepiece, which
  treats the space as an ordinary symbol (``▁``): text without spaces works,
  and with the identity normalisation used here ``decode(encode(text)) == text``
  for every character seen in training.
"""

from __future__ import annotations

import io
from typing import Iterable, Sequence, Union

import sentencepiece

from solutions.data.translation import SPECIALS, Vocab

TOKENIZER_KINDS = ("bpe", "char", "word")
DEFAULT_BPE_VOCAB = 1000


class _VocabTokenizer:
    """A :class:`Vocab` over the units that :meth:`split` cuts a text into; :meth:`join` glues them back."""

    kind = ""
    pad_id, bos_id, eos_id, unk_id = Vocab.pad_id, Vocab.bos_id, Vocab.eos_id, Vocab.unk_id

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab

    @staticmethod
    def split(text: str) -> list[str]:
        raise NotImplementedError

    @staticmethod
    def join(units: list[str]) -> str:
        raise NotImplementedError

    @classmethod
    def train(cls, texts: Iterable[str]) -> "_VocabTokenizer":
        """Every unit of ``texts``, sorted (so the ids do not depend on the order of the data)."""
        return cls(Vocab.build(cls.split(text) for text in texts))

    def __len__(self) -> int:
        return len(self.vocab)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.vocab == other.vocab

    def encode(self, text: str) -> list[int]:
        return self.vocab.encode(self.split(text))

    def decode(self, ids: Iterable[int]) -> str:
        return self.join(self.vocab.decode(ids))

    def to_dict(self) -> dict:
        return {"kind": self.kind, **self.vocab.to_dict()}

    @classmethod
    def from_dict(cls, state: dict) -> "_VocabTokenizer":
        return cls(Vocab.from_dict(state))


class WordTokenizer(_VocabTokenizer):
    """Whitespace-separated words; decoding joins them with single spaces."""

    kind = "word"

    @staticmethod
    def split(text: str) -> list[str]:
        return text.split()

    @staticmethod
    def join(units: list[str]) -> str:
        return " ".join(units)


class CharTokenizer(_VocabTokenizer):
    """One token per character, spaces included; decoding concatenates them."""

    kind = "char"

    @staticmethod
    def split(text: str) -> list[str]:
        return list(text)

    @staticmethod
    def join(units: list[str]) -> str:
        return "".join(units)


class BPETokenizer:
    """Byte-pair encoding sub-words, trained and applied by sentencepiece (the model is kept as bytes)."""

    kind = "bpe"
    pad_id, bos_id, eos_id, unk_id = Vocab.pad_id, Vocab.bos_id, Vocab.eos_id, Vocab.unk_id

    def __init__(self, model_proto: bytes) -> None:
        self.model_proto = bytes(model_proto)
        self.processor = sentencepiece.SentencePieceProcessor(model_proto=self.model_proto)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = DEFAULT_BPE_VOCAB) -> "BPETokenizer":
        """Learn at most ``vocab_size`` pieces (fewer when the text has fewer) from ``texts``, one sentence each.

        A newline inside a text is kept as a piece of its own, so multi-line text round-trips.
        """
        if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < len(SPECIALS) + 2:
            raise ValueError(f"--vocab-size must be an int of at least {len(SPECIALS) + 2}; got {vocab_size!r}")
        sentences = [text for text in texts if text]
        if not sentences:
            raise ValueError("no text to train the BPE tokenizer on; give at least one non-empty line")
        model = io.BytesIO()
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences), model_writer=model, model_type="bpe", vocab_size=vocab_size,
                hard_vocab_limit=False,  # a soft limit: small data gets fewer pieces instead of an error
                character_coverage=1.0,  # every character of the training text is a piece: none is <unk>
                normalization_rule_name="identity", remove_extra_whitespaces=False,  # decode gives back the text
                split_digits=True,  # numbers as digits: "2021" and "1987" share their pieces
                user_defined_symbols=["\n"], max_sentence_length=1 << 20, num_threads=1, minloglevel=2,
                pad_id=0, bos_id=1, eos_id=2, unk_id=3,
                pad_piece=SPECIALS[0], bos_piece=SPECIALS[1], eos_piece=SPECIALS[2], unk_piece=SPECIALS[3],
            )
        except RuntimeError as err:  # e.g. "Vocabulary size is smaller than required_chars. 50 vs 68."
            raise ValueError(
                f"BPE training failed: {err}. Raise --vocab-size above the number of distinct characters "
                "plus 4, or use --tokenizer char"
            ) from None
        return cls(model.getvalue())

    def __len__(self) -> int:
        return self.processor.get_piece_size()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BPETokenizer) and self.model_proto == other.model_proto

    def encode(self, text: str) -> list[int]:
        return self.processor.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        kept = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i not in (self.pad_id, self.bos_id) and 0 <= i < len(self):
                kept.append(i)
        return self.processor.decode(kept)

    def pieces(self, text: str) -> list[str]:
        """The sub-word pieces of ``text`` (``▁`` marks a space), to see what the model reads."""
        return self.processor.encode(text, out_type=str)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "sentencepiece_model": self.model_proto}

    @classmethod
    def from_dict(cls, state: dict) -> "BPETokenizer":
        return cls(state["sentencepiece_model"])


Tokenizer = Union[WordTokenizer, CharTokenizer, BPETokenizer]
_CLASSES = {"word": WordTokenizer, "char": CharTokenizer, "bpe": BPETokenizer}


def train_tokenizer(kind: str, texts: Sequence[str], vocab_size: int | None = None) -> Tokenizer:
    """A tokenizer of ``kind`` ("bpe", "char" or "word") learnt from ``texts`` (give it the training split only)."""
    if kind not in _CLASSES:
        raise ValueError(f"tokenizer must be one of {TOKENIZER_KINDS}; got {kind!r}")
    if kind == "bpe":
        return BPETokenizer.train(texts, DEFAULT_BPE_VOCAB if vocab_size is None else vocab_size)
    return _CLASSES[kind].train(texts)


def tokenizer_from_dict(state: dict) -> Tokenizer:
    """The tokenizer saved by ``to_dict()``."""
    kind = state.get("kind") if isinstance(state, dict) else None
    if kind not in _CLASSES:
        raise ValueError(f"a saved tokenizer must have kind in {TOKENIZER_KINDS}; got {kind!r}")
    return _CLASSES[kind].from_dict(state)
