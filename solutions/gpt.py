"""Chapter 6 — a decoder-only Transformer and KV-cache inference.

Generation is one token at a time. Recomputing the whole prefix at every step
costs O(n²) attention work per step; the keys and values of earlier tokens never
change (a token only looks backwards), so each layer keeps them in a cache and a
step only computes the new token's row: O(n) per step.

    cache bytes = 2 (K and V) · layers · kv_heads · d_head · seq · batch · bytes

Grouped-query attention (``n_kv_heads < n_heads``) and multi-query attention
(``n_kv_heads = 1``) shrink the cache by ``n_heads / n_kv_heads``.

Positions are learned absolute embeddings (``LearnedPositionalEmbedding``,
chapter 3), as in GPT-2: a cached step only needs ``start_pos = len(cache)``,
and the hard context limit ``max_len`` is explicit, so going past it is a clear
error instead of silent extrapolation.

The next token is chosen from the last position's logits: the argmax (greedy,
``temperature=0``) or a sample of ``softmax(logits / T)``, optionally restricted
to the ``top_k`` most likely tokens and then to the smallest set whose
probability reaches ``top_p`` (nucleus sampling, Holtzman et al. 2020).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import rearrange
from jaxtyping import Float, Int
from torch import Tensor, nn

from solutions.attention import attention
from solutions.positional import LearnedPositionalEmbedding


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class GPTConfig:
    vocab: int  # number of token ids (characters for the char-level model)
    max_len: int = 256  # context limit: positions 0…max_len-1 exist, nothing beyond
    d_model: int = 128  # width of the residual stream
    n_heads: int = 4  # query heads per layer; d_model must divide by it
    n_layers: int = 4  # number of pre-norm decoder blocks
    n_kv_heads: int | None = None  # key/value heads: None = n_heads (MHA), fewer = GQA, 1 = MQA
    dropout: float = 0.0  # on embeddings, attention weights and residual branches while training
    d_ff: int | None = None  # hidden width of the feed-forward net; None = 4 · d_model

    def __post_init__(self) -> None:
        for name in ("vocab", "max_len", "d_model", "n_heads", "n_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int; got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"GPTConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"pick n_heads from {_divisors(self.d_model)}"
            )
        if self.n_kv_heads is not None and (
            not isinstance(self.n_kv_heads, int) or self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads
        ):
            raise ValueError(
                f"GPTConfig.n_kv_heads={self.n_kv_heads!r} must divide n_heads={self.n_heads}; "
                f"pick n_kv_heads from {_divisors(self.n_heads)} (or None for n_heads)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1); got {self.dropout!r}")
        if self.d_ff is not None and (not isinstance(self.d_ff, int) or self.d_ff < 1):
            raise ValueError(f"GPTConfig.d_ff must be a positive int or None (= 4·d_model); got {self.d_ff!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def hidden(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff


def kv_cache_bytes(
    n_layers: int,
    n_kv_heads: int,
    d_head: int,
    seq_len: int,
    batch: int = 1,
    dtype: torch.dtype = torch.float32,
) -> int:
    """Bytes held by a KV cache: ``2 · layers · kv_heads · d_head · seq_len · batch · bytes_per_element``."""
    for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("d_head", d_head), ("batch", batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 0:
        raise ValueError(f"seq_len must be a non-negative int; got {seq_len!r}")
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype such as torch.float16; got {dtype!r}")
    return 2 * n_layers * n_kv_heads * d_head * seq_len * batch * dtype.itemsize


class KVCache:
    """Each layer's keys and values for the tokens seen so far.

    The buffers are allocated once for ``max_len`` positions and filled in place:
    appending with ``torch.cat`` would copy the whole cache at every step (see
    ``python -m solutions.bench``). ``len(cache)`` is the number of tokens held;
    ``cache.keys(i)`` / ``cache.values(i)`` are views ``(batch, kv_heads, len, d_head)``.
    """

    def __init__(
        self,
        n_layers: int,
        batch: int,
        kv_heads: int,
        max_len: int,
        d_head: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (batch, kv_heads, max_len, d_head)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.batch, self.max_len, self.length = batch, max_len, 0

    def __len__(self) -> int:
        return self.length

    def keys(self, layer: int) -> Float[Tensor, "batch kv_heads seq d_head"]:
        return self.k[layer][:, :, : self.length]

    def values(self, layer: int) -> Float[Tensor, "batch kv_heads seq d_head"]:
        return self.v[layer][:, :, : self.length]

    def nbytes(self) -> int:
        """Bytes of the filled part (what :func:`kv_cache_bytes` predicts for ``len(cache)``)."""
        return sum(self.keys(i).nbytes + self.values(i).nbytes for i in range(len(self.k)))

    def allocated_bytes(self) -> int:
        """Bytes actually allocated (the buffers hold ``max_len`` positions)."""
        return sum(t.nbytes for t in self.k + self.v)

    def write(
        self,
        layer: int,
        k: Float[Tensor, "batch kv_heads seq d_head"],
        v: Float[Tensor, "batch kv_heads seq d_head"],
    ) -> tuple[Float[Tensor, "batch kv_heads seq_k d_head"], Float[Tensor, "batch kv_heads seq_k d_head"]]:
        """Store the new keys/values after the held ones; return all of them (held + new).

        The length only advances in :meth:`advance`, once every layer has written.
        """
        end = self.length + k.shape[-2]
        if end > self.max_len:  # a slice past the buffer would silently come back shorter
            raise ValueError(
                f"{self.length} held + {k.shape[-2]} new positions exceed the cache's max_len={self.max_len}"
            )
        self.k[layer][:, :, self.length : end] = k
        self.v[layer][:, :, self.length : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, n_tokens: int) -> None:
        self.length += n_tokens


class CausalSelfAttention(nn.Module):
    """Causal self-attention with ``n_heads`` query heads and ``kv_heads`` key/value heads."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_heads, self.kv_heads, self.d_head = config.n_heads, config.kv_heads, config.d_head
        self.dropout = config.dropout
        self.q_proj = nn.Linear(config.d_model, config.n_heads * config.d_head)
        # K and V in one matmul; with GQA/MQA it is smaller than Q's projection.
        self.kv_proj = nn.Linear(config.d_model, 2 * config.kv_heads * config.d_head)
        self.out_proj = nn.Linear(config.d_model, config.d_model)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: Float[Tensor, "batch seq d_model"], cache: KVCache | None = None, layer: int = 0
    ) -> Float[Tensor, "batch seq d_model"]:
        """The new tokens' outputs; with ``cache``, their keys/values go to layer ``layer`` of it first and the
        new queries attend to everything it holds (the prefix and themselves)."""
        q = rearrange(self.q_proj(x), "batch seq (heads d_head) -> batch heads seq d_head", heads=self.n_heads)
        k, v = rearrange(
            self.kv_proj(x), "batch seq (two kv_heads d_head) -> two batch kv_heads seq d_head",
            two=2, kv_heads=self.kv_heads,
        )
        if cache is not None:
            k, v = cache.write(layer, k, v)
        # is_causal is end-aligned: the new queries see the cached prefix and themselves.
        out = attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.out_proj(rearrange(out, "batch heads seq d_head -> batch seq (heads d_head)")))


