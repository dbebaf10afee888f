"""Chapter 4 — the encoder-decoder Transformer.

The recipe: token embeddings (scaled by √d_model) plus positions, then N
encoder layers (bidirectional self-attention, feed-forward) and N decoder
layers (causal self-attention, cross-attention to the encoder output,
feed-forward), each sub-layer wrapped in a residual and a LayerNorm:

    post-norm (the paper):  x = LN(x + sublayer(x))
    pre-norm (modern):      x = x + sublayer(LN(x)),  plus a final LN per stack

Training uses teacher forcing: the decoder reads BOS + the true target and
predicts target + EOS, every position in parallel.

Decoding one token at a time can keep what does not change (:class:`DecoderCache`):
each decoder layer's self-attention keys and values of the tokens so far, and its
cross-attention keys and values of the encoder output, computed once per source.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from solutions.attention import attention, padding_mask
from solutions.multihead import MultiHeadAttention
from solutions.positional import SinusoidalPositionalEncoding

ACTIVATIONS = ("relu", "gelu")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class TransformerConfig:
    src_vocab: int  # source vocabulary size (token ids 0 … src_vocab-1)
    tgt_vocab: int  # target vocabulary size; the output has one logit per target token
    d_model: int = 512  # width of every activation and embedding
    n_heads: int = 8  # attention heads per layer; d_head = d_model / n_heads
    n_layers: int = 6  # encoder layers, and as many decoder layers
    d_ff: int = 2048  # hidden width of the position-wise feed-forward network (≈ 4·d_model)
    dropout: float = 0.1  # on embeddings+positions, attention weights and sub-layer outputs
    max_len: int = 512  # longest source or target sequence the positional encoding covers
    pad_id: int = 0  # padding token id, in both vocabularies; source keys equal to it are masked
    norm_first: bool = False  # False = post-norm LN(x + f(x)) as in the paper; True = pre-norm x + f(LN(x))
    activation: str = "relu"  # the feed-forward non-linearity: "relu" (the paper) or "gelu"
    share_embeddings: bool = False  # one matrix for source embedding, target embedding and pre-softmax
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon (raise it for half precision)

    def __post_init__(self) -> None:
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_heads", "n_layers", "d_ff", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int; got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                f"pick n_heads from {_divisors(self.d_model)}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout}")
        if not isinstance(self.pad_id, int) or not 0 <= self.pad_id < min(self.src_vocab, self.tgt_vocab):
            raise ValueError(
                f"pad_id={self.pad_id!r} must be a token id of both vocabularies: "
                f"an int in [0, {min(self.src_vocab, self.tgt_vocab)})"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}; got {self.activation!r}")
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(
                f"share_embeddings=True needs one shared vocabulary, but src_vocab={self.src_vocab} "
                f"!= tgt_vocab={self.tgt_vocab}; build a joint vocabulary or set share_embeddings=False"
            )
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be > 0; got {self.layer_norm_eps}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads


class FeedForward(nn.Module):
    """Position-wise: ``W_2 · act(W_1 x + b_1) + b_2``, the same two layers at every position."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}; got {activation!r}")
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.activation = nn.ReLU() if activation == "relu" else nn.GELU()
        self.dropout = nn.Dropout(dropout)  # inside, as nn.TransformerEncoderLayer does

    def forward(self, x: Float[Tensor, "batch seq d_model"]) -> Float[Tensor, "batch seq d_model"]:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class EncoderLayer(nn.Module):
    """Bidirectional self-attention, then feed-forward; each with a residual and a LayerNorm."""

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, *,
        norm_first: bool = False, activation: str = "relu", layer_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(
        self, x: Float[Tensor, "batch seq d_model"], mask: Bool[Tensor, "... seq seq"] | None = None
    ) -> Float[Tensor, "batch seq d_model"]:
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout1(self.self_attn(h, mask=mask))
            return x + self.dropout2(self.feed_forward(self.norm2(x)))
        x = self.norm1(x + self.dropout1(self.self_attn(x, mask=mask)))
        return self.norm2(x + self.dropout2(self.feed_forward(x)))


