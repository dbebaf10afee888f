"""Chapter 4 — the encoder-decoder Transformer.

The recipe: token embeddings (scaled by √d_model) plus positions, then N
encoder layers (bidirectional self-attention, feed-forward) and N decoder
layers (causal self-attention, cross-attention to the encoder output,
feed-forward), each sub-layer wrapped in a residual and a LayerNorm:

    post-norm (the paper):  x = LN(x + sublayer(x))
    pre-norm (modern):      x = x + sublayer(LN(x)),  plus a final LN per stack

Training uses teacher forcing: the decoder reads BOS + the true target and
predicts target + EOS, every position in parallel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from solutions.attention import padding_mask
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


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder output (Q from here, K/V from memory), feed-forward."""

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, *,
        norm_first: bool = False, activation: str = "relu", layer_norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def _self_attention_block(self, x: Tensor) -> Tensor:
        # Target padding sits after the real tokens, so the causal mask already hides it.
        if self.norm_first:
            return x + self.dropout1(self.self_attn(self.norm1(x), is_causal=True))
        return self.norm1(x + self.dropout1(self.self_attn(x, is_causal=True)))

    def forward(
        self,
        x: Float[Tensor, "batch seq_q d_model"],
        memory: Float[Tensor, "batch seq_k d_model"],
        memory_mask: Bool[Tensor, "... seq_q seq_k"] | None = None,
    ) -> Float[Tensor, "batch seq_q d_model"]:
        x = self._self_attention_block(x)
        if self.norm_first:
            x = x + self.dropout2(self.cross_attn(self.norm2(x), memory, memory_mask))
            return x + self.dropout3(self.feed_forward(self.norm3(x)))
        x = self.norm2(x + self.dropout2(self.cross_attn(x, memory, memory_mask)))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))

    def cross_attention_weights(
        self,
        x: Float[Tensor, "batch seq_q d_model"],
        memory: Float[Tensor, "batch seq_k d_model"],
        memory_mask: Bool[Tensor, "... seq_q seq_k"] | None = None,
    ) -> Float[Tensor, "batch heads seq_q seq_k"]:
        """The cross-attention maps this layer's forward pass uses on ``x`` (no dropout)."""
        x = self._self_attention_block(x)
        query = self.norm2(x) if self.norm_first else x
        return self.cross_attn.attention_weights(query, memory, memory_mask)


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

    def _decoder_input(self, tgt_in: Tensor) -> Tensor:
        self._check_tokens("tgt_in", tgt_in, self.config.tgt_vocab)
        return self.positional(self.tgt_embed(tgt_in) * math.sqrt(self.config.d_model))

    def decode(
        self,
        tgt_in: Int[Tensor, "batch seq_q"],
        memory: Float[Tensor, "batch seq_k d_model"],
        src: Int[Tensor, "batch seq_k"],
    ) -> Float[Tensor, "batch seq_q vocab"]:
        """Next-token logits at every target position; ``src`` gives the padding mask of ``memory``."""
        if memory.shape[:2] != src.shape[:2]:
            raise ValueError(
                f"memory {tuple(memory.shape)} and src {tuple(src.shape)} must agree on (batch, seq_k); "
                "pass the src that was encoded"
            )
        mask = self.source_mask(src)
        x = self._decoder_input(tgt_in)
        for layer in self.decoder_layers:
            x = layer(x, memory, mask)
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
        memory = self.encode(src)
        mask = self.source_mask(src)
        x = self._decoder_input(tgt_in)
        maps = []
        for layer in self.decoder_layers:
            maps.append(layer.cross_attention_weights(x, memory, mask))
            x = layer(x, memory, mask)
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
    "TransformerConfig", "FeedForward", "EncoderLayer", "DecoderLayer", "Transformer", "teacher_forcing",
]