class MLP(nn.Module):
    """Position-wise feed-forward: ``down(gelu(up(x)))``, then dropout."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.d_model, config.hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(config.hidden, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Float[Tensor, "batch seq d_model"]) -> Float[Tensor, "batch seq d_model"]:
        return self.dropout(self.down(self.act(self.up(x))))


class Block(nn.Module):
    """Pre-norm decoder block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(
        self, x: Float[Tensor, "batch seq d_model"], cache: KVCache | None = None, layer: int = 0
    ) -> Float[Tensor, "batch seq d_model"]:
        x = x + self.attn(self.norm1(x), cache, layer)
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Token + learned position embeddings, ``n_layers`` pre-norm blocks, final norm, tied output head."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ValueError(f"config must be a GPTConfig; got {type(config).__name__}")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab, config.d_model)
        self.position = LearnedPositionalEmbedding(config.max_len, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab, bias=False)
        self.lm_head.weight = self.token_embedding.weight  # weight tying: one matrix reads and writes tokens
        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream by 1/√(2·layers),
        # picked by name (attn.out_proj, mlp.down) so that reordering a block cannot pick the wrong one.
        for name, param in self.named_parameters():
            if name.endswith(("attn.out_proj.weight", "mlp.down.weight")):
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * config.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def new_cache(self, batch: int = 1) -> KVCache:
        """An empty cache for ``batch`` sequences, on the model's device and dtype."""
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch must be a positive int; got {batch!r}")
        weight = self.token_embedding.weight
        c = self.config
        return KVCache(c.n_layers, batch, c.kv_heads, c.max_len, c.d_head, dtype=weight.dtype, device=weight.device)

    def forward(self, idx: Int[Tensor, "batch seq"], cache: KVCache | None = None) -> Float[Tensor, "batch seq vocab"]:
        """Logits for every position. With ``cache``, ``idx`` holds only the new tokens
        (positions ``len(cache)…``) and the cache is extended in place."""
        if idx.dim() != 2 or idx.is_floating_point():
            raise ValueError(f"idx must be integer token ids of shape (batch, seq); got {idx.dtype} {tuple(idx.shape)}")
        start = 0 if cache is None else len(cache)
        if start + idx.shape[1] > self.config.max_len:
            raise ValueError(
                f"{start} cached + {idx.shape[1]} new tokens exceed the context limit max_len={self.config.max_len}; "
                "shorten the input (keep its last max_len tokens) or build the model with a larger max_len"
            )
        if cache is not None and cache.batch != idx.shape[0]:
            raise ValueError(f"the cache was made for batch={cache.batch} but idx has batch {idx.shape[0]}; "
                             f"use model.new_cache(batch={idx.shape[0]})")
        x = self.dropout(self.position(self.token_embedding(idx), start_pos=start))
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)
        if cache is not None:
            cache.advance(idx.shape[1])
        return self.lm_head(self.norm(x))


