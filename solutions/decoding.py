"""Chapter 4 — decoding: greedy and beam search.

At inference the decoder feeds on its own outputs, one token at a time. The
source is encoded once. With ``use_cache=True`` (the default) a
:class:`~solutions.transformer.DecoderCache` keeps each layer's self-attention
keys/values of the tokens so far and the cross-attention keys/values of the
source, so a step only feeds the newest token; ``use_cache=False`` re-runs the
decoder on the whole prefix at every step. Both give the same tokens.

Greedy takes the most likely token at each step. Beam search keeps the
``beam_size`` best prefixes by total log-probability and, at the end, picks
the best finished hypothesis by ``score / lp(length)`` with the GNMT length
penalty ``lp(n) = ((5 + n) / 6) ** length_penalty`` (0 = no normalisation;
larger values favour longer outputs).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn


def _check_decoding_args(model: nn.Module, src: Tensor, max_len: int, bos_id: int, eos_id: int,
                         use_cache: bool) -> None:
    if not (hasattr(model, "encode") and hasattr(model, "decode")):
        raise ValueError(f"model must have encode(src) and decode(tgt_in, memory, src); got {type(model).__name__}")
    if not isinstance(use_cache, bool):
        raise ValueError(f"use_cache must be True or False; got {use_cache!r}")
    if use_cache and not hasattr(model, "new_cache"):
        raise ValueError(f"use_cache=True needs model.new_cache(memory, max_len); {type(model).__name__} has none: "
                         "pass use_cache=False")
    if not isinstance(src, Tensor) or src.dim() != 2 or src.is_floating_point() or src.dtype == torch.bool:
        raise ValueError("src must be a (batch, seq) tensor of integer token ids")
    if src.shape[0] == 0:
        raise ValueError("src has no rows; pass at least one source sequence")
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len < 1:
        raise ValueError(f"max_len must be a positive int; got {max_len!r}")
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative int token id; got {value!r}")
    config = getattr(model, "config", None)
    if config is not None:
        for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
            if value >= config.tgt_vocab:
                raise ValueError(f"{name}={value} is outside the target vocabulary [0, {config.tgt_vocab})")
        if max_len + 1 > config.max_len:
            raise ValueError(
                f"max_len={max_len} needs {max_len + 1} decoder positions but the model has "
                f"max_len={config.max_len}; decode at most {config.max_len - 1} tokens"
            )


def _filler(model: nn.Module, eos_id: int) -> int:
    """The token fed after a row has finished (its value never matters; pad when known)."""
    config = getattr(model, "config", None)
    return getattr(config, "pad_id", eos_id)


def _strip(tokens: list[int], eos_id: int) -> list[int]:
    return tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens


class _EvalMode:
    """Dropout off while decoding; the previous mode is restored afterwards."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.was_training = model, model.training

    def __enter__(self) -> None:
        self.model.eval()

    def __exit__(self, *exc: object) -> None:
        self.model.train(self.was_training)


def next_token_logits(
    model: nn.Module,
    tokens: Int[Tensor, "batch seq"],
    memory: Float[Tensor, "batch seq_k d_model"],
    src: Int[Tensor, "batch seq_k"],
    cache=None,
) -> Float[Tensor, "batch vocab"]:
    """Logits of the token that follows ``tokens`` (BOS + the tokens chosen so far), for every row.

    With a cache only the tokens it has not seen are fed (one per step); without, the whole prefix.
    """
    if cache is None:
        return model.decode(tokens, memory, src)[:, -1]
    return model.decode(tokens[:, len(cache) :], memory, src, cache=cache)[:, -1]


@torch.inference_mode()
def greedy_decode(
    model: nn.Module,
    src: Int[Tensor, "batch seq_k"],
    max_len: int,
    bos_id: int,
    eos_id: int,
    *,
    use_cache: bool = True,
) -> list[list[int]]:
    """The most likely token at each step; per source row the tokens without BOS, up to (not incl.) EOS."""
    _check_decoding_args(model, src, max_len, bos_id, eos_id, use_cache)
    with _EvalMode(model):
        memory = model.encode(src)
        cache = model.new_cache(memory, max_len) if use_cache else None
        batch = src.shape[0]
        tokens = src.new_full((batch, 1), bos_id)
        finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            next_token = next_token_logits(model, tokens, memory, src, cache).argmax(dim=-1)
            next_token = next_token.masked_fill(finished, _filler(model, eos_id))
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            finished |= next_token == eos_id
            if finished.all():
                break
    return [_strip(row, eos_id) for row in tokens[:, 1:].tolist()]


@torch.inference_mode()
def beam_search(
    model: nn.Module,
    src: Int[Tensor, "batch seq_k"],
    beam_size: int,
    max_len: int,
    bos_id: int,
    eos_id: int,
    length_penalty: float = 0.6,
    *,
    use_cache: bool = True,
) -> list[list[int]]:
    """Keep the ``beam_size`` best prefixes per source row; return the best by length-normalised score."""
    _check_decoding_args(model, src, max_len, bos_id, eos_id, use_cache)
    if not isinstance(beam_size, int) or isinstance(beam_size, bool) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive int; got {beam_size!r}")
    if not length_penalty >= 0:
        raise ValueError(f"length_penalty must be >= 0; got {length_penalty!r}")
    filler = _filler(model, eos_id)
    with _EvalMode(model):
        batch, beam = src.shape[0], beam_size
        src_beams = src.repeat_interleave(beam, dim=0)  # row b's beams are rows b·beam … b·beam + beam-1
        memory = model.encode(src).repeat_interleave(beam, dim=0)  # encode once
        cache = model.new_cache(memory, max_len) if use_cache else None
        tokens = src.new_full((batch * beam, 1), bos_id)
        scores = torch.full((batch, beam), float("-inf"), device=src.device)
        scores[:, 0] = 0.0  # all beams start identical: keep one, or the top-k would repeat it
        finished = torch.zeros(batch, beam, dtype=torch.bool, device=src.device)
        lengths = torch.zeros(batch, beam, device=src.device)  # generated tokens incl. EOS
        for _ in range(max_len):
            log_probs = next_token_logits(model, tokens, memory, src_beams, cache).log_softmax(dim=-1).float()
            vocab = log_probs.shape[-1]
            log_probs = log_probs.view(batch, beam, vocab)
            # A finished beam has exactly one continuation, the filler, at no cost.
            stay = torch.full_like(log_probs, float("-inf"))
            stay[..., filler] = 0.0
            log_probs = torch.where(finished[..., None], stay, log_probs)
            candidates = (scores[..., None] + log_probs).view(batch, beam * vocab)
            scores, index = candidates.topk(beam, dim=-1)
            parent, next_token = index // vocab, index % vocab
            rows = (torch.arange(batch, device=src.device)[:, None] * beam + parent).view(-1)
            tokens = torch.cat([tokens[rows], next_token.view(-1, 1)], dim=1)
            if cache is not None:
                cache.reorder(rows)  # each beam continues its parent's keys and values
            was_finished = finished.gather(1, parent)
            lengths = lengths.gather(1, parent) + (~was_finished).float()
            finished = was_finished | (next_token == eos_id)
            if finished.all():
                break
        normalised = scores / ((5.0 + lengths) / 6.0) ** length_penalty
        best = normalised.argmax(dim=-1)
        chosen = tokens.view(batch, beam, -1)[torch.arange(batch, device=src.device), best, 1:]
    return [_strip(row, eos_id) for row in chosen.tolist()]
