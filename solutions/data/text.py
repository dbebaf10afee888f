"""Character-level text for the chapter 6 model.

The embedded text is the glossary of the Jargon File 4.4.7 (public domain; see
``README_text.md``), about 770 kB of English, shipped as ``jargon.txt.gz``.
``load_text(path)`` reads your own UTF-8 text instead. Tokens are characters
(:class:`CharVocab`) or, with ``load_text_dataset(..., tokenizer="bpe")``, BPE
sub-words learnt from the training part of the text only.
"""

from __future__ import annotations

import gzip
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from solutions.data.tokenizer import DEFAULT_BPE_VOCAB, BPETokenizer

EMBEDDED_TEXT = Path(__file__).with_name("jargon.txt.gz")


def load_text(path: str | Path | None = None) -> str:
    """The embedded text (``path=None``) or the UTF-8 text file at ``path`` (``.gz`` is decompressed)."""
    if path is None:
        return gzip.decompress(EMBEDDED_TEXT.read_bytes()).decode("utf-8")
    path = Path(path)
    if not path.is_file():
        what = "a folder, not a file" if path.is_dir() else "no such file"
        raise ValueError(f"--data {path}: {what}; give the path of a UTF-8 text file")
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(
            f"--data {path}: not UTF-8 at line {line}, column {column} (byte {err.start}: "
            f"{raw[err.start:err.start + 1]!r}); re-save the file as UTF-8, e.g. iconv -f latin1 -t utf-8"
        ) from None
    if not text.strip():
        raise ValueError(f"--data {path}: the file is empty; give a text with at least a few thousand characters")
    return text


class CharVocab:
    """One token id per distinct character, in sorted order (no special tokens: a text model needs none)."""

    kind = "char"

    def __init__(self, text: str) -> None:
        if not text:
            raise ValueError("text is empty; a vocabulary needs at least one character")
        self.chars = sorted(set(text))
        self.index = {ch: i for i, ch in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.index[ch] for ch in text]
        except KeyError as err:
            raise ValueError(
                f"character {err.args[0]!r} is not in the vocabulary (built from the training text); "
                "use only characters that occur in it"
            ) from None

    def decode(self, ids: list[int] | Tensor) -> str:
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        if any(not 0 <= i < len(self.chars) for i in ids):
            raise ValueError(f"token ids must be in 0…{len(self.chars) - 1}")
        return "".join(self.chars[i] for i in ids)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "chars": list(self.chars)}

    @classmethod
    def from_dict(cls, state: dict) -> "CharVocab":
        return cls("".join(state["chars"]))


TextTokenizer = CharVocab | BPETokenizer


def text_tokenizer_from_dict(state: dict) -> TextTokenizer:
    """The character vocabulary or BPE tokenizer saved by ``to_dict()`` (in a gpt checkpoint)."""
    kind = state.get("kind") if isinstance(state, dict) else None
    if kind == "char":
        return CharVocab.from_dict(state)
    if kind == "bpe":
        return BPETokenizer.from_dict(state)
    raise ValueError(f"a saved text tokenizer must have kind 'char' or 'bpe'; got {kind!r}")


def unigram_entropy(text: str) -> float:
    """Entropy of the character distribution in nats: the loss of a model that ignores context."""
    counts = Counter(text)
    total = len(text)
    return -sum(c / total * math.log(c / total) for c in counts.values())


@dataclass(frozen=True)
class CharDataset:
    vocab: TextTokenizer  # characters ↔ ids (built from the whole text), or BPE pieces (from the training part)
    train: Int[Tensor, "seq"]  # the first (1 - val_fraction) of the text, as ids
    val: Int[Tensor, "seq"]  # the held-out tail
    unigram_loss: float  # entropy (nats/token) of the training tokens: the baseline to beat


def load_char_dataset(
    path: str | Path | None = None, val_fraction: float = 0.1, min_val_chars: int = 0
) -> CharDataset:
    """Text → ids, split into a training head and a held-out tail (contiguous, so no overlap)."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1); got {val_fraction}")
    text = load_text(path)
    split = int(len(text) * (1 - val_fraction))
    where = "the embedded text" if path is None else f"--data {path}"
    if len(text) - split < min_val_chars or split < min_val_chars:
        raise ValueError(
            f"{where} has only {len(text)} characters; with a {val_fraction:.0%} validation split each part needs "
            f"at least {min_val_chars} (block size + 1): use a longer text or a smaller --block-size"
        )
    vocab = CharVocab(text)
    ids = torch.tensor(vocab.encode(text), dtype=torch.long)
    return CharDataset(vocab, ids[:split], ids[split:], unigram_entropy(text[:split]))


def token_entropy(ids: Tensor) -> float:
    """Entropy of the token distribution in nats: the loss of a model that ignores context."""
    counts = torch.bincount(ids).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def load_text_dataset(
    path: str | Path | None = None, val_fraction: float = 0.1, min_val_tokens: int = 0, tokenizer: str = "char",
    vocab_size: int = DEFAULT_BPE_VOCAB,
) -> CharDataset:
    """Like :func:`load_char_dataset`, with ``tokenizer="bpe"`` for sub-words learnt from the training head only."""
    if tokenizer == "char":
        return load_char_dataset(path, val_fraction, min_val_tokens)
    if tokenizer != "bpe":
        raise ValueError(f"tokenizer must be 'char' or 'bpe'; got {tokenizer!r}")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1); got {val_fraction}")
    text = load_text(path)
    split = int(len(text) * (1 - val_fraction))
    vocab = BPETokenizer.train(text[:split].split("\n"), vocab_size)
    train = torch.tensor(vocab.encode(text[:split]), dtype=torch.long)
    val = torch.tensor(vocab.encode(text[split:]), dtype=torch.long)
    if min(len(train), len(val)) < min_val_tokens:
        where = "the embedded text" if path is None else f"--data {path}"
        raise ValueError(
            f"{where} gives {len(train)} training and {len(val)} held-out BPE tokens; each part needs at least "
            f"{min_val_tokens} (block size + 1): use a longer text or a smaller --block-size"
        )
    return CharDataset(vocab, train, val, token_entropy(train))


def get_batch(
    data: Int[Tensor, "seq"], batch_size: int, block_size: int, generator: torch.Generator | None = None
) -> tuple[Int[Tensor, "batch seq"], Int[Tensor, "batch seq"]]:
    """Random windows ``x`` and their next characters ``y`` (``x`` shifted left by one)."""
    if len(data) < block_size + 1:
        raise ValueError(f"the data has {len(data)} tokens; block_size={block_size} needs at least {block_size + 1}")
    start = torch.randint(0, len(data) - block_size, (batch_size,), generator=generator)
    offsets = torch.arange(block_size + 1)
    windows = data[start[:, None] + offsets]
    return windows[:, :-1], windows[:, 1:]
