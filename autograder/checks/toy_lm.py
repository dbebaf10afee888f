"""A stand-in language model for the chapter-6 generation checks: logits from a few tensors, and a log of every call.

The batched and speculative generation exercises take a model with ``config``, ``new_cache(batch)`` and
``forward(idx, cache=None, *, positions=None, padding=None)``. The checks cannot send a ``solutions.gpt.GPT`` to
the learner's kernel (only plain data crosses, and the library is hidden there), and a trained network would make
the expected answers hard to know. This model is three tensors sent as data: the probe builds it in the learner's
kernel, the judge builds the same one to compute the expected tokens and distributions, so both sides see exactly
the same logits. Its cache holds what was fed (inputs, real-token flags, token ids) and has ``truncate`` and
``retain`` as the chapter's caches do.
"""

from __future__ import annotations

import torch


class ToyConfig:
    def __init__(self, vocab: int, max_len: int) -> None:
        self.vocab, self.max_len = vocab, max_len


class ToyCache:
    """The toy model's cache: each held position's input vector, whether it is a real token (not padding) and its
    token id, per row. ``truncate`` and ``retain`` as the chapter's caches have them."""

    def __init__(self, batch: int, d: int) -> None:
        self.x = torch.zeros(batch, 0, d, dtype=torch.float64)
        self.real = torch.zeros(batch, 0, dtype=torch.bool)
        self.tokens = torch.zeros(batch, 0, dtype=torch.long)

    @property
    def batch(self) -> int:
        return self.x.shape[0]

    def __len__(self) -> int:
        return self.x.shape[1]

    def truncate(self, length: int) -> None:
        if not 0 <= length <= len(self):
            raise ValueError(f"length must be in 0…{len(self)} (the tokens held); got {length}")
        self.x, self.real, self.tokens = self.x[:, :length], self.real[:, :length], self.tokens[:, :length]

    def retain(self, rows: list[int]) -> None:
        index = torch.as_tensor(list(rows), dtype=torch.long)
        self.x, self.real, self.tokens = self.x[index], self.real[index], self.tokens[index]


class ToyLM(torch.nn.Module):
    """A tiny causal language model with the chapter 6 interface (``config.vocab``, ``config.max_len``,
    ``new_cache(batch)``, ``forward(idx, cache=None, *, positions=None, padding=None)``): the logits at a
    position depend on its token, its position and the mean of the real (not padding) inputs up to it, so
    padding that is not masked, positions counted from the padding or a cache holding rejected tokens all
    change them. It logs each call (where it started, what it was fed, with which positions and padding, what
    its cache held, whether autograd and training mode were on), refuses positions past ``max_len`` with a
    ValueError, and raises RuntimeError on call number ``fail_at`` when that is set."""

    def __init__(self, tokens: torch.Tensor, positions: torch.Tensor, out: torch.Tensor, fail_at: int = 0) -> None:
        super().__init__()
        self.tokens = torch.nn.Parameter(tokens.double())  # (vocab, d)
        self.positions = torch.nn.Parameter(positions.double())  # (max_len, d)
        self.out = torch.nn.Parameter(out.double())  # (d, vocab)
        self.config = ToyConfig(int(tokens.shape[0]), int(positions.shape[0]))
        self.fail_at = int(fail_at)
        self.calls: list[dict] = []
        self.name = "model"  # in the call log

    def new_cache(self, batch: int = 1) -> ToyCache:
        return ToyCache(batch, self.tokens.shape[1])

    def forward(self, idx: torch.Tensor, cache: ToyCache | None = None, *, positions: torch.Tensor | None = None,
                padding: torch.Tensor | None = None) -> torch.Tensor:
        start, (batch, seq) = (0 if cache is None else len(cache)), idx.shape
        self.calls.append({"model": self.name, "start": start, "idx": idx.detach().clone(), "grad": torch.is_grad_enabled(),
                           "training": self.training,
                           "positions": None if positions is None else torch.as_tensor(positions).detach().clone(),
                           "padding": None if padding is None else torch.as_tensor(padding).detach().clone(),
                           "held": None if cache is None else cache.tokens.clone()})
        if seq == 0:
            raise ValueError("idx holds no token: every call must feed at least one new token")
        if sum(call["model"] == self.name for call in self.calls) == self.fail_at:
            raise RuntimeError("the model failed on purpose in the middle of generation")
        if start + seq > self.config.max_len:
            raise ValueError(f"positions {start}..{start + seq - 1} go past the context limit "
                             f"max_len={self.config.max_len}")
        if cache is not None and cache.batch != batch:
            raise ValueError(f"the cache was made for batch={cache.batch}, idx has batch {batch}")
        if positions is None:
            positions = torch.arange(start, start + seq).expand(batch, seq)
        if tuple(positions.shape) != (batch, seq) or int(positions.max()) >= self.config.max_len or int(positions.min()) < 0:
            raise ValueError(f"positions must be (batch, seq) = {(batch, seq)} in 0…{self.config.max_len - 1}")
        if padding is None:
            padding = torch.ones(batch, start + seq, dtype=torch.bool)
        if padding.dtype != torch.bool or tuple(padding.shape) != (batch, start + seq):
            raise ValueError(f"padding must be a bool tensor (batch, cached + new) = {(batch, start + seq)}")
        x = self.tokens[idx] + self.positions[positions]
        real = padding[:, start:]
        held_x = x if cache is None else torch.cat((cache.x, x), dim=1)
        held_real = real if cache is None else torch.cat((cache.real, real), dim=1)
        total = (held_x * held_real[..., None]).cumsum(dim=1)[:, -seq:]
        count = held_real.cumsum(dim=1)[:, -seq:, None].clamp(min=1)
        logits = torch.tanh(x + total / count) @ self.out
        if cache is not None:
            cache.x, cache.real = held_x.detach(), held_real
            cache.tokens = torch.cat((cache.tokens, idx), dim=1)
        return logits
