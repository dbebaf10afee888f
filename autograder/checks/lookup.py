"""A stand-in translation model for the chapter-4 decoding checks: next-token logits from tables.

The decoding exercises (greedy and beam search) take a decoder (``solutions.decoding.Decoder``'s
protocol) over a model with ``encode``/``decode``. The checks cannot send a
``solutions.transformer.Transformer`` to the learner's kernel (only plain data crosses, and the
library is hidden there), and a trained network would make the expected answers hard to know.
This model is a few tables sent as tensors: the probe builds it (and :class:`LookupDecoder` over
it) in the learner's kernel, the judge builds the same one to compute the answer (by brute
force), so both sides see exactly the same probabilities.

Source row ``b`` uses table ``src[b, 0]``. After the prefix ``y_0 … y_t`` (``y_0`` = BOS) the
logits of the next token are ``first[table, t, y_t] + second[table, t, y_(t-1)]``, with
``y_(-1)`` = row ``vocab`` of ``second``: two tokens of history, so a beam that continues the
wrong parent's history gets the wrong logits. In train mode ``noise[table, t]`` is added, as
dropout would: decoding must switch it off (``eval()``) and restore the mode afterwards.

It speaks the protocol of ``solutions.transformer.Transformer``: ``config`` (``tgt_vocab``,
``max_len``, ``pad_id``), ``encode(src)``, ``decode(tgt_in, memory, src, cache=None)``,
``new_cache(memory, max_len=None)`` (a cache that holds the prefix and has ``reorder``),
``train``/``eval``/``training``; and it counts what it is asked to do.

:class:`LookupDecoder` speaks the protocol of ``solutions.decoding.Decoder`` (``batch``, ``device``,
``log_probs(tokens)``, ``reorder(rows)``) over such a model, and keeps its rows' state as a cached
decoder does: each row remembers the prefix it was fed and a call reads only the tokens after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class LookupConfig:
    tgt_vocab: int  # token ids 0 … tgt_vocab-1
    max_len: int  # decoder positions the tables cover
    pad_id: int  # fed after a row has finished


class LookupCache:
    """The prefix each row has fed so far; ``reorder(index)`` keeps rows ``index``."""

    def __init__(self, batch: int, max_len: int) -> None:
        self.tokens = torch.zeros(batch, 0, dtype=torch.long)
        self.max_len = max_len

    def __len__(self) -> int:
        return self.tokens.shape[1]

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    def reorder(self, index: Tensor) -> None:
        self.tokens = self.tokens[index]


class LookupModel:
    """``first`` ``(tables, max_len, vocab, vocab)``, ``second`` ``(tables, max_len, vocab + 1, vocab)``,
    ``noise`` ``(tables, max_len, vocab)``; ``pad_id`` as in a real model's config."""

    def __init__(self, first: Tensor, second: Tensor, noise: Tensor, pad_id: int) -> None:
        tables, max_len, vocab, _ = first.shape
        self.first, self.second, self.noise = first, second, noise
        self.config = LookupConfig(tgt_vocab=vocab, max_len=max_len, pad_id=pad_id)
        self.training = False
        self.encode_calls = 0
        self.fed: list[int] = []  # tokens per row fed to each decode call

    def train(self, mode: bool = True) -> "LookupModel":
        self.training = bool(mode)
        return self

    def eval(self) -> "LookupModel":
        return self.train(False)

    def encode(self, src: Tensor) -> Tensor:
        """The "memory": the table id of each row, shape ``(batch, seq_k, 1)`` like an encoder output."""
        self.encode_calls += 1
        if src.dim() != 2:
            raise ValueError(f"src must be (batch, seq); got shape {tuple(src.shape)}")
        return src.to(torch.float32)[..., None]

    def new_cache(self, memory: Tensor, max_len: int | None = None) -> LookupCache:
        return LookupCache(memory.shape[0], self.config.max_len if max_len is None else max_len)

    def decode(self, tgt_in: Tensor, memory: Tensor, src: Tensor, cache: LookupCache | None = None) -> Tensor:
        """Logits ``(batch, seq_q, vocab)``; with a cache, ``tgt_in`` holds only the new tokens."""
        if memory.shape[:2] != src.shape[:2] or tgt_in.shape[0] != src.shape[0]:
            raise ValueError(f"tgt_in {tuple(tgt_in.shape)}, memory {tuple(memory.shape)} and src "
                             f"{tuple(src.shape)} must have the same rows (and memory and src the same seq_k)")
        if tgt_in.dim() != 2 or tgt_in.is_floating_point():
            raise ValueError(f"tgt_in must be (batch, seq) token ids; got {tuple(tgt_in.shape)} {tgt_in.dtype}")
        start = 0
        prefix = tgt_in
        if cache is not None:
            if cache.batch != tgt_in.shape[0]:
                raise ValueError(f"the cache holds {cache.batch} rows but tgt_in has {tgt_in.shape[0]}")
            start = len(cache)
            prefix = torch.cat([cache.tokens, tgt_in], dim=1)
        end = prefix.shape[1]
        if end > self.config.max_len:
            raise ValueError(f"{end} target positions go past max_len={self.config.max_len}")
        vocab = self.config.tgt_vocab
        if prefix.numel() and (prefix.min() < 0 or prefix.max() >= vocab):
            raise ValueError(f"tgt_in holds ids outside the vocabulary [0, {vocab})")
        self.fed.append(tgt_in.shape[1])
        table = memory[:, 0, 0].round().long()[:, None]  # (batch, 1)
        positions = torch.arange(start, end)[None, :]  # (1, new)
        last = prefix[:, start:end]
        before = torch.cat([torch.full_like(prefix[:, :1], vocab), prefix], dim=1)[:, start:end]
        logits = self.first[table, positions, last] + self.second[table, positions, before]
        if self.training:
            logits = logits + self.noise[table, positions]
        if cache is not None:
            cache.tokens = prefix
        return logits


