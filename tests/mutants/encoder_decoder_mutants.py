"""Planted bugs for chapter 4 (the encoder-decoder): each must FAIL the hidden checks of its exercise.

Each mutant is a copy of the library's code (``solutions.transformer``, ``schedule``, ``losses``,
``decoding``) with one realistic change. The copies are self-contained, given helpers included: calling
the library's own answers would be flagged as delegation, and a mutant must be caught by the checks
themselves.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from mutants import Mutant
from solutions.multihead import MultiHeadAttention

# --- teacher_forcing (with a copy of the given _check_teacher_forcing_args) ---


def _check_tf_args(tgt, bos_id, eos_id, pad_id):
    if tgt.dim() != 2 or tgt.is_floating_point() or tgt.dtype == torch.bool:
        raise ValueError(f"tgt must be a (batch, seq) tensor of integer token ids; got {tuple(tgt.shape)}")
    ids = {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id}
    for name, value in ids.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an int token id; got {value!r}")
    if len(set(ids.values())) != 3:
        raise ValueError(f"bos_id, eos_id and pad_id must be three different ids; got {ids}")
    real = tgt != pad_id
    if not torch.equal(real, torch.arange(tgt.shape[1])[None, :] < real.sum(dim=1, keepdim=True)):
        raise ValueError("tgt must be right-padded: no real token may follow a pad_id in a row")
    if (tgt == bos_id).any() or (tgt == eos_id).any():
        raise ValueError("tgt must not contain bos_id or eos_id; teacher_forcing adds them")


def _shifted(tgt, bos_id, eos_id, pad_id):
    lengths, batch = (tgt != pad_id).sum(dim=1), tgt.shape[0]
    decoder_input = torch.cat([tgt.new_full((batch, 1), bos_id), tgt], dim=1)
    labels = torch.cat([tgt, tgt.new_full((batch, 1), pad_id)], dim=1)
    labels[torch.arange(batch), lengths] = eos_id
    return decoder_input, labels


def tf_no_shift(tgt, bos_id, eos_id, pad_id):
    _check_tf_args(tgt, bos_id, eos_id, pad_id)
    _, labels = _shifted(tgt, bos_id, eos_id, pad_id)
    return labels.clone(), labels


def tf_shift_wrong_direction(tgt, bos_id, eos_id, pad_id):
    _check_tf_args(tgt, bos_id, eos_id, pad_id)
    decoder_input, labels = _shifted(tgt, bos_id, eos_id, pad_id)
    return labels, decoder_input


def tf_eos_after_padding(tgt, bos_id, eos_id, pad_id):
    _check_tf_args(tgt, bos_id, eos_id, pad_id)
    batch = tgt.shape[0]
    decoder_input = torch.cat([tgt.new_full((batch, 1), bos_id), tgt], dim=1)
    return decoder_input, torch.cat([tgt, tgt.new_full((batch, 1), eos_id)], dim=1)


def tf_truncated_drops_eos(tgt, bos_id, eos_id, pad_id):
    _check_tf_args(tgt, bos_id, eos_id, pad_id)
    decoder_input, labels = _shifted(tgt, bos_id, eos_id, pad_id)
    width = tgt.shape[1]  # "keep the batch width": the longest rows lose their EOS
    return decoder_input[:, :width], labels[:, :width]


def tf_hardcoded_ids(tgt, bos_id, eos_id, pad_id):
    _check_tf_args(tgt, bos_id, eos_id, pad_id)
    lengths, batch = (tgt != pad_id).sum(dim=1), tgt.shape[0]
    tgt = tgt.masked_fill(tgt == pad_id, 0)
    decoder_input = torch.cat([tgt.new_full((batch, 1), 1), tgt], dim=1)
    labels = torch.cat([tgt, tgt.new_full((batch, 1), 0)], dim=1)
    labels[torch.arange(batch), lengths] = 2
    return decoder_input, labels


def tf_trims_padding_columns(tgt, bos_id, eos_id, pad_id):
    """Columns that are padding in every row are cut first ("no need to carry them"): the output is narrower than
    the (batch, seq + 1) the exercise states, so it no longer lines up with the batch it came from."""
    _check_tf_args(tgt, bos_id, eos_id, pad_id)
    width = int((tgt != pad_id).sum(dim=1).max())
    return _shifted(tgt[:, :width], bos_id, eos_id, pad_id)


def teacher_forcing_no_checks(tgt, bos_id, eos_id, pad_id):
    """The given argument check not called: a left-padded or float tgt, equal ids or a BOS in tgt go through."""
    return _shifted(tgt, bos_id, eos_id, pad_id)


# --- DecoderLayer (own copies of the parts on chapter 2's MultiHeadAttention: the same state_dict names) ---


class _FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0, activation="relu"):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.activation = nn.ReLU() if activation == "relu" else nn.GELU()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


class _DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, *, norm_first=False, activation="relu",
                 layer_norm_eps=1e-5):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.feed_forward = _FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def self_block(self, x):
        return self.self_attn(x, is_causal=True)

    def cross_block(self, x, memory, memory_mask):
        return self.cross_attn(x, memory, memory_mask)

    def forward(self, x, memory, memory_mask=None):
        if self.norm_first:
            x = x + self.dropout1(self.self_block(self.norm1(x)))
            x = x + self.dropout2(self.cross_block(self.norm2(x), memory, memory_mask))
            return x + self.dropout3(self.feed_forward(self.norm3(x)))
        x = self.norm1(x + self.dropout1(self.self_block(x)))
        x = self.norm2(x + self.dropout2(self.cross_block(x, memory, memory_mask)))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


class DecoderNoCausalMask(_DecoderLayer):
    def self_block(self, x):
        return self.self_attn(x)


class DecoderQueryFromMemory(_DecoderLayer):
    def cross_block(self, x, memory, memory_mask):
        return self.cross_attn(memory, x)


class DecoderNoMemoryMask(_DecoderLayer):
    def cross_block(self, x, memory, memory_mask):
        return self.cross_attn(x, memory)


class DecoderCausalCrossAttention(_DecoderLayer):
    def cross_block(self, x, memory, memory_mask):
        return self.cross_attn(x, memory, memory_mask, is_causal=True)


class DecoderNoCrossResidual(_DecoderLayer):
    def forward(self, x, memory, memory_mask=None):
        if self.norm_first:
            x = x + self.dropout1(self.self_block(self.norm1(x)))
            x = self.dropout2(self.cross_block(self.norm2(x), memory, memory_mask))
            return x + self.dropout3(self.feed_forward(self.norm3(x)))
        x = self.norm1(x + self.dropout1(self.self_block(x)))
        x = self.norm2(self.dropout2(self.cross_block(x, memory, memory_mask)))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


class DecoderMixedNorms(_DecoderLayer):
    def forward(self, x, memory, memory_mask=None):
        if self.norm_first:
            x = x + self.dropout1(self.self_block(self.norm1(x)))
            x = self.norm2(x + self.dropout2(self.cross_block(x, memory, memory_mask)))  # post-norm
            return x + self.dropout3(self.feed_forward(self.norm3(x)))
        return super().forward(x, memory, memory_mask)


class DecoderDropoutAfterResidual(_DecoderLayer):
    """dropout(x + sublayer(x)): the residual stream itself is dropped (eval mode hides it)."""

    def forward(self, x, memory, memory_mask=None):
        if self.norm_first:
            x = self.dropout1(x + self.self_block(self.norm1(x)))
            x = self.dropout2(x + self.cross_block(self.norm2(x), memory, memory_mask))
            return self.dropout3(x + self.feed_forward(self.norm3(x)))
        x = self.norm1(self.dropout1(x + self.self_block(x)))
        x = self.norm2(self.dropout2(x + self.cross_block(x, memory, memory_mask)))
        return self.norm3(self.dropout3(x + self.feed_forward(x)))


class DecoderNoSublayerDropout(_DecoderLayer):
    """dropout1..3 never applied: the layer trains without the paper's residual dropout (eval mode hides it)."""

    def forward(self, x, memory, memory_mask=None):
        if self.norm_first:
            x = x + self.self_block(self.norm1(x))
            x = x + self.cross_block(self.norm2(x), memory, memory_mask)
            return x + self.feed_forward(self.norm3(x))
        x = self.norm1(x + self.self_block(x))
        x = self.norm2(x + self.cross_block(x, memory, memory_mask))
        return self.norm3(x + self.feed_forward(x))


