"""Planted bugs for chapter 4 (the encoder-decoder): each must FAIL the hidden checks of its exercise.

Each mutant is a copy of the library's code (``solutions.transformer``, ``schedule``, ``losses``,
``decoding``) with one realistic change. The copies are self-contained: calling the library's own
answers would be flagged as delegation, and a mutant must be caught by the checks themselves.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from mutants import Mutant
from solutions.attention import attention
from solutions.multihead import MultiHeadAttention

# --- teacher_forcing ---


def _rows(tgt, pad_id):
    lengths = (tgt != pad_id).sum(dim=1)
    batch = tgt.shape[0]
    return lengths, batch


def tf_no_shift(tgt, bos_id, eos_id, pad_id):
    lengths, batch = _rows(tgt, pad_id)
    labels = torch.cat([tgt, tgt.new_full((batch, 1), pad_id)], dim=1)
    labels[torch.arange(batch), lengths] = eos_id
    return labels.clone(), labels


def tf_shift_wrong_direction(tgt, bos_id, eos_id, pad_id):
    lengths, batch = _rows(tgt, pad_id)
    decoder_input = torch.cat([tgt.new_full((batch, 1), bos_id), tgt], dim=1)
    labels = torch.cat([tgt, tgt.new_full((batch, 1), pad_id)], dim=1)
    labels[torch.arange(batch), lengths] = eos_id
    return labels, decoder_input


def tf_eos_after_padding(tgt, bos_id, eos_id, pad_id):
    batch = tgt.shape[0]
    decoder_input = torch.cat([tgt.new_full((batch, 1), bos_id), tgt], dim=1)
    return decoder_input, torch.cat([tgt, tgt.new_full((batch, 1), eos_id)], dim=1)


def tf_truncated_drops_eos(tgt, bos_id, eos_id, pad_id):
    lengths, batch = _rows(tgt, pad_id)
    decoder_input = torch.cat([tgt.new_full((batch, 1), bos_id), tgt], dim=1)
    labels = torch.cat([tgt, tgt.new_full((batch, 1), pad_id)], dim=1)
    labels[torch.arange(batch), lengths] = eos_id
    width = tgt.shape[1]  # "keep the batch width": the longest rows lose their EOS
    return decoder_input[:, :width], labels[:, :width]


def tf_hardcoded_ids(tgt, bos_id, eos_id, pad_id):
    lengths, batch = _rows(tgt, pad_id)
    tgt = tgt.masked_fill(tgt == pad_id, 0)
    decoder_input = torch.cat([tgt.new_full((batch, 1), 1), tgt], dim=1)
    labels = torch.cat([tgt, tgt.new_full((batch, 1), 0)], dim=1)
    labels[torch.arange(batch), lengths] = 2
    return decoder_input, labels


def _shifted(tgt, bos_id, eos_id, pad_id):
    lengths, batch = _rows(tgt, pad_id)
    decoder_input = torch.cat([tgt.new_full((batch, 1), bos_id), tgt], dim=1)
    labels = torch.cat([tgt, tgt.new_full((batch, 1), pad_id)], dim=1)
    labels[torch.arange(batch), lengths] = eos_id
    return decoder_input, labels


def teacher_forcing_no_checks(tgt, bos_id, eos_id, pad_id):
    """The shift without any of the stated checks: a left-padded row gets its EOS in the wrong column."""
    return _shifted(tgt, bos_id, eos_id, pad_id)


def tf_no_right_padding_check(tgt, bos_id, eos_id, pad_id):
    """Checks tgt's shape and dtype and the ids, not that rows are right-padded."""
    if tgt.dim() != 2 or tgt.is_floating_point():
        raise ValueError(f"tgt must be a (batch, seq) tensor of token ids; got {tuple(tgt.shape)}, {tgt.dtype}")
    if len({bos_id, eos_id, pad_id}) != 3:
        raise ValueError("bos_id, eos_id and pad_id must differ")
    if (tgt == bos_id).any() or (tgt == eos_id).any():
        raise ValueError("tgt must not contain bos_id or eos_id")
    return _shifted(tgt, bos_id, eos_id, pad_id)


# --- DecoderLayer (own copies of the parts on chapter 2's MultiHeadAttention: the same state_dict names) ---


