"""Chapter 6 — a decoder-only Transformer, and inference as a system.

Generation is one token at a time. Recomputing the whole prefix at every step
costs O(n²) attention work per step; the keys and values of earlier tokens never
change (a token only looks backwards), so each layer keeps them in a cache and a
step only computes the new token's row: O(n) per step.

    cache bytes = 2 (K and V) · layers · kv_heads · d_head · seq · batch · bytes

Grouped-query attention (``n_kv_heads < n_heads``) and multi-query attention
(``n_kv_heads = 1``) shrink the cache, and the cache reads of every step, by
``n_heads / n_kv_heads``; the weights are read in full whatever the head count.

Prefill (the prompt, many tokens in one pass) is compute-bound; decode (one token
per sequence per step) reads every weight and the whole cache for a few FLOPs per
byte, so it is bound by memory bandwidth until the batch is large:

    step time ≈ max((weight bytes + cache bytes) / bandwidth, 2 · parameters · batch / peak FLOP/s)

The rest of the module is what serving systems build on that: a paged cache
(fixed-size blocks from a shared pool, a block table per sequence: Kwon et al.,
SOSP 2023), a sliding-window ring buffer (Mistral 7B), batches of prompts of
different lengths (left padding, a padding mask, per-row positions), and
speculative decoding (Leviathan et al., ICML 2023; Chen et al., 2023).

Positions are learned absolute embeddings (``LearnedPositionalEmbedding``,
chapter 3), as in GPT-2: a cached step places its tokens at ``len(cache)…``,
and the hard context limit ``max_len`` is explicit, so going past it is a clear
error instead of silent extrapolation.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from einops import rearrange
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from solutions.attention import attention
from solutions.positional import LearnedPositionalEmbedding


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int; got {value!r}")


# --- the model ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPTConfig:
    vocab: int  # number of token ids (characters for the char-level model)
    max_len: int = 256  # context limit: positions 0…max_len-1 exist, nothing beyond
    d_model: int = 128  # width of the residual stream
    n_heads: int = 4  # query heads per layer; d_model must divide by it
    n_layers: int = 4  # number of pre-norm decoder layers
    n_kv_heads: int | None = None  # key/value heads: None = n_heads (MHA), fewer = GQA, 1 = MQA
    dropout: float = 0.0  # on embeddings, attention weights and residual branches while training
    d_ff: int | None = None  # width of the feed-forward net; None = 4 · d_model
    window: int | None = None  # sliding-window attention: each token sees the last `window` tokens; None = all

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
        if self.window is not None and (not isinstance(self.window, int) or self.window < 1):
            raise ValueError(f"GPTConfig.window must be a positive int or None (no window); got {self.window!r}")

    # The None defaults are resolved here, not stored: dataclasses.replace(config, n_heads=8) keeps
    # n_kv_heads=None and stays multi-head, where a stored n_kv_heads=4 would silently make it GQA.
    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def resolved_n_kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def resolved_d_ff(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def kv_heads(self) -> int:
        warnings.warn("GPTConfig.kv_heads is renamed resolved_n_kv_heads", DeprecationWarning, stacklevel=2)
        return self.resolved_n_kv_heads

    @property
    def hidden(self) -> int:
        warnings.warn("GPTConfig.hidden is renamed resolved_d_ff", DeprecationWarning, stacklevel=2)
        return self.resolved_d_ff


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


# Written twice on purpose: solutions.transformer has its own DecoderCache for the encoder-decoder. Chapter 4
# comes before this chapter and cannot import it, and that cache also holds the cross-attention keys and values
# and reorders its rows for beam search.
class KVCache:
    """Each layer's keys and values for the tokens seen so far, in buffers allocated once for ``max_len``.

    ``write(layer, k, v)`` stores the new tokens after the held ones and returns held + new;
    ``advance(n)`` moves the length once every layer has written. ``len(cache)`` is the number of
    tokens held; ``cache.keys(i)`` / ``cache.values(i)`` are views ``(batch, kv_heads, len, d_head)``.
    Appending with ``torch.cat`` instead would copy the whole cache at every step.
    """

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        max_len: int,
        d_head: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (batch, n_kv_heads, max_len, d_head)
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
        """Bytes actually allocated (the buffers hold ``max_len`` positions per sequence)."""
        return sum(t.nbytes for t in self.k + self.v)

    def write(
        self,
        layer: int,
        k: Float[Tensor, "batch kv_heads seq d_head"],
        v: Float[Tensor, "batch kv_heads seq d_head"],
    ) -> tuple[Float[Tensor, "batch kv_heads seq_k d_head"], Float[Tensor, "batch kv_heads seq_k d_head"]]:
        """Store the new keys/values after the held ones; return all of them (held + new)."""
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

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens (speculative decoding rolls back rejected drafts)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length must be in 0…{self.length} (the tokens held); got {length}")
        self.length = length

    def retain(self, rows: list[int]) -> None:
        """Keep only these sequences, in this order. A contiguous buffer cannot give one row's memory
        back: the kept rows are copied into new, smaller buffers."""
        index = torch.as_tensor(rows, dtype=torch.long, device=self.k[0].device)
        self.k = [t.index_select(0, index) for t in self.k]
        self.v = [t.index_select(0, index) for t in self.v]
        self.batch = len(rows)


class PagedKVCache:
    """Keys and values in fixed-size blocks from one shared pool, found through a block table per sequence.

    Row ``b``'s token at position ``p`` lives in physical block ``block_tables[b][p // block_size]`` at
    offset ``p % block_size``. A sequence holds ``ceil(len / block_size)`` blocks, never ``max_len``
    positions, and gives them back to ``free_blocks`` when it ends (PagedAttention, Kwon et al. 2023).
    Same interface as :class:`KVCache`: ``write``, ``advance``, ``len``, ``truncate``, ``retain``.
    """

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        d_head: int,
        *,
        n_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (n_blocks, n_kv_heads, block_size, d_head)
        self.k_pool = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v_pool = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.free_blocks: list[int] = list(range(n_blocks))  # physical blocks no sequence holds
        self.block_tables: list[list[int]] = [[] for _ in range(batch)]  # row -> its blocks, in position order
        self.n_blocks, self.block_size, self.length = n_blocks, block_size, 0

    @property
    def batch(self) -> int:
        return len(self.block_tables)

    def __len__(self) -> int:
        return self.length

    def advance(self, n_tokens: int) -> None:
        self.length += n_tokens

    def block_bytes(self) -> int:
        """Bytes of one block in every layer's pool, keys and values."""
        return sum(t[0].nbytes for t in self.k_pool + self.v_pool)

    def allocated_bytes(self) -> int:
        """Bytes of the blocks the sequences hold (the pool's free blocks are anyone's)."""
        return sum(len(table) for table in self.block_tables) * self.block_bytes()

    def write(
        self,
        layer: int,
        k: Float[Tensor, "batch kv_heads seq d_head"],
        v: Float[Tensor, "batch kv_heads seq d_head"],
    ) -> tuple[Float[Tensor, "batch kv_heads seq_k d_head"], Float[Tensor, "batch kv_heads seq_k d_head"]]:
        """Store the new keys/values after the held ones, taking blocks from the pool as needed; return all of
        this layer's keys and values (held + new) in position order."""
        end = self.length + k.shape[-2]
        needed = -(-end // self.block_size) - len(self.block_tables[0])  # every row holds as many blocks
        if needed > 0:  # the first layer to write takes the blocks; every layer uses the same table
            if needed * self.batch > len(self.free_blocks):
                raise ValueError(
                    f"the pool of n_blocks={self.n_blocks} has {len(self.free_blocks)} free blocks; "
                    f"{self.batch} sequences need {needed} more each: make the pool larger or end a sequence"
                )
            for table in self.block_tables:
                table.extend(self.free_blocks.pop() for _ in range(needed))
        tables = torch.tensor(self.block_tables, device=k.device)
        positions = torch.arange(self.length, end, device=k.device)
        blocks, offsets = tables[:, positions // self.block_size], positions % self.block_size
        # pool[blocks, :, offsets] is (batch, seq, kv_heads, d_head): the indexed axes come first.
        self.k_pool[layer][blocks, :, offsets] = rearrange(k, "batch kv_heads seq d_head -> batch seq kv_heads d_head")
        self.v_pool[layer][blocks, :, offsets] = rearrange(v, "batch kv_heads seq d_head -> batch seq kv_heads d_head")
        keys, values = (
            rearrange(pool[tables], "batch blocks kv_heads block d_head -> batch kv_heads (blocks block) d_head")
            for pool in (self.k_pool[layer], self.v_pool[layer])
        )
        return keys[:, :, :end], values[:, :, :end]

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` tokens; blocks that now hold none go back to the pool."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length must be in 0…{self.length} (the tokens held); got {length}")
        keep = -(-length // self.block_size)  # a block that still holds a token stays
        for table in self.block_tables:
            self.free_blocks.extend(table[keep:])
            del table[keep:]
        self.length = length

    def retain(self, rows: list[int]) -> None:
        """Keep only these sequences, in this order; the others' blocks go back to the pool."""
        if len(set(rows)) != len(rows):
            raise ValueError(f"rows must be distinct (two rows cannot share blocks); got {rows}")
        for row, table in enumerate(self.block_tables):
            if row not in rows:
                self.free_blocks.extend(table)
        self.block_tables = [self.block_tables[row] for row in rows]


class SlidingWindowKVCache:
    """A ring buffer of the last ``window`` positions per layer (Mistral 7B's rolling buffer).

    Position ``p`` is stored in slot ``p % window``: memory stays ``window`` tokens however long the
    text. ``write`` returns the last ``window - 1`` held tokens, in position order, followed by the new
    ones: what a sliding-window model's new queries may see.
    """

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        window: int,
        d_head: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (batch, n_kv_heads, window, d_head)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.window, self.length = window, 0

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    def __len__(self) -> int:
        return self.length

    def allocated_bytes(self) -> int:
        return sum(t.nbytes for t in self.k + self.v)

    def write(
        self,
        layer: int,
        k: Float[Tensor, "batch kv_heads seq d_head"],
        v: Float[Tensor, "batch kv_heads seq d_head"],
    ) -> tuple[Float[Tensor, "batch kv_heads seq_k d_head"], Float[Tensor, "batch kv_heads seq_k d_head"]]:
        """The last ``window - 1`` held keys/values in position order, then the new ones; the newest
        ``window`` of them stay in the ring."""
        start, new = self.length, k.shape[-2]
        slots = torch.arange(start - min(start, self.window - 1), start, device=k.device) % self.window
        keys = torch.cat((self.k[layer][:, :, slots], k), dim=-2)
        values = torch.cat((self.v[layer][:, :, slots], v), dim=-2)
        kept = min(new, self.window)  # of a long chunk, only its last `window` tokens stay
        slots = torch.arange(start + new - kept, start + new, device=k.device) % self.window
        self.k[layer][:, :, slots] = k[:, :, new - kept :]
        self.v[layer][:, :, slots] = v[:, :, new - kept :]
        return keys, values

    def advance(self, n_tokens: int) -> None:
        self.length += n_tokens


def sliding_window_mask(seq_q: int, seq_k: int, window: int, *, device=None) -> Bool[Tensor, "seq_q seq_k"]:
    """End-aligned causal mask that also hides keys ``window`` or more positions back:
    query i (at key position ``i + seq_k - seq_q``) sees keys j with ``0 <= i + seq_k - seq_q - j < window``."""
    offset = torch.arange(seq_q, device=device)[:, None] + (seq_k - seq_q) - torch.arange(seq_k, device=device)
    return (offset >= 0) & (offset < window)


class CausalSelfAttention(nn.Module):
    """Causal self-attention with ``n_heads`` query heads and ``n_kv_heads`` key/value heads."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_head = config.n_heads, config.resolved_n_kv_heads, config.d_head
        self.dropout, self.window = config.dropout, config.window
        self.q_proj = nn.Linear(config.d_model, config.n_heads * config.d_head)
        # K and V in one matmul; with GQA/MQA it is smaller than Q's projection.
        self.kv_proj = nn.Linear(config.d_model, 2 * self.n_kv_heads * config.d_head)
        self.out_proj = nn.Linear(config.d_model, config.d_model)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: Float[Tensor, "batch seq d_model"],
        cache: KVCache | None = None,
        layer: int = 0,
        padding: Bool[Tensor, "batch seq_k"] | None = None,
    ) -> Float[Tensor, "batch seq d_model"]:
        """The new tokens' outputs; with ``cache``, their keys/values go to layer ``layer`` of it first and the
        new queries attend to everything it returns (the prefix and themselves). ``padding`` is False at the
        left padding of a batch of prompts (keys nobody may see)."""
        # The heads split and merged with view and transpose, each line's einops pattern beside it: rearrange
        # looks its pattern up on every call, about a tenth of a one-token decoding step on one thread.
        batch, seq, _ = x.shape
        # "batch seq (heads d_head) -> batch heads seq d_head"
        q = self.q_proj(x).view(batch, seq, self.n_heads, self.d_head).transpose(1, 2)
        # "batch seq (two kv_heads d_head) -> two batch kv_heads seq d_head"
        k, v = self.kv_proj(x).view(batch, seq, 2, self.n_kv_heads, self.d_head).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k, v = cache.write(layer, k, v)
        seq_q, seq_k = q.shape[-2], k.shape[-2]
        mask = None
        if padding is not None:
            padding = padding[:, -seq_k:]
            # A padding query would see no key at all (a row of -inf, NaN after the softmax, and NaN times a
            # weight of 0 is still NaN in the real rows): let it see every key. Its output is never used.
            mask = padding[:, None, None, :] | ~padding[:, None, -seq_q:, None]
        if self.window is not None:
            band = sliding_window_mask(seq_q, seq_k, self.window, device=x.device)
            mask = band if mask is None else mask & band
        # is_causal is end-aligned: the new queries see the cached prefix and themselves. A single new query
        # may see every key, so a one-token step builds no mask at all.
        out = attention(q, k, v, mask, is_causal=seq_q > 1, dropout_p=self.dropout if self.training else 0.0)
        # "batch heads seq d_head -> batch seq (heads d_head)"
        return self.resid_dropout(self.out_proj(out.transpose(1, 2).reshape(batch, seq, -1)))


class FeedForward(nn.Module):
    """Position-wise feed-forward: ``linear2(gelu(linear1(x)))``, then dropout."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.linear1 = nn.Linear(config.d_model, config.resolved_d_ff)
        self.activation = nn.GELU()
        self.linear2 = nn.Linear(config.resolved_d_ff, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Float[Tensor, "batch seq d_model"]) -> Float[Tensor, "batch seq d_model"]:
        return self.dropout(self.linear2(self.activation(self.linear1(x))))


class DecoderLayer(nn.Module):
    """One pre-norm layer of a decoder-only stack (no cross-attention): ``x + self_attn(norm1(x))``, then
    ``x + feed_forward(norm2(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model)
        self.self_attn = CausalSelfAttention(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.feed_forward = FeedForward(config)

    def forward(
        self,
        x: Float[Tensor, "batch seq d_model"],
        cache: KVCache | None = None,
        layer: int = 0,
        padding: Bool[Tensor, "batch seq_k"] | None = None,
    ) -> Float[Tensor, "batch seq d_model"]:
        x = x + self.self_attn(self.norm1(x), cache, layer, padding)
        return x + self.feed_forward(self.norm2(x))


class GPT(nn.Module):
    """Token + learned position embeddings, ``n_layers`` pre-norm decoder layers, final norm, tied output head."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ValueError(f"config must be a GPTConfig; got {type(config).__name__}")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab, config.d_model)
        self.position = LearnedPositionalEmbedding(config.max_len, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab, bias=False)
        self.lm_head.weight = self.token_embedding.weight  # weight tying: one matrix reads and writes tokens
        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream by 1/√(2·layers), picked by name
        # (self_attn.out_proj, feed_forward.linear2) so that reordering a layer cannot pick the wrong one.
        for name, param in self.named_parameters():
            if name.endswith(("self_attn.out_proj.weight", "feed_forward.linear2.weight")):
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * config.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def new_cache(self, batch: int = 1, *, block_size: int | None = None,
                  n_blocks: int | None = None) -> "KVCache | PagedKVCache":
        """An empty cache for ``batch`` sequences on the model's device and dtype: contiguous, or paged with
        ``block_size`` (from a pool of ``n_blocks``; default: enough for every sequence to reach ``max_len``)."""
        _positive_int("batch", batch)
        weight, c = self.token_embedding.weight, self.config
        if block_size is None:
            return KVCache(c.n_layers, batch, c.resolved_n_kv_heads, c.max_len, c.d_head,
                           dtype=weight.dtype, device=weight.device)
        _positive_int("block_size", block_size)
        n_blocks = batch * -(-c.max_len // block_size) if n_blocks is None else n_blocks
        return PagedKVCache(c.n_layers, batch, c.resolved_n_kv_heads, c.d_head, n_blocks=n_blocks,
                            block_size=block_size, dtype=weight.dtype, device=weight.device)

    def forward(
        self,
        idx: Int[Tensor, "batch seq"],
        cache: "KVCache | PagedKVCache | None" = None,
        *,
        positions: Int[Tensor, "batch seq"] | None = None,
        padding: Bool[Tensor, "batch seq_k"] | None = None,
    ) -> Float[Tensor, "batch seq vocab"]:
        """Logits for every position. With ``cache``, ``idx`` holds only the new tokens and the cache is
        extended in place. ``positions`` defaults to ``len(cache)…`` for every row; ``padding`` (batch,
        len(cache) + seq) is False at padding (a batch of prompts of different lengths, left-padded)."""
        if idx.dim() != 2 or idx.is_floating_point():
            raise ValueError(f"idx must be integer token ids of shape (batch, seq); got {idx.dtype} {tuple(idx.shape)}")
        batch, seq = idx.shape
        start = 0 if cache is None else len(cache)
        if start + seq > self.config.max_len:
            raise ValueError(
                f"{start} cached + {seq} new tokens exceed the context limit max_len={self.config.max_len}; "
                "shorten the input (keep its last max_len tokens) or build the model with a larger max_len"
            )
        if cache is not None and cache.batch != batch:
            raise ValueError(f"the cache was made for batch={cache.batch} but idx has batch {batch}; "
                             f"use model.new_cache(batch={batch})")
        if positions is None:
            positions = torch.arange(start, start + seq, device=idx.device).expand(batch, seq)
        elif positions.shape != idx.shape or positions.is_floating_point() or not (
                0 <= int(positions.min()) and int(positions.max()) < self.config.max_len):
            raise ValueError(f"positions must be integers in 0…max_len-1={self.config.max_len - 1} shaped like idx "
                             f"{tuple(idx.shape)}; got {positions.dtype} {tuple(positions.shape)}")
        if padding is not None and (padding.dtype != torch.bool or padding.shape != (batch, start + seq)):
            raise ValueError(f"padding must be a bool tensor (batch, cached + new tokens) = {(batch, start + seq)}; "
                             f"got {padding.dtype} {tuple(padding.shape)}")
        x = self.dropout(self.token_embedding(idx) + self.position.embedding(positions))
        for layer, block in enumerate(self.layers):
            x = block(x, cache, layer, padding)
        if cache is not None:
            cache.advance(seq)
        return self.lm_head(self.norm(x))


# --- choosing the next token --------------------------------------------------------------------------


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


def _check_logits(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not isinstance(logits, Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a float tensor of shape (batch, vocab); got {shape}")
    _check_sampling(logits.shape[-1], temperature, top_k, top_p)


def next_token_probs(
    logits: Float[Tensor, "batch vocab"],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> Float[Tensor, "batch vocab"]:
    """The distribution the next token is drawn from: ``softmax(logits / temperature)`` restricted to the
    ``top_k`` most likely tokens (ties with the k-th kept), then to the smallest set whose probability reaches
    ``top_p`` (the token that crosses ``top_p`` is kept), renormalised. ``temperature=0``: all the mass on the
    argmax."""
    _check_logits(logits, temperature, top_k, top_p)
    if temperature == 0:
        return torch.zeros_like(logits, dtype=torch.float).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
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
    return torch.softmax(logits, dim=-1)


def sample_next_token(
    logits: Float[Tensor, "batch vocab"],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Int[Tensor, "batch 1"]:
    """One token per row: the argmax when ``temperature=0`` (nothing random), else a draw from
    :func:`next_token_probs` with ``generator``."""
    if temperature == 0:  # the argmax of next_token_probs' one-hot, without building it (a decoding step is short)
        _check_logits(logits, temperature, top_k, top_p)
        return logits.argmax(dim=-1, keepdim=True)
    return torch.multinomial(next_token_probs(logits, temperature, top_k, top_p), 1, generator=generator)


def _check_generate_args(model: nn.Module, max_new_tokens: int, temperature, top_k, top_p) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative int; got {max_new_tokens!r}")
    _check_sampling(model.config.vocab, temperature, top_k, top_p)


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
    without autograd meanwhile, and gets its mode back even when something raises.
    """
    if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.is_floating_point() or idx.shape[1] < 1:
        shape = tuple(idx.shape) if isinstance(idx, Tensor) else type(idx).__name__
        raise ValueError(f"idx must be integer token ids of shape (batch, seq) with seq >= 1; got {shape}")
    _check_generate_args(model, max_new_tokens, temperature, top_k, top_p)
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


# --- what decoding costs: the roofline ------------------------------------------------------------------


def decode_tokens_per_second(
    n_params: int,
    n_layers: int,
    n_kv_heads: int,
    d_head: int,
    context: int,
    batch: int,
    *,
    bandwidth: float,
    peak_flops: float,
    dtype: torch.dtype = torch.float16,
) -> float:
    """Roofline estimate of decoding: tokens per second over the whole batch.

    One step reads every weight once (the batch shares them) and each sequence's cache of ``context``
    tokens, and does 2 FLOPs per parameter for each sequence (a multiply and an add); it lasts as long as
    the slower of the two, bytes / ``bandwidth`` and FLOPs / ``peak_flops``, and gives one token per sequence.
    """
    weight_bytes = n_params * dtype.itemsize
    cache_bytes = kv_cache_bytes(n_layers, n_kv_heads, d_head, context, batch, dtype)
    step = max((weight_bytes + cache_bytes) / bandwidth, 2 * n_params * batch / peak_flops)
    return batch / step


# --- a batch of prompts of different lengths ----------------------------------------------------------------


def generate_batch(
    model: GPT,
    prompts: list[Int[Tensor, "seq"]],
    max_new_tokens: int,
    *,
    eos_id: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> list[Int[Tensor, "seq_out"]]:
    """Each prompt followed by its new tokens, decoded together in one batch.

    The prompts are left-padded to the longest one; ``padding`` hides the padding keys and each row's
    positions count from its first real token, so a row's tokens are those of the prompt alone. A row
    stops after ``eos_id`` (which ends its output) and leaves the batch: its cache is freed with
    ``cache.retain``. The model runs in eval mode without autograd and gets its mode back even when
    something raises.
    """
    if not isinstance(prompts, (list, tuple)) or not prompts or not all(
            isinstance(p, Tensor) and p.dim() == 1 and not p.is_floating_point() and len(p) >= 1 for p in prompts):
        raise ValueError("prompts must be a non-empty list of 1-d integer token tensors, each of at least one token")
    _check_generate_args(model, max_new_tokens, temperature, top_k, top_p)
    width = max(len(p) for p in prompts)
    if width + max_new_tokens > model.config.max_len:
        raise ValueError(f"the longest prompt ({width} tokens) + max_new_tokens {max_new_tokens} exceeds the context "
                         f"limit max_len={model.config.max_len}; ask for at most {model.config.max_len - width}")
    if max_new_tokens == 0:
        return [prompt.clone() for prompt in prompts]
    idx = torch.zeros(len(prompts), width, dtype=torch.long, device=prompts[0].device)
    padding = torch.zeros(len(prompts), width, dtype=torch.bool, device=prompts[0].device)
    for row, prompt in enumerate(prompts):
        idx[row, width - len(prompt) :] = prompt
        padding[row, width - len(prompt) :] = True
    positions = (padding.cumsum(dim=-1) - 1).clamp(min=0)  # 0 at each row's first real token
    new: list[list[int]] = [[] for _ in prompts]  # each prompt's new tokens
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            cache = model.new_cache(len(prompts))
            rows = list(range(len(prompts)))  # the prompts still generating, in the order of the cache's rows
            logits = model(idx, cache, positions=positions, padding=padding)[:, -1]
            for step in range(max_new_tokens):
                token = sample_next_token(logits, temperature, top_k, top_p, generator)
                for row, t in zip(rows, token[:, 0].tolist()):
                    new[row].append(t)
                going = [i for i, t in enumerate(token[:, 0].tolist()) if t != eos_id]
                if not going or step + 1 == max_new_tokens:
                    break
                if len(going) < len(rows):  # finished rows leave the batch and free their cache
                    cache.retain(going)
                    rows, token = [rows[i] for i in going], token[going]
                    positions, padding = positions[going], padding[going]
                positions = positions[:, -1:] + 1
                padding = torch.cat((padding, torch.ones_like(padding[:, :1])), dim=1)
                logits = model(token, cache, positions=positions, padding=padding)[:, -1]
    finally:
        model.train(was_training)
    return [torch.cat((prompt, torch.tensor(tokens, dtype=prompt.dtype, device=prompt.device)))
            for prompt, tokens in zip(prompts, new)]


# --- speculative decoding ---------------------------------------------------------------------------------------


def speculative_generate(
    target: GPT,
    draft: GPT,
    idx: Int[Tensor, "1 seq"],
    max_new_tokens: int,
    *,
    lookahead: int = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Int[Tensor, "1 seq_out"], dict[str, int]]:
    """``idx`` followed by ``max_new_tokens`` tokens of the target, drafted ``lookahead`` at a time by ``draft``.

    Each round the draft proposes up to ``lookahead`` tokens, one at a time; the target scores them all in one
    chunked pass through its cache; draft token x is accepted with probability min(1, p(x) / q(x)) (p the
    target's distribution, q the draft's), and at the first rejection the next token is drawn from
    norm(max(0, p − q)) instead; if all are accepted, the target's distribution after them gives one more.
    The output then has exactly the target's distribution (greedy: the target's greedy tokens). Both caches
    are rolled back past rejected tokens. Each cache holds every token but the last one, which the next round
    feeds. ``stats``: tokens ``proposed`` and ``accepted``, ``target_calls`` and ``draft_calls``.
    """
    if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.shape[0] != 1 or idx.is_floating_point() or idx.shape[1] < 1:
        shape = tuple(idx.shape) if isinstance(idx, Tensor) else type(idx).__name__
        raise ValueError(f"idx must be integer token ids of shape (1, seq) with seq >= 1 (one sequence); got {shape}")
    _check_generate_args(target, max_new_tokens, temperature, top_k, top_p)
    _positive_int("lookahead", lookahead)
    if target.config.vocab != draft.config.vocab:
        raise ValueError(f"the draft's vocab={draft.config.vocab} must be the target's vocab={target.config.vocab}: "
                         "both must use the same tokenizer")
    limit = min(target.config.max_len, draft.config.max_len)
    if idx.shape[1] + max_new_tokens > limit:
        raise ValueError(f"prompt length {idx.shape[1]} + max_new_tokens {max_new_tokens} exceeds the context limit "
                         f"max_len={limit} (the smaller of the target's and the draft's)")

    def pick(probs: Tensor) -> Tensor:
        return probs.argmax(dim=-1, keepdim=True) if temperature == 0 else torch.multinomial(probs, 1, generator=generator)

    stats = {"proposed": 0, "accepted": 0, "target_calls": 0, "draft_calls": 0}
    modes = target.training, draft.training
    target.eval(), draft.eval()
    try:
        with torch.inference_mode():
            out = idx
            t_cache, d_cache = target.new_cache(1), draft.new_cache(1)
            while out.shape[1] - idx.shape[1] < max_new_tokens:
                k = min(lookahead, max_new_tokens - (out.shape[1] - idx.shape[1]) - 1)  # a round adds <= k + 1
                drafted, qs = [], []
                if k:  # the draft catches up on what it has not seen (the prompt, then one or two tokens)
                    d_logits = draft(out[:, len(d_cache) :], d_cache)[:, -1]
                    stats["draft_calls"] += 1
                for i in range(k):
                    qs.append(next_token_probs(d_logits, temperature, top_k, top_p))
                    drafted.append(pick(qs[-1]))
                    if i + 1 < k:
                        d_logits = draft(drafted[-1], d_cache)[:, -1]
                        stats["draft_calls"] += 1
                # One target pass scores every drafted token: the logits after out[-1], d_1, …, d_k.
                fed = torch.cat([out[:, len(t_cache) :], *drafted], dim=1)
                logits = target(fed, t_cache)[0, -(k + 1) :]
                stats["target_calls"] += 1
                ps = next_token_probs(logits, temperature, top_k, top_p)  # (k + 1, vocab)
                n = 0
                while n < k:
                    x = drafted[n][0, 0]
                    if torch.rand((), generator=generator, device=ps.device) >= ps[n, x] / qs[n][0, x]:
                        break  # rejected, with probability 1 - p/q
                    n += 1
                if n < k:
                    residual = (ps[n] - qs[n][0]).clamp(min=0)
                    following = pick((residual / residual.sum())[None])
                else:
                    following = pick(ps[k][None])
                stats["proposed"], stats["accepted"] = stats["proposed"] + k, stats["accepted"] + n
                accepted = out.shape[1] + n  # the tokens both caches may keep: out, d_1 … d_n
                t_cache.truncate(accepted)
                d_cache.truncate(min(len(d_cache), accepted))
                out = torch.cat([out, *drafted[:n], following], dim=1)
            return out, stats
    finally:
        target.train(modes[0])
        draft.train(modes[1])