class DecoderDropoutOnInput(_DecoderLayer):
    """Dropout on each sub-layer's input instead of its output (eval mode hides it)."""

    def forward(self, x, memory, memory_mask=None):
        if self.norm_first:
            x = x + self.self_block(self.dropout1(self.norm1(x)))
            x = x + self.cross_block(self.dropout2(self.norm2(x)), memory, memory_mask)
            return x + self.feed_forward(self.dropout3(self.norm3(x)))
        x = self.norm1(x + self.self_block(self.dropout1(x)))
        x = self.norm2(x + self.cross_block(self.dropout2(x), memory, memory_mask))
        return self.norm3(x + self.feed_forward(self.dropout3(x)))


# --- noam_scheduler (with copies of noam_lr and the given _check_noam_args) ---


def _check_noam_args(d_model, warmup, factor):
    for name, value in (("d_model", d_model), ("warmup", warmup)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")
    if not factor > 0:
        raise ValueError(f"factor must be > 0; got {factor!r}")


def _noam_lr(step, d_model, warmup, factor=1.0):
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def _check_lr(optimizer):
    for i, group in enumerate(optimizer.param_groups):
        lr = group.get("initial_lr", group["lr"])
        if lr != 1.0:
            raise ValueError(f"param group {i} has lr={lr}; make the optimizer with lr=1.0")


def _scheduler(rate):
    """A noam_scheduler that checks as the exercise says and schedules ``rate(step, d_model, warmup, factor)``."""

    def noam_scheduler(optimizer: Optimizer, d_model, warmup, factor=1.0):
        _check_noam_args(d_model, warmup, factor)
        _check_lr(optimizer)
        return LambdaLR(optimizer, lambda step: rate(step, d_model, warmup, factor))

    return noam_scheduler


def _step_zero_divides(step, d_model, warmup, factor=1.0):
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def _warmup_exponent(step, d_model, warmup, factor=1.0):
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-0.5)