class _CachedAttention(MultiHeadAttention):
    def keys_values(self, context):
        bias = None if self.in_proj.bias is None else self.in_proj.bias[self.d_model :]
        k, v = F.linear(context, self.in_proj.weight[self.d_model :], bias).split(self.n_kv_heads * self.d_head, dim=-1)
        return self.split_heads(k), self.split_heads(v)

    def forward(self, x, context=None, mask=None, *, is_causal=False, cache=None, layer=0):
        if cache is None:
            return super().forward(x, context, mask, is_causal=is_causal)
        if context is None:
            q, k, v = self.project_qkv(x)
            k, v = cache.write(layer, k, v)
        else:
            bias = None if self.in_proj.bias is None else self.in_proj.bias[: self.d_model]
            q = self.split_heads(F.linear(x, self.in_proj.weight[: self.d_model], bias))
            k, v = cache.cross_keys_values(layer)
        out = attention(q, k, v, mask, is_causal=is_causal)
        return self.out_proj(self.merge_heads(out))


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
        self.self_attn = _CachedAttention(d_model, n_heads, dropout=dropout)
        self.cross_attn = _CachedAttention(d_model, n_heads, dropout=dropout)
        self.feed_forward = _FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def self_block(self, x, cache, layer):
        return self.self_attn(x, is_causal=True, cache=cache, layer=layer)

    def cross_block(self, x, memory, memory_mask, cache, layer):
        return self.cross_attn(x, memory, memory_mask, cache=cache, layer=layer)

    def forward(self, x, memory, memory_mask=None, cache=None, layer=0):
        if self.norm_first:
            x = x + self.dropout1(self.self_block(self.norm1(x), cache, layer))
            x = x + self.dropout2(self.cross_block(self.norm2(x), memory, memory_mask, cache, layer))
            return x + self.dropout3(self.feed_forward(self.norm3(x)))
        x = self.norm1(x + self.dropout1(self.self_block(x, cache, layer)))
        x = self.norm2(x + self.dropout2(self.cross_block(x, memory, memory_mask, cache, layer)))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


class DecoderNoCausalMask(_DecoderLayer):
    def self_block(self, x, cache, layer):
        return self.self_attn(x, cache=cache, layer=layer)


class DecoderQueryFromMemory(_DecoderLayer):
    def cross_block(self, x, memory, memory_mask, cache, layer):
        return self.cross_attn(memory, x)


class DecoderNoMemoryMask(_DecoderLayer):
    def cross_block(self, x, memory, memory_mask, cache, layer):
        return self.cross_attn(x, memory, cache=cache, layer=layer)


class DecoderCausalCrossAttention(_DecoderLayer):
    def cross_block(self, x, memory, memory_mask, cache, layer):
        return self.cross_attn(x, memory, memory_mask, is_causal=True, cache=cache, layer=layer)


class DecoderNoCrossResidual(_DecoderLayer):
    def forward(self, x, memory, memory_mask=None, cache=None, layer=0):
        if self.norm_first:
            x = x + self.dropout1(self.self_block(self.norm1(x), cache, layer))
            x = self.dropout2(self.cross_block(self.norm2(x), memory, memory_mask, cache, layer))
            return x + self.dropout3(self.feed_forward(self.norm3(x)))
        x = self.norm1(x + self.dropout1(self.self_block(x, cache, layer)))
        x = self.norm2(self.dropout2(self.cross_block(x, memory, memory_mask, cache, layer)))
        return self.norm3(x + self.dropout3(self.feed_forward(x)))


class DecoderMixedNorms(_DecoderLayer):
    def forward(self, x, memory, memory_mask=None, cache=None, layer=0):
        if self.norm_first:
            x = x + self.dropout1(self.self_block(self.norm1(x), cache, layer))
            x = self.norm2(x + self.dropout2(self.cross_block(x, memory, memory_mask, cache, layer)))  # post-norm
            return x + self.dropout3(self.feed_forward(self.norm3(x)))
        return super().forward(x, memory, memory_mask, cache, layer)


class DecoderCacheNotPassed(_DecoderLayer):
    def self_block(self, x, cache, layer):
        return self.self_attn(x, is_causal=True)  # with a cache, each new token only sees itself


# --- noam_lr / noam_scheduler ---


def _noam_lr(step, d_model, warmup, factor=1.0):
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def noam_step_zero_divides(step, d_model, warmup, factor=1.0):
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def noam_warmup_exponent(step, d_model, warmup, factor=1.0):
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-0.5)