def _check_sampling(vocab: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not (
        math.isfinite(temperature) and temperature >= 0
    ):
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy); got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= vocab):
        raise ValueError(f"top_k must be None or an int in 1…vocab={vocab}; got {top_k!r}")
    if top_p is not None and (
        not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not 0.0 < top_p <= 1.0
    ):
        raise ValueError(f"top_p must be None or a number in (0, 1] (1 = keep every token); got {top_p!r}")


def sample_next_token(
    logits: Float[Tensor, "batch vocab"],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Int[Tensor, "batch 1"]:
    """One token per row: the argmax when ``temperature=0``, else a sample of ``softmax(logits / temperature)``
    restricted to the ``top_k`` most likely tokens (ties with the k-th kept), then to the smallest set whose
    probability reaches ``top_p`` (the token that crosses ``top_p`` is kept)."""
    if not isinstance(logits, Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a float tensor of shape (batch, vocab); got {shape}")
    _check_sampling(logits.shape[-1], temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature  # before the softmax: T < 1 sharpens, T > 1 flattens
    if top_k is not None:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_probs, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of the more likely tokens
        drop_sorted = before >= top_p  # the most likely token always stays (before = 0)
        drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


def generate(
    model: GPT,
    idx: Int[Tensor, "batch seq"],
    max_new_tokens: int,
    *,
    use_cache: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Int[Tensor, "batch seq_out"]:
    """``idx`` followed by ``max_new_tokens`` tokens from :func:`sample_next_token` (``temperature=0``: greedy).

    With ``use_cache`` the prompt is fed once and then each step feeds only the newest
    token; without, the whole sequence is recomputed at every step. Past the context limit
    it raises ValueError before generating. The model runs in eval mode (no dropout) and
    without autograd meanwhile.
    """
    if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.is_floating_point() or idx.shape[1] < 1:
        shape = tuple(idx.shape) if isinstance(idx, Tensor) else type(idx).__name__
        raise ValueError(f"idx must be integer token ids of shape (batch, seq) with seq >= 1; got {shape}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative int; got {max_new_tokens!r}")
    _check_sampling(model.config.vocab, temperature, top_k, top_p)
    max_len = model.config.max_len
    if idx.shape[1] + max_new_tokens > max_len:
        raise ValueError(
            f"prompt length {idx.shape[1]} + max_new_tokens {max_new_tokens} = {idx.shape[1] + max_new_tokens} "
            f"exceeds the context limit max_len={max_len}; ask for at most {max(max_len - idx.shape[1], 0)} new tokens "
            "or shorten the prompt"
        )
    was_training = model.training
    model.eval()  # no dropout while generating
    try:
        with torch.inference_mode():  # no autograd graph: it would grow with every token
            out = idx
            if max_new_tokens == 0:
                return out
            cache = model.new_cache(idx.shape[0]) if use_cache else None  # a fresh cache for every prompt
            logits = model(idx, cache)[:, -1]
            for step in range(max_new_tokens):
                token = sample_next_token(logits, temperature, top_k, top_p, generator)
                out = torch.cat((out, token), dim=1)
                if step + 1 == max_new_tokens:  # the last new token needs no forward pass
                    break
                logits = model(token, cache)[:, -1] if use_cache else model(out)[:, -1]
            return out
    finally:
        model.train(was_training)