def _times_adam_lr(step, d_model, warmup, factor=1.0):
    return 1e-3 * _noam_lr(step, d_model, warmup, factor)


def _one_step_ahead(step, d_model, warmup, factor=1.0):
    return _noam_lr(step + 1, d_model, warmup, factor)


def scheduler_lr_not_checked(optimizer, d_model, warmup, factor=1.0):
    _check_noam_args(d_model, warmup, factor)
    return LambdaLR(optimizer, lambda step: _noam_lr(step, d_model, warmup, factor))


def scheduler_checks_lr_not_initial_lr(optimizer, d_model, warmup, factor=1.0):
    _check_noam_args(d_model, warmup, factor)
    for group in optimizer.param_groups:
        if group["lr"] != 1.0:
            raise ValueError(f"make the optimizer with lr=1.0; got lr={group['lr']}")
    return LambdaLR(optimizer, lambda step: _noam_lr(step, d_model, warmup, factor))


def scheduler_no_arg_checks(optimizer, d_model, warmup, factor=1.0):
    """The given _check_noam_args not called: d_model 0 divides by zero, a negative warmup gives complex numbers."""
    _check_lr(optimizer)
    return LambdaLR(optimizer, lambda step: _noam_lr(step, d_model, warmup, factor))


# --- label_smoothed_cross_entropy ---


def _flat(logits, target):
    vocab = logits.shape[-1]
    return logits.reshape(-1, vocab), target.reshape(-1), vocab