def noam_times_adam_lr(step, d_model, warmup, factor=1.0):
    return 1e-3 * _noam_lr(step, d_model, warmup, factor)


def noam_lr_no_checks(step, d_model, warmup, factor=1.0):
    """No step check and no call to the given _check_noam_args: a negative step raises ZeroDivisionError or
    returns a complex number, factor 0 gives lr 0."""
    return _noam_lr(step, d_model, warmup, factor)


def noam_lr_step_check_only(step, d_model, warmup, factor=1.0):
    """Checks step, but the given _check_noam_args is never called: d_model 0 raises ZeroDivisionError."""
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int; got {step!r}")
    return _noam_lr(step, d_model, warmup, factor)


def scheduler_lr_not_checked(optimizer, d_model, warmup, factor=1.0):
    return LambdaLR(optimizer, lambda step: _noam_lr(step, d_model, warmup, factor))


def scheduler_checks_lr_not_initial_lr(optimizer, d_model, warmup, factor=1.0):
    for group in optimizer.param_groups:
        if group["lr"] != 1.0:
            raise ValueError(f"make the optimizer with lr=1.0; got lr={group['lr']}")
    return LambdaLR(optimizer, lambda step: _noam_lr(step, d_model, warmup, factor))


def scheduler_one_step_ahead(optimizer, d_model, warmup, factor=1.0):
    for group in optimizer.param_groups:
        if group["lr"] != 1.0:
            raise ValueError(f"make the optimizer with lr=1.0; got lr={group['lr']}")
    return LambdaLR(optimizer, lambda step: _noam_lr(step + 1, d_model, warmup, factor))


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


def label_smoothing_no_checks(logits, target, epsilon=0.1, ignore_index=None):
    """No argument checks: epsilon=1.5 gives a negative target weight, mismatched shapes are flattened together."""
    return _smoothed_mean(logits, target, epsilon, ignore_index)


def ls_no_target_checks(logits, target, epsilon=0.1, ignore_index=None):
    """Checks epsilon and the shapes, not the target's dtype or ids: F.one_hot raises a RuntimeError."""
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1]; got {epsilon}")
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not fit target {tuple(target.shape)}")
    return _smoothed_mean(logits, target, epsilon, ignore_index)


# --- greedy_decode / beam_search (with own copies of the helpers) ---


def _strip(tokens, eos_id):
    return tokens[: tokens.index(eos_id)] if eos_id in tokens else tokens


def _next_token_logits(model, tokens, memory, src, cache=None):
    if cache is None:
        return model.decode(tokens, memory, src)[:, -1]
    return model.decode(tokens[:, len(cache):], memory, src, cache=cache)[:, -1]


def _pad_id(model, eos_id):
    return getattr(getattr(model, "config", None), "pad_id", eos_id)


def _greedy(model, src, max_len, bos_id, eos_id, use_cache=True, *, eval_mode=True, stop="all", strip=True):
    was_training = model.training
    if eval_mode:
        model.eval()
    memory = model.encode(src)
    cache = model.new_cache(memory, max_len) if use_cache else None
    tokens = src.new_full((src.shape[0], 1), bos_id)
    finished = torch.zeros(src.shape[0], dtype=torch.bool)
    with torch.no_grad():
        for _ in range(max_len):
            next_token = _next_token_logits(model, tokens, memory, src, cache).argmax(dim=-1)
            next_token = next_token.masked_fill(finished, _pad_id(model, eos_id))
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
            finished |= next_token == eos_id
            if finished.all() or (stop == "any" and finished.any()):
                break
    model.train(was_training)
    return [_strip(row, eos_id) if strip else row for row in tokens[:, 1:].tolist()]


def greedy_stops_at_first_eos(model, src, max_len, bos_id, eos_id, *, use_cache=True):
    return _greedy(model, src, max_len, bos_id, eos_id, use_cache, stop="any")


def greedy_train_mode_left_on(model, src, max_len, bos_id, eos_id, *, use_cache=True):
    return _greedy(model, src, max_len, bos_id, eos_id, use_cache, eval_mode=False)


def greedy_keeps_eos_and_after(model, src, max_len, bos_id, eos_id, *, use_cache=True):
    return _greedy(model, src, max_len, bos_id, eos_id, use_cache, strip=False)


def greedy_bos_hardcoded(model, src, max_len, bos_id, eos_id, *, use_cache=True):
    return _greedy(model, src, max_len, 1, eos_id, use_cache)


