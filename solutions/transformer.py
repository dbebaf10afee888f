"""Chapter 4 — the encoder-decoder Transformer.

The recipe: token embeddings (scaled by √d_model) plus positions, then N
encoder layers (bidirectional self-attention, feed-forward) and N decoder
layers (causal self-attention, cross-attention to the encoder output,
feed-forward), each sub-layer wrapped in a residual and a LayerNorm:

    post-norm (the paper):  x = LN(x + sublayer(x))
    pre-norm (modern):      x = x + sublayer(LN(x)),  plus a final LN per stack

Training uses teacher forcing: the decoder reads BOS + the true target and
predicts target + EOS, every position in parallel.

Decoding one token at a time can keep what does not change (:class:`DecoderCache`,
at the end of this module: chapter 6 teaches it, chapter 4's notebook decodes without
it): each decoder layer's self-attention keys and values of the tokens so far, and its
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

from solutions.attention import attention, causal_mask, padding_mask
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

    def forward(
        self,
        x: Float[Tensor, "batch seq_q d_model"],
        memory: Float[Tensor, "batch seq_k d_model"],
        memory_mask: Bool[Tensor, "... seq_q seq_k"] | None = None,
    ) -> Float[Tensor, "batch seq_q d_model"]:
        """``x`` after the three sub-layers; ``memory_mask`` is True where a source key is a real token."""
        # Target padding sits after the real tokens, so the causal mask already hides it.
        if self.norm_first:
            x = x + self.dropout1(self.self_attn(self.norm1(x), is_causal=True))
            x = x + self.dropout2(self.cross_attn(self.norm2(x), memory, memory_mask))
            return x + self.dropout3(self.feed_forward(self.norm3(x)))
        x = self.norm1(x + self.dropout1(self.self_attn(x, is_causal=True)))
        x = self.norm2(x + self.dropout2(self.cross_attn(x, memory, memory_mask)))
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
    def attention_maps(
        self, src: Int[Tensor, "batch seq_k"], tgt_in: Int[Tensor, "batch seq_q"]
    ) -> dict[str, Float[Tensor, "layers batch heads seq_q seq_k"]]:
        """Per layer and head, the weights of the encoder's self-attention, the decoder's masked self-attention and the
        cross-attention (target position → source token), as the forward pass computes them: ``{"encoder": …,
        "decoder": …, "cross": …}``."""
        maps: dict[str, list[Tensor]] = {"encoder": [], "decoder": [], "cross": []}

        def recorder(kind: str):
            def record(module: MultiHeadAttention, args: tuple, kwargs: dict) -> None:
                # The weights of exactly the queries, keys and mask this attention is called with.
                call = inspect.signature(module.forward).bind(*args, **kwargs).arguments
                x, mask = call["x"], call.get("mask")
                if call.get("is_causal"):
                    causal = causal_mask(x.shape[1], device=x.device)
                    mask = causal if mask is None else mask & causal
                maps[kind].append(module.attention_weights(x, call.get("context"), mask))
            return record

        attentions = [(layer.self_attn, "encoder") for layer in self.encoder_layers] + [
            (attn, kind) for layer in self.decoder_layers
            for attn, kind in ((layer.self_attn, "decoder"), (layer.cross_attn, "cross"))]
        hooks = [attn.register_forward_pre_hook(recorder(kind), with_kwargs=True) for attn, kind in attentions]
        try:
            self(src, tgt_in)
        finally:
            for hook in hooks:
                hook.remove()
        return {kind: torch.stack(found) for kind, found in maps.items()}

    def num_parameters(self) -> int:
        """Trainable parameters, a shared matrix counted once (as the paper counts)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def _check_teacher_forcing_args(tgt: Tensor, bos_id: int, eos_id: int, pad_id: int) -> None:
    """ValueError unless ``tgt`` is a right-padded (batch, seq) tensor of token ids without BOS/EOS and the three ids
    are different ints."""
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
    # Right-padded means no real token after the first pad: the real ones are a prefix.
    positions = torch.arange(tgt.shape[1], device=tgt.device)
    if not torch.equal(real, positions[None, :] < real.sum(dim=1, keepdim=True)):
        raise ValueError("tgt must be right-padded: no real token may follow a pad_id in a row")
    if (tgt == bos_id).any() or (tgt == eos_id).any():
        raise ValueError("tgt must not contain bos_id or eos_id; teacher_forcing adds them")