def ls_loss_over_padding(logits, target, epsilon=0.1, ignore_index=None):
    logits, target, vocab = _flat(logits, target)
    smoothed = (1.0 - epsilon) * F.one_hot(target, vocab).to(logits.dtype) + epsilon / vocab
    return -(smoothed * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def ls_normalised_by_all_positions(logits, target, epsilon=0.1, ignore_index=None):
    logits, target, vocab = _flat(logits, target)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    smoothed = (1.0 - epsilon) * F.one_hot(target.masked_fill(~keep, 0), vocab).to(logits.dtype) + epsilon / vocab
    loss = -(smoothed * F.log_softmax(logits, dim=-1)).sum(dim=-1)
    return loss[keep].sum() / target.numel()


def ls_annotated_convention(logits, target, epsilon=0.1, ignore_index=None):
    logits, target, vocab = _flat(logits, target)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    onehot = F.one_hot(target.masked_fill(~keep, 0), vocab).to(logits.dtype)
    smoothed = (1.0 - epsilon) * onehot + epsilon / (vocab - 2) * (1 - onehot)
    if ignore_index is not None:
        smoothed[:, ignore_index] = 0.0
    loss = -(smoothed * F.log_softmax(logits, dim=-1)).sum(dim=-1)
    return loss[keep].sum() / keep.sum()


def ls_kldiv_fed_probabilities(logits, target, epsilon=0.1, ignore_index=None):
    logits, target, vocab = _flat(logits, target)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    smoothed = (1.0 - epsilon) * F.one_hot(target.masked_fill(~keep, 0), vocab).to(logits.dtype) + epsilon / vocab
    # nn.KLDivLoss expects log-probabilities as its input; given probabilities it computes nonsense.
    loss = F.kl_div(logits.softmax(dim=-1), smoothed, reduction="none").sum(dim=-1)
    return loss[keep].sum() / keep.sum()


def ls_log_of_softmax(logits, target, epsilon=0.1, ignore_index=None):
    logits, target, vocab = _flat(logits, target)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    smoothed = (1.0 - epsilon) * F.one_hot(target.masked_fill(~keep, 0), vocab).to(logits.dtype) + epsilon / vocab
    loss = -(smoothed * torch.log(logits.softmax(dim=-1))).sum(dim=-1)
    return loss[keep].sum() / keep.sum()


def ls_smoothed_twice(logits, target, epsilon=0.1, ignore_index=None):
    logits, target, vocab = _flat(logits, target)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    smoothed = (1.0 - epsilon) * F.one_hot(target.masked_fill(~keep, 0), vocab).to(logits.dtype) + epsilon / vocab
    smoothed = (1.0 - epsilon) * smoothed + epsilon / vocab
    loss = -(smoothed * F.log_softmax(logits, dim=-1)).sum(dim=-1)
    return loss[keep].sum() / keep.sum()


def _smoothed_mean(logits, target, epsilon, ignore_index):
    logits, target, vocab = _flat(logits, target)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    smoothed = (1.0 - epsilon) * F.one_hot(target.masked_fill(~keep, 0), vocab).to(logits.dtype) + epsilon / vocab
    loss = -(smoothed * F.log_softmax(logits, dim=-1)).sum(dim=-1)
    return loss[keep].sum() / keep.sum()


def ls_pad_column_excluded(logits, target, epsilon=0.1, ignore_index=None):
    """ε/(V−1) on every class but the padding column, which gets nothing: smoothing "over the real tokens"."""
    logits, target, vocab = _flat(logits, target)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    smoothed = torch.full_like(logits, epsilon / (vocab - 1))
    if ignore_index is not None:
        smoothed[:, ignore_index] = 0.0
    smoothed.scatter_(1, target.masked_fill(~keep, 0)[:, None], 1.0 - epsilon + epsilon / (vocab - 1))
    loss = -(smoothed * F.log_softmax(logits, dim=-1)).sum(dim=-1)
    return loss[keep].sum() / keep.sum()


def ls_summed(logits, target, epsilon=0.1, ignore_index=None):
    """The sum over the non-ignored positions instead of their mean (reduction="sum")."""
    logits, target, vocab = _flat(logits, target)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    smoothed = (1.0 - epsilon) * F.one_hot(target.masked_fill(~keep, 0), vocab).to(logits.dtype) + epsilon / vocab
    return -(smoothed * F.log_softmax(logits, dim=-1)).sum(dim=-1)[keep].sum()




def _check_ls_args(logits, target, epsilon, ignore_index):
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1]; got {epsilon}")
    if logits.dim() < 1 or logits.shape[:-1] != target.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not fit target {tuple(target.shape)}")
    if target.is_floating_point() or target.dtype == torch.bool:
        raise ValueError(f"target must hold integer class ids; got dtype {target.dtype}")
    kept = target if ignore_index is None else target[target != ignore_index]
    if kept.numel() and (kept.min() < 0 or kept.max() >= logits.shape[-1]):
        raise ValueError("target holds ids outside the vocabulary")


def _checked(loss):
    """The mutant ``loss`` after the given _check_smoothing_args, as the exercise asks."""

    def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=None):
        _check_ls_args(logits, target, epsilon, ignore_index)
        return loss(logits, target, epsilon, ignore_index)

    return label_smoothed_cross_entropy


def ls_refuses_sentinel(logits, target, epsilon=0.1, ignore_index=None):
    """Every target id checked against the vocabulary before the ignored ones are left out: ignore_index=-100,
    PyTorch's default and what Hugging Face pads labels with, is refused."""
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1]; got {epsilon}")
    if logits.shape[:-1] != target.shape or target.is_floating_point():
        raise ValueError("logits and target do not fit")
    if target.min() < 0 or target.max() >= logits.shape[-1]:
        raise ValueError(f"target holds ids outside [0, {logits.shape[-1]})")
    return _smoothed_mean(logits, target, epsilon, ignore_index)