def _beam(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=0.6, *, use_cache=True, bug=None):
    was_training = model.training
    model.eval()
    filler = _pad_id(model, eos_id)
    batch, beam = src.shape[0], beam_size
    src_beams = src.repeat_interleave(beam, dim=0)
    memory = model.encode(src).repeat_interleave(beam, dim=0)
    cache = model.new_cache(memory, max_len) if use_cache else None
    tokens = src.new_full((batch * beam, 1), bos_id)
    scores = torch.full((batch, beam), float("-inf"))
    scores[:, 0] = 0.0
    if bug == "all_start_zero":
        scores[:] = 0.0
    finished = torch.zeros(batch, beam, dtype=torch.bool)
    lengths = torch.zeros(batch, beam)
    with torch.no_grad():
        for _ in range(max_len):
            log_probs = _next_token_logits(model, tokens, memory, src_beams, cache).log_softmax(dim=-1).float()
            vocab = log_probs.shape[-1]
            log_probs = log_probs.view(batch, beam, vocab)
            if bug != "finished_extended":
                stay = torch.full_like(log_probs, float("-inf"))
                stay[..., filler] = 0.0
                log_probs = torch.where(finished[..., None], stay, log_probs)
            candidates = (scores[..., None] + log_probs).view(batch, beam * vocab)
            scores, index = candidates.topk(beam, dim=-1)
            parent, next_token = index // vocab, index % vocab
            rows = (torch.arange(batch)[:, None] * beam + parent).view(-1)
            kept = tokens if bug == "not_reindexed" else tokens[rows]
            tokens = torch.cat([kept, next_token.view(-1, 1)], dim=1)
            if cache is not None and bug != "cache_not_reordered":
                cache.reorder(rows)
            was_finished = finished.gather(1, parent)
            lengths = lengths.gather(1, parent) + (~was_finished).float()
            finished = was_finished | (next_token == eos_id)
            if finished.all():
                break
    alpha = 0.0 if bug == "no_length_penalty" else length_penalty
    normalised = scores / ((5.0 + lengths) / 6.0) ** alpha
    best = normalised.argmax(dim=-1)
    chosen = tokens.view(batch, beam, -1)[torch.arange(batch), best, 1:]
    model.train(was_training)
    return [_strip(row, eos_id) for row in chosen.tolist()]