def teacher_forcing(
    tgt: Int[Tensor, "batch seq"], bos_id: int, eos_id: int, pad_id: int
) -> tuple[Int[Tensor, "batch seq_plus_1"], Int[Tensor, "batch seq_plus_1"]]:
    """``decoder_input`` = BOS + tokens, ``labels`` = tokens + EOS; both right-padded with ``pad_id``.

    ``tgt`` holds the target tokens without BOS/EOS, right-padded. EOS goes right
    after each row's last real token, so position t of the input predicts label t.
    """
    _check_teacher_forcing_args(tgt, bos_id, eos_id, pad_id)
    batch = tgt.shape[0]
    lengths = (tgt != pad_id).sum(dim=1)
    decoder_input = torch.cat([tgt.new_full((batch, 1), bos_id), tgt], dim=1)
    labels = torch.cat([tgt, tgt.new_full((batch, 1), pad_id)], dim=1)
    labels[torch.arange(batch, device=tgt.device), lengths] = eos_id
    return decoder_input, labels


# --- decoding one token at a time (chapter 6 teaches it; chapter 4's notebook decodes without it) -------------


class DecoderCache:
    """A :class:`Transformer`'s decoder run one target token at a time, keeping what does not change.

    Per decoder layer it keeps the self-attention keys and values of the target tokens fed so far (in buffers
    allocated once for ``max_len`` positions and filled in place: ``torch.cat`` at every step would copy them all),
    and the cross-attention keys and values of the encoder output, computed once per source. :meth:`logits` feeds
    only the new tokens and gives the logits :meth:`Transformer.decode` gives for them on the whole prefix;
    :meth:`reorder` keeps rows (beam search: each beam continues its parent's keys and values).

    Written apart from ``solutions.gpt.KVCache`` on purpose: chapter 4 comes before chapter 6 and cannot import its
    answers, and this cache also holds the cross-attention keys and values and the source's padding mask. It
    computes each decoder layer's three sub-layers as :meth:`DecoderLayer.forward` does (the tests compare the two).
    """

    def __init__(self, model: Transformer, memory: Float[Tensor, "batch seq_k d_model"],
                 src: Int[Tensor, "batch seq_k"], max_len: int) -> None:
        if not isinstance(model, Transformer):
            raise ValueError(f"model must be a solutions.transformer.Transformer; got {type(model).__name__}")
        c = model.config
        if not isinstance(max_len, int) or isinstance(max_len, bool) or not 1 <= max_len <= c.max_len:
            raise ValueError(f"max_len must be an int in [1, {c.max_len}] (the model's max_len); got {max_len!r}")
        if memory.dim() != 3 or memory.shape[-1] != c.d_model or memory.shape[:2] != src.shape[:2]:
            raise ValueError(f"memory must be (batch, seq_k, d_model={c.d_model}), the encoding of src "
                             f"{tuple(src.shape)}; got shape {tuple(memory.shape)}")
        self.model, self.max_len, self.length = model, max_len, 0
        self.mask = model.source_mask(src)
        self.cross = []
        for layer in model.decoder_layers:  # the encoder output's keys and values, once per source
            attn = layer.cross_attn
            bias = None if attn.in_proj.bias is None else attn.in_proj.bias[attn.d_model :]
            k, v = F.linear(memory, attn.in_proj.weight[attn.d_model :], bias).split(attn.n_kv_heads * attn.d_head, -1)
            self.cross.append((attn.split_heads(k), attn.split_heads(v)))
        shape = (memory.shape[0], model.decoder_layers[0].self_attn.n_kv_heads, max_len, c.d_head)
        self.k = [memory.new_zeros(shape) for _ in model.decoder_layers]
        self.v = [memory.new_zeros(shape) for _ in model.decoder_layers]

    def __len__(self) -> int:
        return self.length

    @property
    def batch(self) -> int:
        return self.mask.shape[0]

    def logits(self, tgt_new: Int[Tensor, "batch seq_q"]) -> Float[Tensor, "batch seq_q vocab"]:
        """The logits of the new target tokens, placed at positions ``len(self)…``; the cache then holds them too."""
        if tgt_new.dim() != 2 or tgt_new.shape[0] != self.batch:
            raise ValueError(f"tgt_new must be (batch={self.batch}, new tokens); got shape {tuple(tgt_new.shape)}")
        end = self.length + tgt_new.shape[1]
        if end > self.max_len:
            raise ValueError(f"the cache holds {self.length} tokens and was made for max_len={self.max_len}; "
                             f"{tgt_new.shape[1]} more do not fit: make it with a larger max_len")
        x = self.model._decoder_input(tgt_new, self.length)
        for i, layer in enumerate(self.model.decoder_layers):
            x = self._layer(i, layer, x, end)
        self.length = end
        return self.model.generator(self.model.decoder_norm(x))

    def _layer(self, i: int, layer: DecoderLayer, x: Tensor, end: int) -> Tensor:
        """``layer.forward`` on the new positions only, with layer ``i``'s keys and values."""

        def attend(attn: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                   is_causal: bool) -> Tensor:
            dropout_p = attn.dropout if attn.training else 0.0
            out = attention(q, k, v, mask, is_causal=is_causal, dropout_p=dropout_p, backend=attn.backend)
            return attn.out_proj(attn.merge_heads(out))

        def self_attention(h: Tensor) -> Tensor:
            q, k, v = layer.self_attn.project_qkv(h)
            self.k[i][:, :, self.length : end] = k
            self.v[i][:, :, self.length : end] = v
            # is_causal is aligned to the end: the new queries see the cached prefix and themselves.
            return attend(layer.self_attn, q, self.k[i][:, :, :end], self.v[i][:, :, :end], None, True)

        def cross_attention(h: Tensor) -> Tensor:
            attn = layer.cross_attn
            bias = None if attn.in_proj.bias is None else attn.in_proj.bias[: attn.d_model]
            q = attn.split_heads(F.linear(h, attn.in_proj.weight[: attn.d_model], bias))
            return attend(attn, q, *self.cross[i], self.mask, False)

        if layer.norm_first:
            x = x + layer.dropout1(self_attention(layer.norm1(x)))
            x = x + layer.dropout2(cross_attention(layer.norm2(x)))
            return x + layer.dropout3(layer.feed_forward(layer.norm3(x)))
        x = layer.norm1(x + layer.dropout1(self_attention(x)))
        x = layer.norm2(x + layer.dropout2(cross_attention(x)))
        return layer.norm3(x + layer.dropout3(layer.feed_forward(x)))

    def reorder(self, rows: Int[Tensor, "rows"]) -> None:
        """Keep rows ``rows`` of everything held (rows may repeat or be left out): row i becomes old row ``rows[i]``."""
        if not isinstance(rows, Tensor) or rows.dim() != 1 or rows.is_floating_point() or rows.dtype == torch.bool:
            raise ValueError(f"rows must be a 1-D tensor of row numbers; got "
                             f"{tuple(rows.shape) if isinstance(rows, Tensor) else type(rows).__name__}")
        self.k = [t.index_select(0, rows) for t in self.k]
        self.v = [t.index_select(0, rows) for t in self.v]
        self.cross = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.cross]
        self.mask = self.mask.index_select(0, rows)


__all__ = [
    "TransformerConfig", "FeedForward", "EncoderLayer", "DecoderLayer", "Transformer", "teacher_forcing",
    "DecoderCache",
]