class LookupDecoder:
    """``solutions.decoding.Decoder``'s protocol over a :class:`LookupModel` (eval mode), keeping each row's state the
    way a cached decoder does.

    Each row remembers the prefix it has been fed; ``log_probs(tokens)`` reads only the tokens after it and
    computes from the remembered prefix. A search that re-indexes its prefixes without ``reorder(rows)`` therefore
    gets the log-probabilities of another beam's history, as it would with a real cache. It records the rows of
    every call (``calls``), the calls whose prefixes disagreed with the rows' history (``mismatches``) and the
    ``reorder`` calls (``reorders``).
    """

    def __init__(self, first: Tensor, second: Tensor, pad_id: int, src: Tensor) -> None:
        self.model = LookupModel(first, second, torch.zeros(first.shape[:3]), pad_id)
        self.src = src
        self.memory = self.model.encode(src)
        self.history = torch.zeros(src.shape[0], 0, dtype=torch.long)
        self.calls: list[int] = []
        self.mismatches = 0
        self.reorders = 0

    @property
    def batch(self) -> int:
        return self.src.shape[0]

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def log_probs(self, tokens: Tensor) -> Tensor:
        """log p(next token) ``(batch, vocab)`` after each row's prefix ``tokens`` (BOS first)."""
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
            raise ValueError(f"tokens must be a (batch, seq) tensor of token ids; got "
                             f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
        if tokens.shape[0] != self.batch:
            raise ValueError(f"the decoder holds {self.batch} rows (after the reorder calls so far) and tokens has "
                             f"{tokens.shape[0]}: call decoder.reorder(rows) whenever the rows change")
        self.calls.append(int(tokens.shape[0]))
        known = self.history.shape[1]
        if tokens.shape[1] > known:
            if not torch.equal(tokens[:, :known], self.history):
                self.mismatches += 1
            prefix = torch.cat([self.history, tokens[:, known:]], dim=1)  # what a cache would compute from
            self.history = prefix
        else:
            prefix = tokens  # a prefix fed again: computed whole, the state unchanged
        return self.model.decode(prefix, self.memory, self.src)[:, -1].float().log_softmax(dim=-1)

    def reorder(self, rows: Tensor) -> None:
        """Row i continues old row ``rows[i]`` (rows may repeat or be left out)."""
        if not isinstance(rows, Tensor) or rows.dim() != 1 or rows.is_floating_point() or rows.dtype == torch.bool:
            raise ValueError("rows must be a 1-D tensor of row numbers")
        self.reorders += 1
        self.src, self.memory, self.history = self.src[rows], self.memory[rows], self.history[rows]