class DecoderCache:
    """What decoding one token at a time keeps, per decoder layer.

    * self-attention: the keys and values of the target tokens fed so far, in buffers
      allocated once for ``max_len`` positions and filled in place (``torch.cat`` at every
      step would copy the whole cache);
    * cross-attention: the keys and values of the encoder output, computed once per source.

    Made by :meth:`Transformer.new_cache`. ``len(cache)`` is the number of target tokens held;
    ``reorder(index)`` keeps rows ``index`` (beam search: each beam continues its parent's cache).
    """

    def __init__(self, cross: list[tuple[Tensor, Tensor]], max_len: int) -> None:
        if not cross:
            raise ValueError("cross must hold one (keys, values) pair per decoder layer; got none")
        if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
            raise ValueError(f"max_len must be a positive int; got {max_len!r}")
        batch, kv_heads, _, d_head = cross[0][0].shape
        shape = (batch, kv_heads, max_len, d_head)
        self.k = [cross[0][0].new_zeros(shape) for _ in cross]
        self.v = [cross[0][0].new_zeros(shape) for _ in cross]
        self.cross = list(cross)
        self.max_len, self.length = max_len, 0

    def __len__(self) -> int:
        return self.length

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    def cross_keys_values(self, layer: int) -> tuple[Tensor, Tensor]:
        """The encoder output's keys and values for ``layer``'s cross-attention ``(batch, kv_heads, seq_k, d_head)``."""
        return self.cross[layer]

    def write(
        self,
        layer: int,
        k: Float[Tensor, "batch kv_heads seq d_head"],
        v: Float[Tensor, "batch kv_heads seq d_head"],
    ) -> tuple[Float[Tensor, "batch kv_heads seq_k d_head"], Float[Tensor, "batch kv_heads seq_k d_head"]]:
        """Store the new self-attention keys/values after the held ones; return all of them (held + new).

        The length only advances in :meth:`advance`, once every layer has written.
        """
        end = self.length + k.shape[-2]
        if end > self.max_len:
            raise ValueError(
                f"the cache holds {self.length} tokens and was made for max_len={self.max_len}; "
                f"{k.shape[-2]} more do not fit: make it with a larger max_len (Transformer.new_cache)"
            )
        self.k[layer][:, :, self.length : end] = k
        self.v[layer][:, :, self.length : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, n_tokens: int) -> None:
        self.length += n_tokens

    def reorder(self, index: Int[Tensor, "rows"]) -> None:
        """Keep rows ``index`` of everything held (rows may repeat): row i becomes old row ``index[i]``."""
        if index.dim() != 1 or index.is_floating_point() or index.dtype == torch.bool:
            raise ValueError(f"index must be a 1-D tensor of row numbers; got shape {tuple(index.shape)}, "
                             f"dtype {index.dtype}")
        self.k = [t.index_select(0, index) for t in self.k]
        self.v = [t.index_select(0, index) for t in self.v]
        self.cross = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.cross]


