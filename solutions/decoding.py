"""Chapter 4 — decoding: greedy and beam search.

At inference the decoder feeds on its own outputs, one token at a time. As in
fairseq and Hugging Face, the search is kept apart from the model: a
:class:`Decoder` gives the next-token log-probabilities of a batch of target
prefixes (the source encoded once) and follows its rows when the search reorders
them (``reorder``: each beam continues its parent). :func:`greedy_search` and
:func:`beam_search_over` are the searches; :func:`greedy_decode` and
:func:`beam_search` take a model and a source batch, decode in eval mode without
gradients, and with ``use_cache=True`` (the default) use a :class:`CachedDecoder`,
which feeds only the newest token at each step (chapter 6); ``use_cache=False``
re-feeds the whole prefix. Both give the same tokens.

Beam search keeps ``beam_size`` *live* hypotheses per source row, ranked by total
log-probability. A candidate that ends in EOS among the ``beam_size`` best of a
step is set aside as finished, scored ``score / lp(length)`` with the GNMT length
penalty ``lp(n) = ((5 + n) / 6) ** length_penalty`` (n = tokens including EOS;
0 = no normalisation, larger values favour longer outputs); the live ones are the
``beam_size`` best candidates that do not end in EOS. Length normalisation applies
only where finished hypotheses of different lengths are compared, never to the
ranking of the live ones (they all have the same length). A source row is done
when its best finished hypothesis scores at least as well as its best live one
would if it ended now (its total log-probability over lp of its current length):
the check of Hugging Face's ``BeamSearchScorer`` (``early_stopping=False``), made
here against the best finished hypothesis since only one is returned. fairseq
stops once ``beam_size`` hypotheses have finished, which can end a row on
truncated translations before its best one finishes. With ``length_penalty > 0``
a live hypothesis could still overtake later (Hugging Face's
``early_stopping="never"`` waits for that); with the rule above, one beam is
greedy decoding. After ``max_len`` steps the live hypotheses finish as they are.
The output is the finished hypothesis with the best normalised score.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from solutions.transformer import DecoderCache, Transformer


def _strip(tokens: list[int], eos_id: int) -> list[int]:
    """The tokens before the first EOS (all of them when there is none)."""
    return tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens


def _length_penalty(length: int, alpha: float) -> float:
    """GNMT's ``((5 + length) / 6) ** alpha``: a finished hypothesis' score is divided by it."""
    return ((5.0 + length) / 6.0) ** alpha


class Decoder:
    """Next-token log-probabilities for a batch of target prefixes: the source encoded once, each prefix fed whole.

    ``batch`` rows, on ``device``; ``log_probs(tokens)`` for the prefixes ``tokens`` (BOS first, one row per row of
    the batch); ``reorder(rows)``: from now on row i continues old row ``rows[i]``.
    """

    def __init__(self, model: nn.Module, src: Int[Tensor, "batch seq_k"]) -> None:
        self.model, self.src = model, src
        self.memory = model.encode(src)

    @property
    def batch(self) -> int:
        return self.src.shape[0]

    @property
    def device(self) -> torch.device:
        return self.src.device

    def log_probs(self, tokens: Int[Tensor, "batch seq"]) -> Float[Tensor, "batch vocab"]:
        """log p(next token | source, ``tokens``) for every row, in float32."""
        return self.model.decode(tokens, self.memory, self.src)[:, -1].float().log_softmax(dim=-1)

    def reorder(self, rows: Int[Tensor, "new_batch"]) -> None:
        """Row i continues old row ``rows[i]``; rows may repeat (beams of one parent) or be left out."""
        self.src, self.memory = self.src[rows], self.memory[rows]


class CachedDecoder(Decoder):
    """A :class:`Decoder` that keeps each layer's keys and values (a :class:`~solutions.transformer.DecoderCache`):
    a step feeds only the tokens it has not seen. The same log-probabilities as :class:`Decoder`."""

    def __init__(self, model: Transformer, src: Int[Tensor, "batch seq_k"], max_len: int) -> None:
        super().__init__(model, src)
        self.cache = DecoderCache(model, self.memory, src, max_len)

    def log_probs(self, tokens: Int[Tensor, "batch seq"]) -> Float[Tensor, "batch vocab"]:
        return self.cache.logits(tokens[:, len(self.cache) :])[:, -1].float().log_softmax(dim=-1)

    def reorder(self, rows: Int[Tensor, "new_batch"]) -> None:
        super().reorder(rows)
        self.cache.reorder(rows)


def greedy_search(decoder: Decoder, max_len: int, bos_id: int, eos_id: int) -> list[list[int]]:
    """The most likely token at each step, every row in one call; per row the tokens without BOS, cut before EOS."""
    tokens = torch.full((decoder.batch, 1), bos_id, dtype=torch.long, device=decoder.device)
    finished = torch.zeros(decoder.batch, dtype=torch.bool, device=decoder.device)
    for _ in range(max_len):
        next_token = decoder.log_probs(tokens).argmax(dim=-1)
        next_token = next_token.masked_fill(finished, eos_id)  # a finished row only pads (cut off below)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if finished.all():
            break
    return [_strip(row, eos_id) for row in tokens[:, 1:].tolist()]


def beam_search_over(decoder: Decoder, beam_size: int, max_len: int, bos_id: int, eos_id: int,
                     length_penalty: float = 0.6) -> list[list[int]]:
    """Per source row, ``beam_size`` live hypotheses, finished ones set aside; the best finished one by
    ``score / ((5 + length) / 6) ** length_penalty`` (length including EOS), without BOS and EOS."""
    batch, beam = decoder.batch, beam_size
    device = decoder.device
    decoder.reorder(torch.arange(batch, device=device).repeat_interleave(beam))  # row b's beams: b·beam … b·beam+beam-1
    tokens = torch.full((batch * beam, 1), bos_id, dtype=torch.long, device=device)
    scores = torch.full((batch, beam), float("-inf"), device=device)
    scores[:, 0] = 0.0  # the beams start as copies of one prefix: keep one, or the first top-k repeats it
    best = torch.full((batch,), float("-inf"), device=device)  # each row's best finished normalised score
    best_tokens: list[list[int]] = [[] for _ in range(batch)]
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    for step in range(1, max_len + 1):
        log_probs = decoder.log_probs(tokens).view(batch, beam, -1)
        vocab = log_probs.shape[-1]
        # 2·beam candidates: at most beam of them end in EOS (one per live beam), so beam live ones remain.
        top, index = (scores[..., None] + log_probs).view(batch, beam * vocab).topk(2 * beam, dim=-1)
        parent, token = index // vocab, index % vocab
        ends = token == eos_id
        normalised = top / _length_penalty(step, length_penalty)
        for b, rank in (ends[:, :beam] & top[:, :beam].isfinite() & ~done[:, None]).nonzero().tolist():
            if normalised[b, rank] > best[b]:  # a finished hypothesis, set aside: is it the row's best?
                best[b] = normalised[b, rank]
                best_tokens[b] = tokens[b * beam + parent[b, rank], 1:].tolist()
        # The live beams: the best `beam` candidates that do not end in EOS, in rank order.
        live = torch.where(ends, 2 * beam, torch.arange(2 * beam, device=device)).argsort(dim=-1, stable=True)
        live = live[:, :beam]
        scores, parent, token = top.gather(1, live), parent.gather(1, live), token.gather(1, live)
        rows = (torch.arange(batch, device=device)[:, None] * beam + parent).view(-1)
        tokens = torch.cat([tokens[rows], token.view(-1, 1)], dim=1)
        decoder.reorder(rows)  # each beam continues its parent's state
        # Done when the best finished one beats the best live one as it stands (Hugging Face's check).
        done |= best >= scores.amax(dim=-1) / _length_penalty(step, length_penalty)
        if done.all():
            break
    for b in (~done).nonzero().flatten().tolist():  # max_len reached: the live hypotheses finish as they are
        for j in range(beam):
            value = scores[b, j] / _length_penalty(max_len, length_penalty)
            if value.isfinite() and value > best[b]:
                best[b], best_tokens[b] = value, tokens[b * beam + j, 1:].tolist()
    return best_tokens


# --- the library's entry points: a model and a batch of sources --------------------------------------------------


def _check_decoding_args(model: nn.Module, src: Tensor, max_len: int, bos_id: int, eos_id: int,
                         use_cache: bool) -> None:
    if not (hasattr(model, "encode") and hasattr(model, "decode")):
        raise ValueError(f"model must have encode(src) and decode(tgt_in, memory, src); got {type(model).__name__}")
    if not isinstance(use_cache, bool):
        raise ValueError(f"use_cache must be True or False; got {use_cache!r}")
    if use_cache and not isinstance(model, Transformer):
        raise ValueError(f"use_cache=True caches a solutions.transformer.Transformer's decoder; "
                         f"{type(model).__name__} is not one: pass use_cache=False")
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


class _EvalMode:
    """Dropout off while decoding; the previous mode is restored afterwards."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.was_training = model, model.training

    def __enter__(self) -> None:
        self.model.eval()

    def __exit__(self, *exc: object) -> None:
        self.model.train(self.was_training)


def _decoder(model: nn.Module, src: Tensor, max_len: int, use_cache: bool) -> Decoder:
    # The cache holds BOS and the max_len tokens fed after it.
    return CachedDecoder(model, src, max_len + 1) if use_cache else Decoder(model, src)


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
    """Greedy decoding of every source row: the tokens without BOS, up to (not incl.) EOS, at most ``max_len``."""
    _check_decoding_args(model, src, max_len, bos_id, eos_id, use_cache)
    with _EvalMode(model):
        return greedy_search(_decoder(model, src, max_len, use_cache), max_len, bos_id, eos_id)


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
    """Beam search of every source row (see the module docstring); ``beam_size=1`` is greedy decoding."""
    _check_decoding_args(model, src, max_len, bos_id, eos_id, use_cache)
    if not isinstance(beam_size, int) or isinstance(beam_size, bool) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive int; got {beam_size!r}")
    if not length_penalty >= 0:
        raise ValueError(f"length_penalty must be >= 0; got {length_penalty!r}")
    with _EvalMode(model):
        return beam_search_over(_decoder(model, src, max_len, use_cache), beam_size, max_len, bos_id, eos_id,
                                length_penalty)