def _beam_mutant(bug):
    def beam_search(model, src, beam_size, max_len, bos_id, eos_id, length_penalty=0.6, *, use_cache=True):
        return _beam(model, src, beam_size, max_len, bos_id, eos_id, length_penalty, use_cache=use_cache, bug=bug)

    return beam_search


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
    Mutant("teacher_forcing_no_checks", "teacher_forcing",
           "none of the stated ValueError checks: a left-padded or float tgt, equal ids or a BOS in tgt go through",
           teacher_forcing_no_checks),
    Mutant("tf_no_right_padding_check", "teacher_forcing",
           "every check but right padding: a left-padded row silently gets its EOS in the wrong column",
           tf_no_right_padding_check),
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
    Mutant("decoder_cache_not_passed", "DecoderLayer",
           "cache and layer not passed on to the self-attention: with a KV cache each new token attends only to "
           "itself, so cached decoding differs from the full pass", DecoderCacheNotPassed),
    Mutant("decoder_mixed_norms", "DecoderLayer",
           "pre-norm and post-norm mixed: with norm_first=True the cross-attention block is still post-norm",
           DecoderMixedNorms),
    Mutant("noam_step_zero_divides", "noam_lr",
           "step 0 not taken as 1: 0 ** -0.5 raises ZeroDivisionError when the scheduler asks for the first lr",
           noam_step_zero_divides),
    Mutant("noam_warmup_exponent", "noam_lr",
           "warm-up written as step · warmup^-0.5 instead of step · warmup^-1.5", noam_warmup_exponent),
    Mutant("noam_times_adam_lr", "noam_lr",
           "the Noam rate multiplied by a usual Adam lr of 1e-3: the schedule is 1000× too small", noam_times_adam_lr),
    Mutant("noam_lr_no_checks", "noam_lr",
           "no argument checks: a negative step, d_model 0 or factor 0 give an exception from the arithmetic or "
           "a silent lr", noam_lr_no_checks),
    Mutant("noam_lr_step_check_only", "noam_lr",
           "the step is checked but the given _check_noam_args is not called: d_model 0 divides by zero",
           noam_lr_step_check_only),
    Mutant("scheduler_lr_not_checked", "noam_scheduler",
           "LambdaLR over an optimizer made with lr=1e-3: the schedule is silently multiplied by it",
           scheduler_lr_not_checked),
    Mutant("scheduler_checks_lr_not_initial_lr", "noam_scheduler",
           "checks each group's current lr, not the initial_lr LambdaLR scales: after an earlier scheduler it "
           "refuses a good optimizer and accepts one whose schedule is silently scaled", scheduler_checks_lr_not_initial_lr),
    Mutant("scheduler_one_step_ahead", "noam_scheduler",
           "the lambda adds 1 to the step: every update uses the next step's lr", scheduler_one_step_ahead),
    Mutant("ls_loss_over_padding", "label_smoothed_cross_entropy",
           "ignore_index ignored: the pad positions count in the loss", ls_loss_over_padding),
    Mutant("ls_normalised_by_all_positions", "label_smoothed_cross_entropy",
           "pad positions left out of the sum but counted in the mean", ls_normalised_by_all_positions),
    Mutant("ls_annotated_convention", "label_smoothed_cross_entropy",
           "the Annotated Transformer's ε/(V−2) with a zero padding column, where PyTorch's convention (ε/V on "
           "every class) is the contract", ls_annotated_convention),
    Mutant("ls_kldiv_fed_probabilities", "label_smoothed_cross_entropy",
           "KLDivLoss fed probabilities instead of log-probabilities", ls_kldiv_fed_probabilities),
    Mutant("ls_log_of_softmax", "label_smoothed_cross_entropy",
           "log(softmax(x)) instead of log_softmax: -inf (then inf or nan) for large logits", ls_log_of_softmax),
    Mutant("ls_smoothed_twice", "label_smoothed_cross_entropy",
           "label smoothing applied twice (a smoothed target handed to a loss that smooths again)", ls_smoothed_twice),
    Mutant("ls_pad_column_excluded", "label_smoothed_cross_entropy",
           "ε/(V−1) over every class but the padding column, which gets nothing: label smoothing kept off the pad "
           "column, where this library's (PyTorch's) convention smooths every class", ls_pad_column_excluded),
    Mutant("ls_summed", "label_smoothed_cross_entropy",
           "the loss summed over the positions instead of averaged: it grows with the batch and the padding",
           ls_summed),
    Mutant("label_smoothing_no_checks", "label_smoothed_cross_entropy",
           "no argument checks: epsilon=1.5 is used, logits and a target of other shapes are flattened together",
           label_smoothing_no_checks),
    Mutant("ls_no_target_checks", "label_smoothed_cross_entropy",
           "epsilon and shapes checked, the target not: float targets or ids outside the vocabulary give "
           "F.one_hot's RuntimeError", ls_no_target_checks),
    Mutant("greedy_stops_at_first_eos", "greedy_decode",
           "no per-row EOS stop: the batch loop breaks when the first row emits EOS, truncating the others",
           greedy_stops_at_first_eos),
    Mutant("greedy_train_mode_left_on", "greedy_decode",
           "model.train() left on while decoding: dropout changes the outputs", greedy_train_mode_left_on),
    Mutant("greedy_keeps_eos_and_after", "greedy_decode",
           "rows returned with their EOS and the tokens generated after it", greedy_keeps_eos_and_after),
    Mutant("greedy_bos_hardcoded", "greedy_decode",
           "BOS hard-coded as 1: a BOS id that differs between training and decoding", greedy_bos_hardcoded),
    Mutant("beam_all_start_zero", "beam_search",
           "all beams start at score 0: the first step fills the beam with k copies of one prefix",
           _beam_mutant("all_start_zero")),
    Mutant("beam_not_reindexed_by_parent", "beam_search",
           "beams not re-indexed by parent: each new token is appended to the wrong history",
           _beam_mutant("not_reindexed")),
    Mutant("beam_cache_not_reordered", "beam_search",
           "the tokens are re-indexed by parent but the decoder cache is not: each beam attends to another "
           "beam's keys and values", _beam_mutant("cache_not_reordered")),
    Mutant("beam_no_length_normalisation", "beam_search",
           "beam search without length normalisation: short hypotheses win", _beam_mutant("no_length_penalty")),
    Mutant("beam_finished_extended", "beam_search",
           "finished hypotheses keep being extended with real tokens and scores", _beam_mutant("finished_extended")),
]