class CachedAttention(MultiHeadAttention):
    """The multi-head attention of chapter 2, able to decode one token at a time with a :class:`DecoderCache`.

    Without a cache it is ``MultiHeadAttention``. With one, self-attention appends the new
    tokens' keys and values to the cache and attends over all of them; cross-attention
    (``context`` given) reuses the encoder output's keys and values held by the cache.
    """

    def keys_values(
        self, context: Float[Tensor, "batch seq_k d_model"]
    ) -> tuple[Float[Tensor, "batch kv_heads seq_k d_head"], Float[Tensor, "batch kv_heads seq_k d_head"]]:
        """The keys and values of ``context`` (the K/V rows of ``in_proj``): what a cache keeps."""
        bias = None if self.in_proj.bias is None else self.in_proj.bias[self.d_model :]
        k, v = F.linear(context, self.in_proj.weight[self.d_model :], bias).split(self.n_kv_heads * self.d_head, dim=-1)
        return self.split_heads(k), self.split_heads(v)

    def forward(
        self,
        x: Float[Tensor, "batch seq_q d_model"],
        context: Float[Tensor, "batch seq_k d_model"] | None = None,
        mask: Bool[Tensor, "... seq_q seq_k"] | None = None,
        *,
        is_causal: bool = False,
        cache: DecoderCache | None = None,
        layer: int = 0,
    ) -> Float[Tensor, "batch seq_q d_model"]:
        """As ``MultiHeadAttention.forward``; with ``cache``, ``x`` holds only the new tokens (``layer`` = which layer)."""
        if cache is None:
            return super().forward(x, context, mask, is_causal=is_causal)
        if context is None:
            q, k, v = self.project_qkv(x)
            k, v = cache.write(layer, k, v)
        else:
            bias = None if self.in_proj.bias is None else self.in_proj.bias[: self.d_model]
            q = self.split_heads(F.linear(x, self.in_proj.weight[: self.d_model], bias))
            k, v = cache.cross_keys_values(layer)
        # is_causal is aligned to the end: the new queries see the cached prefix and themselves.
        dropout_p = self.dropout if self.training else 0.0
        out = attention(q, k, v, mask, is_causal=is_causal, dropout_p=dropout_p, backend=self.backend)
        return self.out_proj(self.merge_heads(out))


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder output (Q from here, K/V from memory), feed-forward."""

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, *,
        norm_first: bool = False, activation: str = "relu", layer_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = CachedAttention(d_model, n_heads, dropout=dropout)
        self.cross_attn = CachedAttention(d_model, n_heads, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(
        self,
        x: Float[Tensor, "batch seq_q d_model"],
        memory: Float[Tensor, "batch seq_k d_model"],
        memory_mask: Bool[Tensor, "... seq_q seq_k"] | None = None,
        cache: DecoderCache | None = None,
        layer: int = 0,
    ) -> Float[Tensor, "batch seq_q d_model"]:
        """``x`` after the three sub-layers; ``memory_mask`` is True where a source key is a real token.

        ``cache`` and ``layer`` are for decoding one token at a time: pass them on to both attentions.
        """
        # Target padding sits after the real tokens, so the causal mask already hides it.
        if self.norm_first:
            x = x + self.dropout1(self.self_attn(self.norm1(x), is_causal=True, cache=cache, layer=layer))
            x = x + self.dropout2(self.cross_attn(self.norm2(x), memory, memory_mask, cache=cache, layer=layer))
            return x + self.dropout3(self.feed_forward(self.norm3(x)))
        x = self.norm1(x + self.dropout1(self.self_attn(x, is_causal=True, cache=cache, layer=layer)))
        x = self.norm2(x + self.dropout2(self.cross_attn(x, memory, memory_mask, cache=cache, layer=layer)))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


class Transformer(nn.Module):
    """The encoder-decoder of "Attention Is All You Need", batch first."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise ValueError(f"config must be a TransformerConfig; got {type(config).__name__}")
        self.config = c = config
        layer_args = dict(norm_first=c.norm_first, activation=c.activation, layer_norm_eps=c.layer_norm_eps)
        self.src_embed = nn.Embedding(c.src_vocab, c.d_model)
        self.tgt_embed = nn.Embedding(c.tgt_vocab, c.d_model)
        self.positional = SinusoidalPositionalEncoding(c.d_model, c.max_len, c.dropout)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout, **layer_args) for _ in range(c.n_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout, **layer_args) for _ in range(c.n_layers)
        )
        # A pre-norm stack adds to an un-normalised residual stream; normalise it once at the end.
        self.encoder_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps) if c.norm_first else nn.Identity()
        self.generator = nn.Linear(c.d_model, c.tgt_vocab)
        self._reset_parameters()
        if c.share_embeddings:  # the paper: one matrix for both embeddings and the pre-softmax projection
            self.tgt_embed.weight = self.src_embed.weight
            self.generator.weight = self.src_embed.weight

    def _reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
        # std d_model^-0.5: after the √d_model scaling the embeddings have unit size, like the
        # positional encodings, and a tied pre-softmax layer starts with small logits.
        for embedding in (self.src_embed, self.tgt_embed):
            nn.init.normal_(embedding.weight, std=self.config.d_model ** -0.5)

    def _check_tokens(self, name: str, tokens: Tensor, vocab: int) -> None:
        if tokens.dim() != 2 or tokens.is_floating_point() or tokens.dtype == torch.bool:
            raise ValueError(
                f"{name} must be a (batch, seq) tensor of integer token ids; "
                f"got shape {tuple(tokens.shape)} and dtype {tokens.dtype}"
            )
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab):
            raise ValueError(
                f"{name} holds token ids in [{int(tokens.min())}, {int(tokens.max())}], "
                f"outside the vocabulary [0, {vocab})"
            )

    def source_mask(self, src: Int[Tensor, "batch seq_k"]) -> Bool[Tensor, "batch 1 1 seq_k"]:
        """True where the source key is a real token (not ``pad_id``)."""
        return padding_mask(src, self.config.pad_id)

    def encode(self, src: Int[Tensor, "batch seq_k"]) -> Float[Tensor, "batch seq_k d_model"]:
        """The encoder output ("memory") for the source tokens."""
        self._check_tokens("src", src, self.config.src_vocab)
        mask = self.source_mask(src)
        x = self.positional(self.src_embed(src) * math.sqrt(self.config.d_model))
        for layer in self.encoder_layers:
            x = layer(x, mask)
        return self.encoder_norm(x)

    def _decoder_input(self, tgt_in: Tensor, start_pos: int = 0) -> Tensor:
        self._check_tokens("tgt_in", tgt_in, self.config.tgt_vocab)
        return self.positional(self.tgt_embed(tgt_in) * math.sqrt(self.config.d_model), start_pos)

    def new_cache(self, memory: Float[Tensor, "batch seq_k d_model"], max_len: int | None = None) -> DecoderCache:
        """An empty :class:`DecoderCache` for ``max_len`` target tokens (default ``config.max_len``).

        Each decoder layer's cross-attention keys and values of ``memory`` are computed here, once.
        """
        max_len = self.config.max_len if max_len is None else max_len
        if not isinstance(max_len, int) or isinstance(max_len, bool) or not 1 <= max_len <= self.config.max_len:
            raise ValueError(f"max_len must be an int in [1, {self.config.max_len}] (the model's max_len); "
                             f"got {max_len!r}")
        if memory.dim() != 3 or memory.shape[-1] != self.config.d_model:
            raise ValueError(f"memory must be (batch, seq_k, d_model={self.config.d_model}), the output of encode; "
                             f"got shape {tuple(memory.shape)}")
        return DecoderCache([layer.cross_attn.keys_values(memory) for layer in self.decoder_layers], max_len)

    def decode(
        self,
        tgt_in: Int[Tensor, "batch seq_q"],
        memory: Float[Tensor, "batch seq_k d_model"],
        src: Int[Tensor, "batch seq_k"],
        cache: DecoderCache | None = None,
    ) -> Float[Tensor, "batch seq_q vocab"]:
        """Next-token logits at every target position; ``src`` gives the padding mask of ``memory``.

        With a ``cache`` (from :meth:`new_cache`), ``tgt_in`` holds only the tokens the cache has
        not seen: they are placed at positions ``len(cache)…`` and the cache is extended in place,
        so decoding in chunks gives the logits of one full pass.
        """
        if memory.shape[:2] != src.shape[:2]:
            raise ValueError(
                f"memory {tuple(memory.shape)} and src {tuple(src.shape)} must agree on (batch, seq_k); "
                "pass the src that was encoded"
            )
        if cache is not None and cache.batch != tgt_in.shape[0]:
            raise ValueError(f"the cache holds {cache.batch} rows but tgt_in has {tgt_in.shape[0]}; "
                             "make the cache from this batch's memory (new_cache)")
        mask = self.source_mask(src)
        x = self._decoder_input(tgt_in, 0 if cache is None else len(cache))
        for i, layer in enumerate(self.decoder_layers):
            x = layer(x, memory, mask, cache=cache, layer=i)
        if cache is not None:
            cache.advance(tgt_in.shape[1])
        return self.generator(self.decoder_norm(x))

    def forward(
        self, src: Int[Tensor, "batch seq_k"], tgt_in: Int[Tensor, "batch seq_q"]
    ) -> Float[Tensor, "batch seq_q vocab"]:
        return self.decode(tgt_in, self.encode(src), src)

    @torch.no_grad()
    def cross_attention_maps(
        self, src: Int[Tensor, "batch seq_k"], tgt_in: Int[Tensor, "batch seq_q"]
    ) -> Float[Tensor, "layers batch heads seq_q seq_k"]:
        """Per decoder layer and head, how much each target position attends to each source token."""
        maps = []

        def record(module: CachedAttention, args: tuple, kwargs: dict) -> None:
            # The maps of exactly the query, memory and mask this cross-attention is called with.
            call = inspect.signature(module.forward).bind(*args, **kwargs).arguments
            maps.append(module.attention_weights(call["x"], call.get("context"), call.get("mask")))

        hooks = [layer.cross_attn.register_forward_pre_hook(record, with_kwargs=True) for layer in self.decoder_layers]
        try:
            self(src, tgt_in)
        finally:
            for hook in hooks:
                hook.remove()
        return torch.stack(maps)

    def num_parameters(self) -> int:
        """Trainable parameters, a shared matrix counted once (as the paper counts)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def teacher_forcing(
    tgt: Int[Tensor, "batch seq"], bos_id: int, eos_id: int, pad_id: int
) -> tuple[Int[Tensor, "batch seq_plus_1"], Int[Tensor, "batch seq_plus_1"]]:
    """``decoder_input`` = BOS + tokens, ``labels`` = tokens + EOS; both right-padded with ``pad_id``.

    ``tgt`` holds the target tokens without BOS/EOS, right-padded. EOS goes right
    after each row's last real token, so position t of the input predicts label t.
    """
    if tgt.dim() != 2 or tgt.is_floating_point() or tgt.dtype == torch.bool:
        raise ValueError(
            f"tgt must be a (batch, seq) tensor of integer token ids; got shape {tuple(tgt.shape)}, dtype {tgt.dtype}"
        )
    ids = {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id}
    for name, value in ids.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an int token id; got {value!r}")
    if len(set(ids.values())) != 3:
        raise ValueError(f"bos_id, eos_id and pad_id must be three different ids; got {ids}")
    real = tgt != pad_id
    lengths = real.sum(dim=1)
    # Right-padded means no real token after the first pad: the real ones are a prefix.
    positions = torch.arange(tgt.shape[1], device=tgt.device)
    if not torch.equal(real, positions[None, :] < lengths[:, None]):
        raise ValueError("tgt must be right-padded: no real token may follow a pad_id in a row")
    if (tgt == bos_id).any() or (tgt == eos_id).any():
        raise ValueError("tgt must not contain bos_id or eos_id; teacher_forcing adds them")
    batch = tgt.shape[0]
    decoder_input = torch.cat([tgt.new_full((batch, 1), bos_id), tgt], dim=1)
    labels = torch.cat([tgt, tgt.new_full((batch, 1), pad_id)], dim=1)
    labels[torch.arange(batch, device=tgt.device), lengths] = eos_id
    return decoder_input, labels


__all__ = [
    "TransformerConfig", "FeedForward", "EncoderLayer", "DecoderCache", "CachedAttention", "DecoderLayer",
    "Transformer", "teacher_forcing",
]