def ls_one_hot_of_sentinel(logits, target, epsilon=0.1, ignore_index=None):
    """one_hot of the whole target, ignored positions included: a padding id works, -100 makes F.one_hot fail."""
    _check_ls_args(logits, target, epsilon, ignore_index)
    logits, target, vocab = _flat(logits, target)
    keep = torch.ones_like(target, dtype=torch.bool) if ignore_index is None else target != ignore_index
    smoothed = (1.0 - epsilon) * F.one_hot(target, vocab).to(logits.dtype) + epsilon / vocab
    loss = -(smoothed * F.log_softmax(logits, dim=-1)).sum(dim=-1)
    return loss[keep].sum() / keep.sum()


def label_smoothing_no_checks(logits, target, epsilon=0.1, ignore_index=None):
    """The given _check_smoothing_args not called: epsilon=1.5 is used, mismatched shapes are flattened together."""
    return _smoothed_mean(logits, target, epsilon, ignore_index)


# --- greedy_search / beam_search_over, on the decoder protocol (batch, device, log_probs, reorder) ---


def _strip(tokens, eos_id):
    return tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens


def _greedy(decoder, max_len, bos_id, eos_id, *, stop="all", strip=True, calls=1, steps=None):
    tokens = torch.full((decoder.batch, 1), bos_id, dtype=torch.long)
    finished = torch.zeros(decoder.batch, dtype=torch.bool)
    for _ in range(max_len if steps is None else steps):
        for _ in range(calls):
            log_probs = decoder.log_probs(tokens)
        next_token = log_probs.argmax(dim=-1).masked_fill(finished, eos_id)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if finished.all() or (stop == "any" and finished.any()):
            break
    return [_strip(row, eos_id) if strip else row for row in tokens[:, 1:].tolist()]


def greedy_stops_at_first_eos(decoder, max_len, bos_id, eos_id):
    return _greedy(decoder, max_len, bos_id, eos_id, stop="any")


def greedy_keeps_eos_and_after(decoder, max_len, bos_id, eos_id):
    return _greedy(decoder, max_len, bos_id, eos_id, strip=False)


def greedy_bos_hardcoded(decoder, max_len, bos_id, eos_id):
    return _greedy(decoder, max_len, 1, eos_id)


def greedy_one_step_too_many(decoder, max_len, bos_id, eos_id):
    """range(max_len + 1): one token more than max_len when a row never ends."""
    return _greedy(decoder, max_len, bos_id, eos_id, steps=max_len + 1)


def greedy_two_calls_per_step(decoder, max_len, bos_id, eos_id):
    """The decoder asked twice per step (once more "to be sure"): twice the forward passes the exercise allows."""
    return _greedy(decoder, max_len, bos_id, eos_id, calls=2)


def _penalty(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


def _beam(decoder, beam_size, max_len, bos_id, eos_id, length_penalty=0.6, *, bug=None):
    batch, beam = decoder.batch, beam_size
    decoder.reorder(torch.arange(batch).repeat_interleave(beam))
    tokens = torch.full((batch * beam, 1), bos_id, dtype=torch.long)
    scores = torch.full((batch, beam), float("-inf"))
    scores[:, 0] = 0.0
    if bug == "all_start_zero":
        scores[:] = 0.0
    alpha = 0.0 if bug == "no_length_penalty" else length_penalty
    extra = 0 if bug == "length_without_eos" else 1
    width = beam if bug == "top_k_only" else 2 * beam
    finished = [[] for _ in range(batch)]
    done = torch.zeros(batch, dtype=torch.bool)
    for step in range(1, max_len + 1):
        log_probs = decoder.log_probs(tokens).view(batch, beam, -1)
        vocab = log_probs.shape[-1]
        top, index = (scores[..., None] + log_probs).view(batch, beam * vocab).topk(width, dim=-1)
        parent, token = index // vocab, index % vocab
        ends = token == eos_id
        for b, rank in (ends[:, :beam] & top[:, :beam].isfinite() & ~done[:, None]).nonzero().tolist():
            hypothesis = tokens[b * beam + parent[b, rank], 1:].tolist()
            finished[b].append((top[b, rank].item() / _penalty(step - 1 + extra, alpha), hypothesis))
        order = torch.where(ends, 2 * width, torch.arange(width)).argsort(dim=-1, stable=True)[:, :beam]
        if bug == "top_k_only":  # fewer live beams when some candidates ended: pad with dead (-inf) ones
            alive = torch.gather(~ends, 1, order)
            scores = torch.where(alive, top.gather(1, order), torch.full_like(top[:, :beam], float("-inf")))
        else:
            scores = top.gather(1, order)
        parent, token = parent.gather(1, order), token.gather(1, order)
        rows = (torch.arange(batch)[:, None] * beam + parent).view(-1)
        tokens = torch.cat([tokens[rows], token.view(-1, 1)], dim=1)
        if bug != "decoder_not_reordered":
            decoder.reorder(rows)
        for b in range(batch):
            if not finished[b] or done[b]:
                continue
            if bug == "first_finished" or (bug == "k_finished" and len(finished[b]) >= beam):
                done[b] = True
            elif bug != "k_finished":
                done[b] = max(v for v, _ in finished[b]) >= scores[b].max().item() / _penalty(step, alpha)
        if done.all():
            break
    for b in (~done).nonzero().flatten().tolist():
        for j in range(beam):
            if scores[b, j].isfinite():
                hypothesis = tokens[b * beam + j, 1:].tolist()
                finished[b].append((scores[b, j].item() / _penalty(len(hypothesis), alpha), hypothesis))
    return [max(found, key=lambda h: h[0])[1] for found in finished]


def _beam_kept_in_beam(decoder, beam_size, max_len, bos_id, eos_id, length_penalty=0.6):
    """The simplification this chapter used to teach: finished hypotheses stay in the beam (one continuation at no
    cost), compete with the live ones by total log-probability and are normalised only at the end."""
    batch, beam = decoder.batch, beam_size
    decoder.reorder(torch.arange(batch).repeat_interleave(beam))
    tokens = torch.full((batch * beam, 1), bos_id, dtype=torch.long)
    scores = torch.full((batch, beam), float("-inf"))
    scores[:, 0] = 0.0
    finished = torch.zeros(batch, beam, dtype=torch.bool)
    lengths = torch.zeros(batch, beam)
    for _ in range(max_len):
        log_probs = decoder.log_probs(tokens).view(batch, beam, -1)
        vocab = log_probs.shape[-1]
        stay = torch.full_like(log_probs, float("-inf"))
        stay[..., eos_id] = 0.0
        log_probs = torch.where(finished[..., None], stay, log_probs)
        scores, index = (scores[..., None] + log_probs).view(batch, beam * vocab).topk(beam, dim=-1)
        parent, token = index // vocab, index % vocab
        rows = (torch.arange(batch)[:, None] * beam + parent).view(-1)
        tokens = torch.cat([tokens[rows], token.view(-1, 1)], dim=1)
        decoder.reorder(rows)
        was_finished = finished.gather(1, parent)
        lengths = lengths.gather(1, parent) + (~was_finished).float()
        finished = was_finished | (token == eos_id)
        if finished.all():
            break
    best = (scores / ((5.0 + lengths) / 6.0) ** length_penalty).argmax(dim=-1)
    chosen = tokens.view(batch, beam, -1)[torch.arange(batch), best, 1:]
    return [_strip(row, eos_id) for row in chosen.tolist()]


def _beam_mutant(bug):
    def beam_search_over(decoder, beam_size, max_len, bos_id, eos_id, length_penalty=0.6):
        return _beam(decoder, beam_size, max_len, bos_id, eos_id, length_penalty, bug=bug)

    return beam_search_over


MUTANTS: list[Mutant] = [
    Mutant("tf_no_shift", "teacher_forcing",
           "no teacher-forcing shift: the decoder input equals the labels, the loss falls to ~0 and decoding is "
           "garbage", tf_no_shift),
    Mutant("tf_shift_wrong_direction", "teacher_forcing",
           "shifted the wrong way: the decoder reads tokens + EOS and predicts BOS + tokens", tf_shift_wrong_direction),
    Mutant("tf_eos_after_padding", "teacher_forcing",
           "EOS appended after the padding of the batch, not after each row's last token: short rows never learn "
           "to stop", tf_eos_after_padding),
    Mutant("tf_truncated_drops_eos", "teacher_forcing",
           "inputs and labels cut to the batch width, which drops the EOS of the longest rows (a max_length "
           "truncation applied after adding EOS)", tf_truncated_drops_eos),
    Mutant("tf_hardcoded_ids", "teacher_forcing",
           "BOS/EOS/PAD hard-coded as 1, 2, 0: a different tokenizer's ids differ between training and decoding",
           tf_hardcoded_ids),
    Mutant("tf_trims_padding_columns", "teacher_forcing",
           "columns of padding in every row cut before the shift: an input longer than needed is silently made "
           "shorter, and the output no longer has seq + 1 columns", tf_trims_padding_columns),
    Mutant("teacher_forcing_no_checks", "teacher_forcing",
           "the given argument check not called: a left-padded or float tgt, equal ids or a BOS in tgt go through",
           teacher_forcing_no_checks),
    Mutant("decoder_no_causal_mask", "DecoderLayer",
           "decoder self-attention without the causal mask: changing a future target token changes earlier "
           "outputs; training loss collapses while greedy decoding is garbage", DecoderNoCausalMask),
    Mutant("decoder_query_from_memory", "DecoderLayer",
           "cross-attention with Q from the encoder output and K/V from the decoder; hidden when source and "
           "target have the same length", DecoderQueryFromMemory),
    Mutant("decoder_no_memory_mask", "DecoderLayer",
           "no source padding mask in cross-attention: the output depends on how much padding the batch has",
           DecoderNoMemoryMask),
    Mutant("decoder_causal_cross_attention", "DecoderLayer",
           "is_causal=True copied onto the cross-attention: target position i only reads the first source tokens",
           DecoderCausalCrossAttention),
    Mutant("decoder_no_cross_residual", "DecoderLayer",
           "the residual connection around the cross-attention is missing", DecoderNoCrossResidual),
    Mutant("decoder_mixed_norms", "DecoderLayer",
           "pre-norm and post-norm mixed: with norm_first=True the cross-attention block is still post-norm",
           DecoderMixedNorms),
    Mutant("decoder_dropout_after_residual", "DecoderLayer",
           "training mode only: dropout applied to x + sublayer(x), dropping the residual stream itself; every "
           "eval-mode check passes", DecoderDropoutAfterResidual),
    Mutant("decoder_no_sublayer_dropout", "DecoderLayer",
           "training mode only: dropout1..3 never applied, so the model trains without the paper's residual dropout; "
           "every eval-mode check passes", DecoderNoSublayerDropout),
    Mutant("decoder_dropout_on_input", "DecoderLayer",
           "training mode only: dropout on each sub-layer's input instead of its output; every eval-mode check "
           "passes", DecoderDropoutOnInput),
    Mutant("noam_step_zero_divides", "noam_scheduler",
           "step 0 not taken as 1: 0 ** -0.5 raises ZeroDivisionError when LambdaLR asks for the first lr",
           _scheduler(_step_zero_divides)),
    Mutant("noam_warmup_exponent", "noam_scheduler",
           "warm-up written as step · warmup^-0.5 instead of step · warmup^-1.5", _scheduler(_warmup_exponent)),
    Mutant("noam_times_adam_lr", "noam_scheduler",
           "the Noam rate multiplied by a usual Adam lr of 1e-3: the schedule is 1000× too small",
           _scheduler(_times_adam_lr)),
    Mutant("scheduler_one_step_ahead", "noam_scheduler",
           "the lambda adds 1 to the step: every update uses the next step's lr", _scheduler(_one_step_ahead)),
    Mutant("scheduler_lr_not_checked", "noam_scheduler",
           "LambdaLR over an optimizer made with lr=1e-3: the schedule is silently multiplied by it",
           scheduler_lr_not_checked),
    Mutant("scheduler_checks_lr_not_initial_lr", "noam_scheduler",
           "checks each group's current lr, not the initial_lr LambdaLR scales: after an earlier scheduler it "
           "refuses a good optimizer and accepts one whose schedule is silently scaled",
           scheduler_checks_lr_not_initial_lr),
    Mutant("scheduler_no_arg_checks", "noam_scheduler",
           "the given _check_noam_args not called: d_model 0 divides by zero, a negative warmup gives complex lrs",
           scheduler_no_arg_checks),
    Mutant("ls_loss_over_padding", "label_smoothed_cross_entropy",
           "ignore_index ignored: the pad positions count in the loss", _checked(ls_loss_over_padding)),
    Mutant("ls_normalised_by_all_positions", "label_smoothed_cross_entropy",
           "pad positions left out of the sum but counted in the mean", _checked(ls_normalised_by_all_positions)),
    Mutant("ls_annotated_convention", "label_smoothed_cross_entropy",
           "the Annotated Transformer's ε/(V−2) with a zero padding column, where PyTorch's convention (ε/V on "
           "every class) is the contract", _checked(ls_annotated_convention)),
    Mutant("ls_kldiv_fed_probabilities", "label_smoothed_cross_entropy",
           "KLDivLoss fed probabilities instead of log-probabilities", _checked(ls_kldiv_fed_probabilities)),
    Mutant("ls_log_of_softmax", "label_smoothed_cross_entropy",
           "log(softmax(x)) instead of log_softmax: -inf (then inf or nan) for large logits",
           _checked(ls_log_of_softmax)),
    Mutant("ls_smoothed_twice", "label_smoothed_cross_entropy",
           "label smoothing applied twice (a smoothed target handed to a loss that smooths again)",
           _checked(ls_smoothed_twice)),
    Mutant("ls_pad_column_excluded", "label_smoothed_cross_entropy",
           "ε/(V−1) over every class but the padding column, which gets nothing: label smoothing kept off the pad "
           "column, where this library's (PyTorch's) convention smooths every class", _checked(ls_pad_column_excluded)),
    Mutant("ls_summed", "label_smoothed_cross_entropy",
           "the loss summed over the positions instead of averaged: it grows with the batch and the padding",
           _checked(ls_summed)),
    Mutant("ls_refuses_sentinel", "label_smoothed_cross_entropy",
           "every target id checked against the vocabulary before the ignored ones are left out: ignore_index=-100 "
           "(PyTorch's default, Hugging Face's label padding) is refused", ls_refuses_sentinel),
    Mutant("ls_one_hot_of_sentinel", "label_smoothed_cross_entropy",
           "F.one_hot of the whole target, ignored positions included: works with a padding id, fails on -100",
           ls_one_hot_of_sentinel),
    Mutant("label_smoothing_no_checks", "label_smoothed_cross_entropy",
           "the given _check_smoothing_args not called: epsilon=1.5 is used, logits and a target of other shapes "
           "are flattened together", label_smoothing_no_checks),
    Mutant("greedy_stops_at_first_eos", "greedy_search",
           "no per-row EOS stop: the batch loop breaks when the first row emits EOS, truncating the others",
           greedy_stops_at_first_eos),
    Mutant("greedy_keeps_eos_and_after", "greedy_search",
           "rows returned with their EOS and the tokens generated after it", greedy_keeps_eos_and_after),
    Mutant("greedy_bos_hardcoded", "greedy_search",
           "BOS hard-coded as 1: a BOS id that differs between training and decoding", greedy_bos_hardcoded),
    Mutant("greedy_one_step_too_many", "greedy_search",
           "range(max_len + 1): a row that never ends gets one token more than max_len", greedy_one_step_too_many),
    Mutant("greedy_two_calls_per_step", "greedy_search",
           "the decoder asked twice per step: the right tokens for twice the forward passes (a stated 'how' rule: one "
           "call per step)", greedy_two_calls_per_step),
    Mutant("beam_all_start_zero", "beam_search_over",
           "all beams start at score 0: the first step fills the beam with k copies of one prefix (greedy's answer)",
           _beam_mutant("all_start_zero")),
    Mutant("beam_decoder_not_reordered", "beam_search_over",
           "the tokens are re-indexed by parent but the decoder is not: with a cache each beam continues another "
           "beam's keys and values", _beam_mutant("decoder_not_reordered")),
    Mutant("beam_no_length_normalisation", "beam_search_over",
           "finished hypotheses compared by total log-probability: the empty or shortest output wins",
           _beam_mutant("no_length_penalty")),
    Mutant("beam_length_without_eos", "beam_search_over",
           "the length in the penalty leaves EOS out (tokens before EOS), so longer outputs are favoured a little "
           "more than the formula says", _beam_mutant("length_without_eos")),
    Mutant("beam_kept_in_beam", "beam_search_over",
           "finished hypotheses kept in the beam, competing by raw score and taking live beams' places, normalised "
           "only at the end (the simplification this chapter used to present as the method)", _beam_kept_in_beam),
    Mutant("beam_top_k_only", "beam_search_over",
           "top-k instead of top-2k candidates: when some end in EOS fewer than k beams stay live",
           _beam_mutant("top_k_only")),
    Mutant("beam_first_finished", "beam_search_over",
           "a source row stops at its first finished hypothesis, though a live one still scores better",
           _beam_mutant("first_finished")),
    Mutant("beam_k_finished", "beam_search_over",
           "fairseq's stop: a source row ends once beam_size hypotheses have finished, though a live one still scores "
           "better (with a peaked model the finished ones are truncated translations)", _beam_mutant("k_finished")),
]
