"""Checks for chapter 4, the encoder-decoder (references: :mod:`solutions.transformer`,
:mod:`solutions.schedule`, :mod:`solutions.losses`, :mod:`solutions.decoding`).

Each judge computes the right answer independently — by hand from lists (teacher forcing),
``nn.TransformerDecoderLayer`` with copied weights (in training mode too, with the same dropout
masks), the Noam formula, ``F.cross_entropy`` with ``label_smoothing``, and plain-Python greedy,
beam and exhaustive search over a :class:`~autograder.checks.lookup.LookupModel` whose
probabilities are known — and, when the answer is wrong, recomputes the usual mistakes to name
the one that was made. Property cases check what each exercise is for: no future leak, padding
invariance, dropout where the paper puts it, per-row EOS stop, finished hypotheses set aside,
beams that continue their parent's state (a :class:`~autograder.checks.lookup.LookupDecoder`
keeps it as a cache would), one decoder call per step, PyTorch's ``ignore_index=-100``, a finite
loss for large logits.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from autograder.checks import core
from autograder.checks.core import (Case, Check, CheckFailed, expect_close, expect_value_error, fail, rand_int,
                                    same)
from autograder.checks.lookup import LookupModel

# in a student edition: replayed from a recording (see core.recorded)
multihead = core.reference("solutions.multihead")
transformer = core.reference("solutions.transformer")

NEVER = -math.inf  # the logit of a token a model never predicts (BOS, padding)


# --- teacher_forcing ------------------------------------------------------------------------------


def _special_ids(gen: torch.Generator, default: bool) -> tuple[int, int, int]:
    """(bos, eos, pad): the ids of the embedded data set, or three random distinct ids."""
    if default:
        return 1, 2, 0
    bos, eos, pad = torch.randperm(40, generator=gen)[:3].tolist()
    return bos, eos, pad


def _tf_inputs(gen: torch.Generator, *, default_ids: bool = True, empty_row: bool = False,
               no_padding: bool = False, padding_column: bool = False) -> dict:
    bos, eos, pad = _special_ids(gen, default_ids)
    allowed = torch.tensor([i for i in range(40) if i not in (bos, eos, pad)])
    batch, width = rand_int(gen, 3, 5), rand_int(gen, 3, 7)
    lengths = torch.randint(1, width + 1, (batch,), generator=gen)
    lengths[0] = width  # a full row: its EOS needs the extra column
    if no_padding:
        lengths[:] = width
    else:
        lengths[1] = rand_int(gen, 1, width - 1)  # a padded row: its EOS goes right after its last token
    if empty_row:
        lengths[-1] = 0
    if padding_column:  # a column of padding in every row: the output keeps it (width + 1 columns)
        lengths = lengths.clamp(max=width - 1)
    tokens = allowed[torch.randint(len(allowed), (batch, width), generator=gen)]
    tgt = torch.where(torch.arange(width)[None, :] < lengths[:, None], tokens, torch.full_like(tokens, pad))
    return {"args": (tgt, bos, eos, pad)}


def _tf_expected(tgt: Tensor, bos: int, eos: int, pad: int) -> tuple[Tensor, Tensor]:
    """Row by row with lists: input BOS + tokens, labels tokens + EOS, both padded to width + 1 (only for
    _tf_outputs)."""
    width = tgt.shape[1]
    rows = [[t for t in row if t != pad] for row in tgt.tolist()]
    inputs = [[bos] + row + [pad] * (width - len(row)) for row in rows]
    labels = [row + [eos] + [pad] * (width - len(row)) for row in rows]
    return torch.tensor(inputs, dtype=torch.long), torch.tensor(labels, dtype=torch.long)


@core.recorded
def _tf_outputs(tgt: Tensor, bos: int, eos: int, pad: int) -> dict[str, Tensor]:
    """The right decoder input and labels, and the outputs of the mistakes _judge_tf names (recorded: a student
    edition withholding chapter 4 replays them)."""
    outputs = dict(zip(("input", "labels"), _tf_expected(tgt, bos, eos, pad)))
    outputs["eos_after_padding"] = torch.cat([tgt, tgt.new_full((tgt.shape[0], 1), eos)], dim=1)
    if (bos, eos, pad) != (1, 2, 0):
        rows = torch.where(tgt == pad, 0, tgt)
        outputs["hardcoded_input"], outputs["hardcoded_labels"] = _tf_expected(rows, 1, 2, 0)
    return outputs


def _equal(actual: Tensor, expected: Tensor) -> bool:
    return tuple(actual.shape) == tuple(expected.shape) and torch.equal(actual.long(), expected)


def _judge_tf(inputs: dict, outputs: dict) -> None:
    tgt, bos, eos, pad = inputs["args"]
    out = outputs["out"]
    if not isinstance(out, (tuple, list)) or len(out) != 2 or not all(isinstance(t, Tensor) for t in out):
        fail("return a pair of tensors (decoder_input, labels)")
    decoder_input, labels = out
    if decoder_input.is_floating_point() or labels.is_floating_point():
        fail("decoder_input and labels hold token ids: keep an integer dtype (like tgt's)")
    outputs_of = _tf_outputs(tgt, bos, eos, pad)
    expected_input, expected_labels = outputs_of["input"], outputs_of["labels"]
    if _equal(decoder_input, expected_input) and _equal(labels, expected_labels):
        return
    batch, width = tgt.shape
    shapes = f"got {tuple(decoder_input.shape)} and {tuple(labels.shape)}"
    if tuple(decoder_input.shape) != (batch, width + 1) or tuple(labels.shape) != (batch, width + 1):
        longest = int((tgt != pad).sum(dim=1).max())
        if longest < width and longest + 1 in (decoder_input.shape[-1], labels.shape[-1]):
            fail(f"{shapes}: you cut the columns that are padding in every row. Keep tgt's width, whatever the "
                 f"padding: both outputs are (batch, seq + 1) = {(batch, width + 1)}, so that they still line up "
                 "with the batch they came from")
        if width in (decoder_input.shape[-1], labels.shape[-1]):
            fail(f"{shapes}: both need width + 1 = {width + 1} columns (BOS + {width} tokens, {width} tokens + EOS). "
                 "Cutting them to the input's width drops the EOS of the longest rows: the model never learns to stop")
        fail(f"{shapes}; both must be (batch, width + 1) = {(batch, width + 1)}")
    if _equal(decoder_input, expected_labels) and _equal(labels, expected_labels):
        fail("no shift: the decoder input equals the labels, so position t is asked for the token it is given "
             "(the training loss falls to ~0 and decoding is garbage). Input = BOS + tokens, labels = tokens + EOS")
    if _equal(decoder_input, expected_labels) and _equal(labels, expected_input):
        fail("shifted the wrong way: the decoder reads BOS + tokens and predicts tokens + EOS, not the reverse")
    if _equal(labels, outputs_of["eos_after_padding"]):
        fail("EOS goes right after each row's last real token, not after the padding: a padded row's labels are "
             "tokens, EOS, pad, pad, …")
    if (bos, eos, pad) != (1, 2, 0):
        if _equal(decoder_input, outputs_of["hardcoded_input"]) or _equal(labels, outputs_of["hardcoded_labels"]):
            fail(f"use the bos_id={bos}, eos_id={eos} and pad_id={pad} you are given, not the ids of our data set "
                 "(1, 2, 0): a different id at training and decoding time is a silent bug")
    if _equal(labels, expected_labels):
        fail("the labels are right but the decoder input is not: BOS, then the target tokens, padded with pad_id")
    if _equal(decoder_input, expected_input):
        fail("the decoder input is right but the labels are not: the target tokens, EOS right after the last real "
             "token, then pad_id")
    fail("decoder_input must be BOS + tokens and labels tokens + EOS, both right-padded with pad_id to width + 1")


def _tf_bad_inputs(gen: torch.Generator, *, other: bool = False) -> dict:
    """One call per ValueError rule of the exercise's text, each breaking that rule only (``other``: other ids
    and other ways to break them)."""
    bos, eos, pad = _special_ids(gen, not other)
    allowed = torch.tensor([i for i in range(40) if i not in (bos, eos, pad)])
    tgt = allowed[torch.randint(len(allowed), (2, 4), generator=gen)]
    tgt[1, 3] = pad  # a right-padded row: allowed
    left_padded, special = tgt.clone(), tgt.clone()
    left_padded[0, 1] = pad
    special[0, 2] = eos if other else bos
    rules = [
        ("tgt is not 2-D", tgt[None] if other else tgt[0], (bos, eos, pad)),
        ("tgt holds floats, not token ids", tgt.double() if other else tgt.float(), (bos, eos, pad)),
        ("the three ids are not different", tgt, (bos, eos, eos) if other else (bos, bos, pad)),
        ("tgt already contains BOS or EOS", special, (bos, eos, pad)),
        ("a row is not right-padded (a real token after a pad_id)", left_padded, (bos, eos, pad)),
    ]
    return {"calls": [((t, *ids), {}) for _, t, ids in rules], "rules": [rule for rule, _, _ in rules]}


def _judge_tf_bad(inputs: dict, outputs: dict) -> None:
    for rule, ((tgt, bos, eos, pad), _), result in zip(inputs["rules"], inputs["calls"], outputs["results"],
                                                       strict=True):
        expect_value_error(result["error"], f"teacher_forcing(tgt of shape {tuple(tgt.shape)} and dtype {tgt.dtype}, "
                           f"bos_id={bos}, eos_id={eos}, pad_id={pad}): {rule} (call the given "
                           "_check_teacher_forcing_args(tgt, bos_id, eos_id, pad_id) first)")



# --- DecoderLayer --------------------------------------------------------------------------------


@core.recorded
def _decoder_state_shapes(init_args: tuple, init_kwargs: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The reference DecoderLayer's state: (name, shape) in order."""
    module = transformer.DecoderLayer(*init_args[:3], 0.0, **init_kwargs)
    return [(name, tuple(p.shape)) for name, p in module.state_dict().items()]


def _random_state(shapes: list[tuple[str, tuple[int, ...]]], gen: torch.Generator) -> dict[str, Tensor]:
    """The reference module's parameter names with random values (LayerNorms near 1 and 0, so they matter)."""
    state = {}
    for name, shape in shapes:
        if name.startswith("norm") and name.endswith("weight"):
            state[name] = 1.0 + 0.2 * torch.randn(shape, generator=gen)
        elif len(shape) > 1:
            state[name] = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        else:
            state[name] = 0.2 * torch.randn(shape, generator=gen)
    return state


def _decoder_inputs(gen: torch.Generator, *, norm_first: bool = False, activation: str = "relu",
                    seq_q: int | None = None, seq_k: int | None = None, padding: bool = True,
                    dropout: float = 0.0) -> dict:
    n_heads = [2, 4][rand_int(gen, 0, 1)]
    d_model, d_ff = n_heads * rand_int(gen, 2, 4), rand_int(gen, 8, 24)
    init_kwargs = {"norm_first": norm_first, "activation": activation}
    state = _random_state(_decoder_state_shapes((d_model, n_heads, d_ff), init_kwargs), gen)
    batch = rand_int(gen, 2, 3)
    seq_q = seq_q or rand_int(gen, 3, 6)
    seq_k = seq_k or seq_q + rand_int(gen, 1, 3)  # different lengths: queries from memory would not even fit
    x, memory = torch.randn(batch, seq_q, d_model, generator=gen), torch.randn(batch, seq_k, d_model, generator=gen)
    mask = None
    if padding:
        lengths = torch.randint(1, seq_k + 1, (batch,), generator=gen)
        lengths[0] = rand_int(gen, 1, seq_k - 1) if seq_k > 1 else 1  # at least one padded source
        mask = (torch.arange(seq_k)[None, :] < lengths[:, None])[:, None, None, :]
    inputs = {"init_args": (d_model, n_heads, d_ff), "init_kwargs": init_kwargs, "state": state,
              "args": (x, memory, mask)}
    if dropout:
        # Train mode: the layer's dropout modules get these masks (what nn.Dropout(p) would draw, kept fixed so that
        # the output can be compared exactly); the attention weights' own dropout is switched off.
        def draw(*shape: int) -> Tensor:
            return (torch.rand(*shape, generator=gen) >= dropout).float() / (1.0 - dropout)

        inputs["init_args"] = (d_model, n_heads, d_ff, dropout)
        inputs["masks"] = {"dropout1": draw(batch, seq_q, d_model), "dropout2": draw(batch, seq_q, d_model),
                           "dropout3": draw(batch, seq_q, d_model), "feed_forward.dropout": draw(batch, seq_q, d_ff)}
    return inputs


class _Masked(nn.Module):
    """Dropout with a fixed mask, in train mode only (the reference layer's dropout modules, for _torch_decoder)."""

    def __init__(self, mask: Tensor) -> None:
        super().__init__()
        self.mask = mask

    def forward(self, x: Tensor) -> Tensor:
        return x * self.mask if self.training else x


@core.recorded
def _torch_decoder(inputs: dict, x: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
    """nn.TransformerDecoderLayer (batch first) with the same weights — in train mode with the inputs' dropout masks
    when they have some; PyTorch's masks mean True = NOT allowed (recorded: it computes the exercise's answer)."""
    d_model, n_heads, d_ff = inputs["init_args"][:3]
    kw, state = inputs["init_kwargs"], inputs["state"]
    layer = nn.TransformerDecoderLayer(d_model, n_heads, d_ff, dropout=0.0, activation=kw["activation"],
                                       batch_first=True, norm_first=kw["norm_first"])
    theirs = {}
    for ours, their in (("self_attn", "self_attn"), ("cross_attn", "multihead_attn")):
        theirs[f"{their}.in_proj_weight"] = state[f"{ours}.in_proj.weight"]
        theirs[f"{their}.in_proj_bias"] = state[f"{ours}.in_proj.bias"]
        for part in ("weight", "bias"):
            theirs[f"{their}.out_proj.{part}"] = state[f"{ours}.out_proj.{part}"]
    for part in ("weight", "bias"):
        for linear in ("linear1", "linear2"):
            theirs[f"{linear}.{part}"] = state[f"feed_forward.{linear}.{part}"]
        for norm in ("norm1", "norm2", "norm3"):
            theirs[f"{norm}.{part}"] = state[f"{norm}.{part}"]
    layer.load_state_dict(theirs, strict=True)
    layer.eval()
    if "masks" in inputs:  # PyTorch's dropout, dropout1..3 are where the layer's own go
        for name, fixed in inputs["masks"].items():
            setattr(layer, "dropout" if name == "feed_forward.dropout" else name, _Masked(fixed))
        layer.train()
    seq_q = x.shape[1]
    future = ~torch.ones(seq_q, seq_q, dtype=torch.bool).tril()
    with torch.no_grad():
        return layer(x, memory, tgt_mask=future, memory_key_padding_mask=None if mask is None else ~mask[:, 0, 0, :])


def _decoder_by_hand(inputs: dict, x: Tensor, memory: Tensor, mask: Tensor | None, bug: str) -> Tensor:
    """The decoder layer written out with chapter 2's MultiHeadAttention (and the inputs' dropout masks, if any),
    with one known mistake."""
    d_model, n_heads, d_ff = inputs["init_args"][:3]
    kw, state, masks = inputs["init_kwargs"], inputs["state"], inputs.get("masks")
    attn = {}
    for name in ("self_attn", "cross_attn"):
        attn[name] = multihead.MultiHeadAttention(d_model, n_heads).eval()
        attn[name].load_state_dict({k.split(".", 1)[1]: v for k, v in state.items() if k.startswith(name + ".")})
    activation = F.relu if kw["activation"] == "relu" else F.gelu

    def norm(i: int, h: Tensor) -> Tensor:
        return F.layer_norm(h, (d_model,), state[f"norm{i}.weight"], state[f"norm{i}.bias"], 1e-5)

    def drop(i: int, h: Tensor) -> Tensor:
        return h if masks is None or bug == "no_dropout" else h * masks[f"dropout{i}"]

    def feed_forward(h: Tensor) -> Tensor:
        hidden = activation(F.linear(h, state["feed_forward.linear1.weight"], state["feed_forward.linear1.bias"]))
        hidden = hidden if masks is None else hidden * masks["feed_forward.dropout"]
        return F.linear(hidden, state["feed_forward.linear2.weight"], state["feed_forward.linear2.bias"])

    def self_block(h: Tensor) -> Tensor:
        return attn["self_attn"](h, is_causal=bug != "no_causal_mask")

    def cross_block(h: Tensor) -> Tensor:
        if bug == "query_from_memory":
            return attn["cross_attn"](memory, h)
        return attn["cross_attn"](h, memory, None if bug == "no_memory_mask" else mask, is_causal=bug == "causal_cross")

    norm_first = kw["norm_first"] != (bug == "norm_flipped")
    residual = {name: 0.0 if bug == f"no_{name}_residual" else 1.0 for name in ("self", "cross", "feed_forward")}
    blocks = [("self", self_block), ("cross", cross_block), ("feed_forward", feed_forward)]
    if bug == "cross_before_self":
        blocks[0], blocks[1] = blocks[1], blocks[0]
    with torch.no_grad():
        for i, (name, block) in enumerate(blocks, start=1):
            pre = norm_first and not (bug == "mixed_norms" and name == "cross")
            h = norm(i, x) if pre else x
            if bug == "dropout_after_residual":
                x = drop(i, residual[name] * x + block(h))
            elif bug == "dropout_on_input":
                x = residual[name] * x + block(drop(i, h))
            else:
                x = residual[name] * x + drop(i, block(h))
            if not pre:
                x = norm(i, x)
    return x


_DECODER_MISTAKES = {
    "no_causal_mask": "every target position sees the later ones: the self-attention needs is_causal=True (trained "
    "like this, the model copies the next token and is garbage at decoding time)",
    "no_memory_mask": "the source padding is attended: pass memory_mask to the cross-attention",
    "causal_cross": "the cross-attention is causal: only the self-attention is; every target position may read the "
    "whole source",
    "query_from_memory": "in cross-attention the queries come from the decoder (x); keys and values come from memory",
    "norm_flipped": "post-norm and pre-norm are swapped: norm_first=False is LN(x + sublayer(x)) (the paper), "
    "norm_first=True is x + sublayer(LN(x))",
    "mixed_norms": "post-norm and pre-norm are mixed: with norm_first=True every sub-layer is x + sublayer(LN(x)); "
    "your cross-attention block is post-norm",
    "no_self_residual": "the residual connection around the self-attention is missing",
    "no_cross_residual": "the residual connection around the cross-attention is missing",
    "no_feed_forward_residual": "the residual connection around the feed-forward network is missing",
    "cross_before_self": "the sub-layers are in the wrong order: causal self-attention, then cross-attention, then "
    "the feed-forward network (with norm1, norm2, norm3 in that order)",
}
# Train mode only (the inputs have dropout masks).
_DROPOUT_MISTAKES = {
    "no_dropout": "in training mode your layer drops nothing from the sub-layer outputs: self.dropout1, self.dropout2 "
    "and self.dropout3 go on each sub-layer's output, before it is added to x (nn.TransformerDecoderLayer, and the "
    "paper's dropout 0.1)",
    "dropout_after_residual": "dropout is applied after the residual add, so it drops the residual stream itself: "
    "self.dropout1/2/3 go on the sub-layer's output only, before it is added to x",
    "dropout_on_input": "dropout is applied to the sub-layer's input: self.dropout1/2/3 go on its output, before it "
    "is added to x",
}


@core.recorded
def _decoder_mistakes(inputs: dict, x: Tensor, memory: Tensor, mask: Tensor | None) -> dict[str, Tensor]:
    """The output of each known mistake (chapter 2's MultiHeadAttention; recorded for the student edition)."""
    mistakes = {}
    bugs = list(_DECODER_MISTAKES) + (list(_DROPOUT_MISTAKES) if "masks" in inputs else [])
    for bug in bugs:
        if bug == "query_from_memory" and x.shape[1] != memory.shape[1]:
            continue
        try:
            mistakes[bug] = _decoder_by_hand(inputs, x, memory, mask, bug)
        except ValueError:  # a mistake these shapes cannot even make (e.g. a causal cross-attention, seq_k < seq_q)
            continue
    return mistakes


def _expect_decoder(inputs: dict, out: Any, x: Tensor, memory: Tensor, mask: Tensor | None, what: str) -> None:
    expected = _torch_decoder(inputs, x, memory, mask)
    mistakes = _decoder_mistakes(inputs, x, memory, mask)
    if not same(out, expected, 1e-4, dtype="cast"):
        for bug, message in {**_DROPOUT_MISTAKES, **_DECODER_MISTAKES}.items():
            if bug in mistakes and same(out, mistakes[bug], 1e-4, dtype="cast"):
                fail(message)
    expect_close(out, expected, what, atol=1e-4)


def _judge_decoder(inputs: dict, outputs: dict) -> None:
    x, memory, mask = inputs["args"]
    error = outputs.get("error")
    if error is not None:
        if x.shape[1] != memory.shape[1]:
            fail(f"your layer raised {error['type']} ({error['message'][:120]}) with a target of {x.shape[1]} "
                 f"positions and a source of {memory.shape[1]}: in cross-attention the queries come from x (the "
                 "decoder) and the keys/values from memory, so the output has the target's length")
        fail(f"your layer raised {error['type']}: {error['message']}")
    _expect_decoder(inputs, outputs["out"], x, memory, mask,
                    "your decoder layer differs from nn.TransformerDecoderLayer with the same weights")


def _judge_train_mode(inputs: dict, outputs: dict) -> None:
    x, memory, mask = inputs["args"]
    error = outputs.get("error")
    if error is not None:
        fail(f"in training mode your layer raised {error['type']}: {error['message']}")
    unused = [name for name, calls in outputs["calls"].items() if calls == 0 and name != "feed_forward.dropout"]
    if unused == ["dropout1", "dropout2", "dropout3"] and not same(outputs["out"], _torch_decoder(
            inputs, x, memory, mask), 1e-4, dtype="cast"):
        fail("in training mode your layer never calls self.dropout1, self.dropout2 or self.dropout3 (a dropout of "
             "your own, F.dropout, cannot be checked and is not the layer's): apply them to each sub-layer's "
             "output, before it is added to x")
    _expect_decoder(inputs, outputs["out"], x, memory, mask, "in training mode (dropout p = "
                    f"{inputs['init_args'][3]}) your layer differs from nn.TransformerDecoderLayer with the same "
                    "weights and the same dropout masks: self.dropout1/2/3 go on each sub-layer's output, before "
                    "the residual add")


def _future_inputs(gen: torch.Generator) -> dict:
    inputs = _decoder_inputs(gen)
    x, memory, mask = inputs["args"]
    t = rand_int(gen, 1, x.shape[1] - 1)
    changed = x.clone()
    changed[:, t:] = torch.randn(changed[:, t:].shape, generator=gen)
    inputs["calls"] = [(x, memory, mask), (changed, memory, mask)]
    inputs["t"] = t
    return inputs


def _judge_future(inputs: dict, outputs: dict) -> None:
    t = inputs["t"]
    base, changed = outputs["outs"]
    if not (isinstance(base, Tensor) and isinstance(changed, Tensor) and base.shape == changed.shape):
        fail("forward must return a tensor of shape (batch, seq_q, d_model)")
    if not torch.allclose(base[:, :t], changed[:, :t], atol=1e-5):
        fail(f"changing the target from position {t} on changed the outputs at positions 0…{t - 1}: the decoder "
             "sees the future. The self-attention needs is_causal=True")
    x, memory, mask = inputs["calls"][0]
    _expect_decoder(inputs, base, x, memory, mask, "your decoder layer differs from nn.TransformerDecoderLayer")


def _padding_inputs(gen: torch.Generator, **kwargs: Any) -> dict:
    inputs = _decoder_inputs(gen, **kwargs)
    x, memory, mask = inputs["args"]
    extra = rand_int(gen, 1, 4)
    more_memory = torch.cat([memory, torch.randn(memory.shape[0], extra, memory.shape[2], generator=gen)], dim=1)
    more_mask = torch.cat([mask, torch.zeros(*mask.shape[:-1], extra, dtype=torch.bool)], dim=-1)
    inputs["calls"] = [(x, memory, mask), (x, more_memory, more_mask)]
    return inputs


def _judge_padding(inputs: dict, outputs: dict) -> None:
    base, padded = outputs["outs"]
    if not (isinstance(base, Tensor) and isinstance(padded, Tensor) and base.shape == padded.shape):
        fail("forward must return a tensor of shape (batch, seq_q, d_model), whatever the source length")
    if not torch.allclose(base, padded, atol=1e-5):
        fail("adding padded positions to the source changed the output: the output must not depend on how much "
             "padding the batch has. Pass memory_mask to the cross-attention")
    x, memory, mask = inputs["calls"][0]
    _expect_decoder(inputs, base, x, memory, mask, "your decoder layer differs from nn.TransformerDecoderLayer")



# --- noam_scheduler (and the noam_lr it uses) ----------------------------------------------------------------


def _noam(step: int, d_model: int, warmup: int, factor: float) -> float:
    """The Noam formula written out: factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), step 0 as 1 (only
    for the recorded functions below)."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


_NOAM_MISTAKES = {
    "warmup_exponent": "the warm-up is step · warmup^-1.5 (it meets step^-0.5 at step = warmup); you used "
    "warmup^-0.5",
    "max": "take the min of the two terms (warm-up, then decay), not the max",
    "no_scale": "the factor d_model^-0.5 is missing",
    "scale_inverse": "the scale is d_model^-0.5, not d_model^-1",
    "no_factor": "the factor argument is ignored: multiply by it",
    "one_step_ahead": "the schedule is one step ahead: LambdaLR calls your lambda with the number of scheduler "
    "steps taken so far (0 before the first update); pass it to noam_lr unchanged",
}


@core.recorded
def _noam_variants(d_model: int, warmup: int, factor: float, steps: list[int]) -> dict[str, list[float]]:
    """The Noam rate at each of ``steps`` ("expected"), and each mistake's of _NOAM_MISTAKES (recorded: a student
    edition withholding chapter 4 replays them)."""
    d, w, f = d_model, warmup, factor
    variants: dict[str, list[float]] = {name: [] for name in ("expected", *_NOAM_MISTAKES)}
    for step in steps:
        s = max(step, 1)
        for name, value in (("expected", _noam(step, d, w, f)),
                            ("warmup_exponent", f * d**-0.5 * min(s**-0.5, s * w**-0.5)),
                            ("max", f * d**-0.5 * max(s**-0.5, s * w**-1.5)),
                            ("no_scale", f * min(s**-0.5, s * w**-1.5)),
                            ("scale_inverse", f / d * min(s**-0.5, s * w**-1.5)),
                            ("no_factor", d**-0.5 * min(s**-0.5, s * w**-1.5)),
                            ("one_step_ahead", _noam(step + 1, d, w, f))):
            variants[name].append(value)
    return variants


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, Tensor) and value.numel() == 1 and value.dtype.is_floating_point:
        return float(value)
    return None


def _formula_mistake(got: list[float], variants: dict[str, list[float]]) -> str | None:
    """The message of the mistake of _NOAM_MISTAKES whose rates ``got`` are, if any."""
    for bug, message in _NOAM_MISTAKES.items():
        if all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(got, variants[bug])):
            return message
    return None


def _factor_inputs(gen: torch.Generator, *, paper: bool = False) -> dict:
    if paper:
        d_model, warmup, factor = 512, 4000, 1.0
    else:
        d_model, warmup = 8 * rand_int(gen, 4, 64), rand_int(gen, 20, 2000)
        factor = [2.0, 0.5, 1.5][rand_int(gen, 0, 2)]
    steps = [0, 1, 2, warmup // 2, warmup - 1, warmup, warmup + 1, 2 * warmup, 10 * warmup]
    return {"lrs": [1.0], "args": (d_model, warmup), "kwargs": {"factor": factor}, "factor_steps": steps}


def _judge_factors(inputs: dict, outputs: dict) -> None:
    d_model, warmup = inputs["args"]
    factor, steps = inputs["kwargs"]["factor"], inputs["factor_steps"]
    variants = _noam_variants(d_model, warmup, factor, steps)
    error = outputs["error"]
    if error is not None:
        if error["type"] == "ZeroDivisionError":
            fail("your schedule divides by zero at step 0 (0 ** -0.5): take step 0 as 1 — LambdaLR asks for the "
                 "factor of step 0 as soon as it is made, before the first update")
        fail(f"noam_scheduler(optimizer made with lr=1.0, d_model={d_model}, warmup={warmup}, factor={factor}) "
             f"raised {error['type']}: {error['message']}")
    got = [_number(value) for value in outputs["factors"]]
    if any(value is None for value in got):
        fail("your LambdaLR's lambda must return a number (a Python float) for every step")
    if all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(got, variants["expected"])):
        return
    where = f"d_model={d_model}, warmup={warmup}, factor={factor}"
    if got[0] == 0:
        fail(f"{where}: the lr of step 0 is 0, so the first update would not move the weights: take step 0 as 1")
    mistake = _formula_mistake(got, variants)
    if mistake:
        fail(f"{where}: {mistake}")
    ratios = [a / b for a, b in zip(got, variants["expected"])]
    if all(math.isclose(r, ratios[0], rel_tol=1e-6) for r in ratios):
        fail(f"{where}: your lr is {ratios[0]:.4g}× the Noam rate at every step. The schedule is the whole learning "
             "rate (a base lr such as Adam's usual 1e-3 must not multiply it; the factor argument scales it)")
    step, value, expected = next((s, a, b) for s, a, b in zip(steps, got, variants["expected"])
                                 if not math.isclose(a, b, rel_tol=1e-6))
    fail(f"{where}: the lr of step {step} is {value:.4g}, expected {expected:.4g} = factor · d_model^-0.5 · "
         "min(step^-0.5, step · warmup^-1.5) (for d_model 512 and warmup 4000 the peak is about 7.0e-4)")


def _scheduler_inputs(gen: torch.Generator, lrs: tuple[float, ...] = (1.0,),
                      initial_lrs: tuple[float, ...] | None = None) -> dict:
    d_model, warmup = 8 * rand_int(gen, 2, 32), rand_int(gen, 3, 12)
    return {"lrs": list(lrs), "initial_lrs": list(initial_lrs) if initial_lrs else None, "args": (d_model, warmup),
            "kwargs": {"factor": [1.0, 2.0][rand_int(gen, 0, 1)]}, "steps": 3 * warmup}


def _base_lrs(inputs: dict) -> list[float]:
    """The lr LambdaLR scales in each group: its ``initial_lr`` when an earlier scheduler set one, else its lr."""
    return list(inputs.get("initial_lrs") or inputs["lrs"])


def _judge_scheduler(inputs: dict, outputs: dict) -> None:
    d_model, warmup = inputs["args"]
    factor = inputs["kwargs"]["factor"]
    schedule = _noam_variants(d_model, warmup, factor, list(range(inputs["steps"] + 1)))
    if outputs["error"] is not None:
        if inputs.get("initial_lrs"):
            fail(f"noam_scheduler raised {outputs['error']['type']} for an optimizer whose groups have "
                 f"initial_lr=1.0 (their current lr {inputs['lrs'][0]} was left by an earlier scheduler; LambdaLR "
                 f"scales initial_lr, so check that one): {outputs['error']['message']}")
        fail(f"noam_scheduler raised {outputs['error']['type']} for an optimizer made with lr=1.0: "
             f"{outputs['error']['message']}")
    lrs, expected = outputs["lrs"], schedule["expected"]
    for step, got in enumerate(lrs):
        if all(math.isclose(lr, expected[step], rel_tol=1e-6) for lr in got):
            continue
        if step and lrs[0] == got:
            fail("the learning rate never changes: LambdaLR(optimizer, lambda step: noam_lr(step, …)) sets it "
                 "at every scheduler step")
        mistake = _formula_mistake([row[0] for row in lrs], {k: v[: len(lrs)] for k, v in schedule.items()})
        if mistake is None and all(math.isclose(row[0], e, rel_tol=1e-6) for row, e in zip(lrs, expected[1:])):
            mistake = _NOAM_MISTAKES["one_step_ahead"]
        if mistake:
            fail(f"d_model={d_model}, warmup={warmup}, factor={factor}: {mistake}")
        fail(f"before optimizer step {step} the lr is {got[0]:.4g}; expected noam_lr({step}, {d_model}, {warmup}, "
             f"factor={factor}) = {expected[step]:.4g}")


def _judge_scheduler_refuses(inputs: dict, outputs: dict) -> None:
    base = _base_lrs(inputs)
    bad = [lr for lr in base if lr != 1.0]
    d_model, warmup = inputs["args"]
    schedule = _noam_variants(d_model, warmup, inputs["kwargs"]["factor"],
                              list(range(inputs["steps"] + 1)))["expected"]  # asked for up front
    if outputs["error"] is None:
        lrs = outputs["lrs"]
        scaled = all(math.isclose(got, lr * schedule[step], rel_tol=1e-6)
                     for step, row in enumerate(lrs) for got, lr in zip(row, base))
        if scaled and inputs.get("initial_lrs"):
            fail(f"the group's lr is 1.0 but its initial_lr is {bad[0]} (an earlier scheduler set it), and LambdaLR "
                 f"scales initial_lr: your schedule is silently {bad[0]}× the Noam rate. Check a group's initial_lr "
                 "when it has one, and raise a ValueError that names lr")
        if scaled:
            fail(f"with an optimizer made with lr={bad[0]} your schedule is silently {bad[0]}× the Noam rate: "
                 "LambdaLR multiplies the optimizer's lr by the lambda. Refuse any lr other than 1.0 with a ValueError "
                 "that names lr")
    expect_value_error(outputs["error"], f"the optimizer was made with lr={bad[0]} (the schedule is the whole learning "
                       "rate, so the optimizer's lr must be 1.0)", "lr", word=False)


def _scheduler_bad_inputs(gen: torch.Generator, *, argument: str) -> dict:
    args = {"d_model": (0, rand_int(gen, 3, 12)), "warmup": (8 * rand_int(gen, 2, 8), -rand_int(gen, 0, 3))}[argument]
    return {"lrs": [1.0], "args": args, "kwargs": {}, "steps": 2, "argument": argument}


def _judge_scheduler_bad(inputs: dict, outputs: dict) -> None:
    d_model, warmup = inputs["args"]
    expect_value_error(outputs["error"], f"noam_scheduler(optimizer, d_model={d_model}, warmup={warmup}): "
                       f"{inputs['argument']} is not a positive int (call the given _check_noam_args(d_model, warmup, "
                       "factor) first)", inputs["argument"], word=False)



# --- label_smoothed_cross_entropy -----------------------------------------------------------------


def _ls_inputs(gen: torch.Generator, *, epsilon: float | None = None, ignore: bool = True, scale: float = 2.0,
               flat: bool = False, sentinel: bool = False) -> dict:
    """Logits and targets; with ``ignore`` some targets are ``ignore_index``: a padding id, or PyTorch's default
    -100 (``sentinel``: what Hugging Face pads its labels with)."""
    vocab = rand_int(gen, 5, 12)
    shape = (rand_int(gen, 4, 12),) if flat else (rand_int(gen, 2, 4), rand_int(gen, 3, 6))
    logits = torch.randn(*shape, vocab, generator=gen) * scale
    target = torch.randint(0, vocab, shape, generator=gen)
    pad = None
    if ignore:
        pad = -100 if sentinel else rand_int(gen, 0, vocab - 1)
        target = torch.where(torch.rand(shape, generator=gen) < 0.3, pad, target)
        target.view(-1)[0] = pad  # at least one ignored position
        target.view(-1)[-1] = (max(pad, 0) + 1) % vocab  # and at least one kept
    epsilon = [0.1, 0.2, 0.3][rand_int(gen, 0, 2)] if epsilon is None else epsilon
    return {"args": (logits, target), "kwargs": {"epsilon": epsilon, "ignore_index": pad}}


@core.recorded
def _ls_expected(inputs: dict) -> Tensor:
    """F.cross_entropy with label_smoothing (recorded: it computes the exercise's answer)."""
    logits, target = inputs["args"]
    epsilon, pad = inputs["kwargs"]["epsilon"], inputs["kwargs"]["ignore_index"]
    vocab = logits.shape[-1]
    return F.cross_entropy(logits.double().reshape(-1, vocab), target.reshape(-1), label_smoothing=epsilon,
                           ignore_index=-100 if pad is None else pad)


def _ls_variant(inputs: dict, bug: str) -> Tensor:
    """The loss with one known mistake, in float64 (only for _ls_mistakes)."""
    logits, target = inputs["args"]
    epsilon, pad = inputs["kwargs"]["epsilon"], inputs["kwargs"]["ignore_index"]
    vocab = logits.shape[-1]
    log_p = F.log_softmax(logits.double().reshape(-1, vocab), dim=-1)
    target = target.reshape(-1)
    keep = torch.ones_like(target, dtype=torch.bool) if pad is None or bug == "no_ignore" else target != pad
    onehot = F.one_hot(target.masked_fill(~keep, 0), vocab).double()
    if bug == "others_only":
        q = (1 - epsilon) * onehot + epsilon / (vocab - 1) * (1 - onehot)
    elif bug == "annotated":
        q = (1 - epsilon) * onehot + epsilon / (vocab - 2) * (1 - onehot)
        if pad is not None:
            q[:, pad] = 0.0
    elif bug == "pad_column":  # ε/(V−1) on every class but the padding column
        q = (1 - epsilon) * onehot + epsilon / (vocab - 1) * (1 - F.one_hot(torch.tensor(pad), vocab).double())
    elif bug == "twice":
        q = (1 - epsilon) * ((1 - epsilon) * onehot + epsilon / vocab) + epsilon / vocab
    elif bug == "no_smoothing":
        q = onehot
    else:
        q = (1 - epsilon) * onehot + epsilon / vocab
    loss = -(q * log_p).sum(-1)
    if bug == "kl":
        loss = loss + (q * q.clamp_min(1e-300).log()).sum(-1)
    if bug == "all_positions":
        return loss[keep].sum() / loss.numel()
    if bug == "summed":
        return loss[keep].sum()
    return loss[keep].mean()


_LS_MISTAKES = {
    "no_ignore": "the padding positions count in your loss: leave out every position whose target is ignore_index",
    "all_positions": "you divided by all positions, padding included: average over the non-ignored positions only",
    "others_only": "you spread ε/(V−1) over the wrong classes only. This library uses PyTorch's convention "
    "(label_smoothing=ε): q = (1−ε)·onehot + ε/V on every class, the target included",
    "annotated": "that is the Annotated Transformer's convention (ε/(V−2), nothing on the padding column). This "
    "library uses PyTorch's: q = (1−ε)·onehot + ε/V on every class",
    "pad_column": "the padding column gets no smoothing (you spread ε/(V−1) over the other classes). This library uses "
    "PyTorch's convention (label_smoothing=ε): q = (1−ε)·onehot + ε/V on every class, the padding column included; "
    "ignore_index leaves out the padding positions, not the padding column",
    "summed": "you summed the loss over the positions: return the mean over the non-ignored positions (the sum "
    "divided by their count), or the loss and its gradients grow with the batch",
    "twice": "the smoothing is applied twice: build q = (1−ε)·onehot + ε/V once",
    "no_smoothing": "epsilon is ignored: the target distribution is q = (1−ε)·onehot + ε/V, not the one-hot",
    "kl": "you computed the KL divergence KL(q‖p) = cross-entropy − H(q): the same gradient, but the value is "
    "lower by the entropy of q. Return the cross-entropy −Σ q·log p",
}


@core.recorded
def _ls_mistakes(inputs: dict) -> dict[str, Tensor]:
    """The loss of each mistake of _LS_MISTAKES that these inputs allow (recorded: a student edition withholding
    chapter 4 replays them)."""
    pad = inputs["kwargs"]["ignore_index"]
    # No padding column to leave out without a padding id; no class -100 to count.
    skip = {"pad_column", "annotated"} if pad is None or pad < 0 else set()
    skip |= {"no_ignore"} if pad is not None and pad < 0 else set()
    return {bug: _ls_variant(inputs, bug) for bug in _LS_MISTAKES if bug not in skip}


def _judge_ls(inputs: dict, outputs: dict) -> None:
    expected, mistakes = _ls_expected(inputs), _ls_mistakes(inputs)
    error = outputs.get("error")
    if error is not None:
        pad = inputs["kwargs"]["ignore_index"]
        if pad is not None and pad < 0:
            fail(f"ignore_index={pad}, PyTorch's default (the label Hugging Face pads with), must be accepted: the "
                 f"targets equal to it are not class ids, so leave those positions out before one_hot or any check "
                 f"of the ids (your code raised {error['type']}: {error['message'][:120]})")
        fail(f"your code raised {error['type']}: {error['message']}")
    got = outputs["out"]
    if not isinstance(got, Tensor) or got.numel() != 1:
        fail(f"return the mean loss as a 0-dim tensor; got {type(got).__name__}"
             + (f" of shape {tuple(got.shape)}" if isinstance(got, Tensor) else ""))
    if not torch.isfinite(got).all():
        fail("your loss is not finite for large logits: take log-probabilities with log_softmax (it subtracts the "
             "max), never log(softmax(x)), which underflows to log(0) = -inf")
    value = got.double().reshape(())
    if torch.allclose(value, expected, atol=1e-5, rtol=1e-5):
        return
    for bug, message in _LS_MISTAKES.items():
        if bug in mistakes and torch.allclose(value, mistakes[bug], atol=1e-5, rtol=1e-5):
            fail(message)
    epsilon, pad = inputs["kwargs"]["epsilon"], inputs["kwargs"]["ignore_index"]
    fail(f"loss {float(value):.5f}, expected {float(expected):.5f} = F.cross_entropy(logits, target, "
         f"label_smoothing={epsilon}, ignore_index={pad})")


def _ls_grad_inputs(gen: torch.Generator) -> dict:
    inputs = _ls_inputs(gen)
    inputs["grad_args"] = [0]
    inputs["cotangent"] = torch.tensor(1.0)
    return inputs


def _judge_ls_grad(inputs: dict, outputs: dict) -> None:
    logits, target = inputs["args"]
    epsilon, pad = inputs["kwargs"]["epsilon"], inputs["kwargs"]["ignore_index"]
    leaf = logits.clone().requires_grad_(True)
    F.cross_entropy(leaf.reshape(-1, logits.shape[-1]), target.reshape(-1), label_smoothing=epsilon,
                    ignore_index=pad).backward()
    grad = outputs["grads"][0]
    if grad is None:
        fail("no gradient reaches the logits: compute the loss with differentiable tensor operations")
    expect_close(grad, leaf.grad, "the gradient with respect to the logits differs from F.cross_entropy's", atol=1e-5)


def _ls_bad_inputs(gen: torch.Generator, *, other: bool = False) -> dict:
    """One call per ValueError rule of the exercise's text, each breaking that rule only (``other``: other
    values)."""
    logits = torch.randn(2, 3, 5, generator=gen)
    target = torch.randint(1, 5, (2, 3), generator=gen)
    outside = target.clone()
    outside[1, 1] = -2 if other else 5
    ignore = {"ignore_index": 0} if other else {}
    rules = [
        ("epsilon is above 1", (logits, target), {"epsilon": 2.0 if other else 1.5}, ("epsilon",)),
        ("epsilon is negative", (logits, target), {"epsilon": -0.5 if other else -0.1}, ("epsilon",)),
        ("logits and target do not fit", (logits, target[:, :2] if other else target[None]), {}, ("logits", "target")),
        ("target holds floats, not class ids", (logits, target.double() if other else target.float()), {},
         ("target",)),
        ("a target id is outside the vocabulary", (logits, outside), ignore, ("target",)),
    ]
    return {"calls": [(args, kwargs) for _, args, kwargs, _ in rules],
            "rules": [(rule, names) for rule, _, _, names in rules]}


def _judge_ls_bad(inputs: dict, outputs: dict) -> None:
    for (rule, names), ((logits, target), kwargs), result in zip(inputs["rules"], inputs["calls"],
                                                                 outputs["results"], strict=True):
        shown = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        expect_value_error(result["error"], f"label_smoothed_cross_entropy(logits of shape {tuple(logits.shape)}, "
                           f"target of shape {tuple(target.shape)} and dtype {target.dtype}"
                           f"{', ' + shown if shown else ''}): {rule} (call the given _check_smoothing_args first)",
                           *names, word=False)





# --- greedy_search and beam_search_over, on a LookupDecoder -----------------------------------------------------


def _lookup(inputs: dict) -> LookupModel:
    tables = inputs["decoder"]
    return LookupModel(tables["first"], tables["second"], torch.zeros(tables["first"].shape[:3]), tables["pad_id"])


def _search_args(inputs: dict) -> tuple[Tensor, int, int, int]:
    """(src, max_len, bos_id, eos_id) of a greedy or beam case."""
    args = inputs["args"]
    return (inputs["decoder"]["src"], *args[-3:])


def _lookup_inputs(gen: torch.Generator, *, default_ids: bool = True, stops: tuple | None = None,
                   max_len: int = 5, rows: int = 5, history: float = 0.5) -> dict:
    """A random LookupModel's tables, and sources that pick them. ``stops[i]``: table i ends after exactly that
    many tokens (None: never ends); without ``stops`` EOS becomes likelier step by step."""
    vocab = rand_int(gen, 7, 9)
    if default_ids:
        bos, eos, pad = 1, 2, 0
    else:
        bos, eos, pad = torch.randperm(vocab, generator=gen)[:3].tolist()
    n_tables, positions = (len(stops) if stops else 4), max_len + 1
    first = torch.randn(n_tables, positions, vocab, vocab, generator=gen) * 2.0
    second = torch.randn(n_tables, positions, vocab + 1, vocab, generator=gen) * history
    if stops:
        for table, stop in enumerate(stops):
            first[table, :, :, eos] = NEVER
            if stop is not None:
                first[table, stop, :, eos] = 30.0
    else:
        first[..., eos] += torch.linspace(-3.0, 3.0, positions)[None, :, None]
    first[..., bos] = NEVER
    first[..., pad] = NEVER
    tables = torch.randint(0, n_tables, (rows,), generator=gen)
    tables[:n_tables] = torch.randperm(n_tables, generator=gen)[: min(rows, n_tables)]
    src = torch.cat([tables[:, None], torch.randint(0, vocab, (rows, rand_int(gen, 2, 5)), generator=gen)], dim=1)
    return {"decoder": {"first": first, "second": second, "pad_id": pad, "src": src},
            "args": (max_len, bos, eos), "kwargs": {}}


def _rows_of(out: Any, batch: int) -> list[list[int]]:
    if isinstance(out, Tensor):
        fail("return a Python list with one list of token ids per source row (each cut at its EOS), not a tensor")
    if not isinstance(out, (list, tuple)) or len(out) != batch:
        fail(f"return one list of token ids per source row: {batch} lists; got {type(out).__name__}"
             + (f" of length {len(out)}" if isinstance(out, (list, tuple)) else ""))
    rows = []
    for row in out:
        if not isinstance(row, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in row):
            fail("each row must be a list of int token ids (use .tolist())")
        rows.append(list(row))
    return rows


def _log_probs(model: LookupModel, src: Tensor, row: int, prefix: list[int]) -> Tensor:
    """log p(next token) after ``prefix`` (BOS included) of source row ``row``, in float64."""
    source = src[row : row + 1]
    return model.decode(torch.tensor([prefix]), model.encode(source), source)[0, -1].double().log_softmax(-1)


def _greedy_by_hand(model: LookupModel, src: Tensor, max_len: int, bos: int, eos: int) -> list[list[int]]:
    """One row at a time, the most likely next token until EOS or max_len tokens (only for the recorded
    functions)."""
    out = []
    for row in range(src.shape[0]):
        prefix = [bos]
        for _ in range(max_len):
            token = int(_log_probs(model, src, row, prefix).argmax())
            if token == eos:
                break
            prefix.append(token)
        out.append(prefix[1:])
    return out


def _is_greedy(model: LookupModel, src: Tensor, row: int, tokens: list[int], max_len: int, bos: int, eos: int,
               tol: float = 1e-4) -> bool:
    """Whether ``tokens`` is a greedy output (ties within ``tol`` allowed either way)."""
    if len(tokens) > max_len or eos in tokens:
        return False
    prefix = [bos]
    for token in tokens:
        log_p = _log_probs(model, src, row, prefix)
        if log_p[token] < log_p.max() - tol:
            return False
        prefix.append(token)
    if len(tokens) < max_len:
        log_p = _log_probs(model, src, row, prefix)
        return bool(log_p[eos] >= log_p.max() - tol)
    return True


@core.recorded
def _greedy_rows(inputs: dict) -> dict[str, list[list[int]]]:
    """Greedy decoding by hand: the right rows ("expected"), and the rows of the mistakes _judge_greedy names
    (recorded: a student edition withholding chapter 4 replays them)."""
    src, max_len, bos, eos = _search_args(inputs)
    rows = {"expected": _greedy_by_hand(_lookup(inputs), src, max_len, bos, eos)}
    if bos != 1:
        rows["bos_1"] = _greedy_by_hand(_lookup(inputs), src, max_len, 1, eos)
    return rows


def _first_eos_stops_all(rows: list[list[int]], max_len: int) -> list[list[int]]:
    """What a batch loop that stops when the first row ends returns."""
    ended = [len(r) + 1 for r in rows if len(r) < max_len]
    steps = min(ended) if ended else max_len
    return [r[:steps] for r in rows]


def _judge_calls(inputs: dict, outputs: dict) -> None:
    """The how-rules the exercises state: one log_probs call per step, and reorder(rows) whenever rows change."""
    max_len = inputs["args"][-3]
    calls = outputs["calls"]
    if len(calls) > max_len:
        fail(f"decoder.log_probs was called {len(calls)} times for at most {max_len} steps: call it once per step, "
             "with the prefixes of every row (and every beam) in one batch — one forward pass per step")
    if outputs["mismatches"]:
        fail("the prefixes you passed to decoder.log_probs no longer matched the decoder's rows: after re-indexing "
             "the tokens by parent, re-index the decoder too with decoder.reorder(rows) — a cached decoder keeps "
             "each row's keys and values, and without it a beam continues another beam's history")


def _judge_greedy(inputs: dict, outputs: dict) -> None:
    src, max_len, bos, eos = _search_args(inputs)
    rows = _rows_of(outputs["out"], src.shape[0])
    model, candidates = _lookup(inputs), _greedy_rows(inputs)
    expected = candidates["expected"]
    if rows != expected and not all(_is_greedy(model, src, r, row, max_len, bos, eos) for r, row in enumerate(rows)):
        if any(eos in row for row in rows):
            fail("a row contains EOS: return each row's tokens up to, not including, its first EOS")
        if any(row[:1] == [bos] for row in rows) and [row[1:] for row in rows] == expected:
            fail("the output must not start with BOS: return the generated tokens only")
        if rows == _first_eos_stops_all(expected, max_len):
            fail("you stopped every row when the first one ended: keep a 'finished' flag per row and stop when "
                 "all rows have finished (rows of a batch end at different steps)")
        if any(len(row) > max_len for row in rows):
            fail(f"a row has more than max_len={max_len} tokens")
        if bos != 1 and rows == candidates["bos_1"]:
            fail(f"start every row with bos_id={bos}, the id the model was trained with, not 1")
        _judge_calls(inputs, outputs)
        r = next(i for i, (a, b) in enumerate(zip(rows, expected)) if a != b)
        fail(f"row {r}: expected {expected[r]}, got {rows[r]} — at each step take the most likely next token "
             "(argmax of decoder.log_probs) and stop the row at its EOS or after max_len tokens")
    _judge_calls(inputs, outputs)


def _normalised(score: float, length: int, alpha: float) -> float:
    return score / ((5.0 + length) / 6.0) ** alpha


def _beam_row(model: LookupModel, src: Tensor, row: int, beam: int, max_len: int, bos: int, eos: int, alpha: float,
              bug: str | None = None) -> list[int]:
    """Beam search of one source row over Python lists (see solutions.decoding), optionally with one known mistake
    (only for the recorded functions). Live hypotheses are (score, tokens) with BOS first."""
    live = [(0.0, [bos])] * (beam if bug == "all_start_zero" else 1)
    finished: list[tuple[float, list[int]]] = []  # (normalised score, tokens without BOS and EOS)
    eos_length = 0 if bug == "length_without_eos" else 1
    alpha = 0.0 if bug == "no_length_penalty" else alpha  # no_length_penalty: compared by total log-probability
    for step in range(1, max_len + 1):
        candidates = []
        for score, tokens in live:
            log_p = _log_probs(model, src, row, tokens)
            for token in range(log_p.shape[0]):
                if math.isfinite(log_p[token]):  # never-predicted tokens cannot win
                    candidates.append((score + float(log_p[token]), tokens + [token]))
        candidates.sort(key=lambda c: -c[0])  # stable: ties keep expansion order
        live = []
        for rank, (score, tokens) in enumerate(candidates[: beam if bug == "top_k_only" else 2 * beam]):
            if tokens[-1] == eos:
                if rank < beam:
                    finished.append((_normalised(score, step - 1 + eos_length, alpha), tokens[1:-1]))
            elif len(live) < beam:
                live.append((score, tokens))
        best = max((value for value, _ in finished), default=-math.inf)
        live_now = max((score for score, _ in live), default=-math.inf) / ((5.0 + step) / 6.0) ** alpha
        if finished and (bug == "first_finished" or (len(finished) >= beam if bug == "k_finished"
                                                     else best >= live_now)):
            break
    else:  # max_len steps: the live ones finish as they are
        finished += [(_normalised(score, max_len, alpha), tokens[1:]) for score, tokens in live]
    return max(finished, key=lambda h: h[0])[1]


def _beam_row_kept_in_beam(model: LookupModel, src: Tensor, row: int, beam: int, max_len: int, bos: int, eos: int,
                           alpha: float) -> list[int]:
    """The simplification: finished hypotheses stay in the beam (one continuation at no cost) and compete with the
    live ones by total log-probability; normalised only at the end (only for the recorded functions)."""
    hyps = [(0.0, [bos], False)]
    for _ in range(max_len):
        candidates = []
        for score, tokens, done in hyps:
            if done:
                candidates.append((score, tokens, True))
                continue
            log_p = _log_probs(model, src, row, tokens)
            candidates += [(score + float(log_p[t]), tokens + [t], t == eos) for t in range(log_p.shape[0])
                           if math.isfinite(log_p[t])]
        candidates.sort(key=lambda c: -c[0])
        hyps = candidates[:beam]
        if all(done for _, _, done in hyps):
            break
    best = max(hyps, key=lambda h: _normalised(h[0], len(h[1]) - 1, alpha))[1][1:]
    return best[: best.index(eos)] if eos in best else best


def _beam_by_hand(model: LookupModel, src: Tensor, beam: int, max_len: int, bos: int, eos: int, alpha: float,
                  bug: str | None = None) -> list[list[int]]:
    if bug == "kept_in_beam":
        return [_beam_row_kept_in_beam(model, src, row, beam, max_len, bos, eos, alpha) for row in range(len(src))]
    return [_beam_row(model, src, row, beam, max_len, bos, eos, alpha, bug) for row in range(len(src))]


def _sequence_score(model: LookupModel, src: Tensor, row: int, bos: int, tokens: list[int]) -> float:
    source = src[row : row + 1]
    tgt_in = torch.tensor([[bos] + tokens[:-1]])
    log_p = model.decode(tgt_in, model.encode(source), source)[0].double().log_softmax(-1)
    return float(log_p[torch.arange(len(tokens)), torch.tensor(tokens)].sum())


def _exhaustive_best(model: LookupModel, src: Tensor, max_len: int, bos: int, eos: int,
                     alpha: float) -> list[list[int]]:
    """The best hypothesis of each row by normalised score, over every sequence (small vocabularies only; only for
    _beam_rows)."""
    words = [t for t in range(model.config.tgt_vocab) if t != eos and bool(model.first[..., t].isfinite().any())]
    out = []
    for row in range(src.shape[0]):
        best, best_tokens = -math.inf, None
        for length in range(1, max_len + 1):
            for body in itertools.product(words, repeat=length - 1):
                for last in ([eos] + words if length == max_len else [eos]):
                    tokens = list(body) + [last]
                    value = _normalised(_sequence_score(model, src, row, bos, tokens), length, alpha)
                    if value > best:
                        best, best_tokens = value, tokens
        out.append(best_tokens[:-1] if best_tokens[-1] == eos else best_tokens)
    return out


def _row_value(model: LookupModel, src: Tensor, row: int, tokens: list[int], max_len: int, bos: int, eos: int,
               alpha: float) -> float:
    """The normalised score beam search gives the output ``tokens`` of row ``row``."""
    full = tokens + ([eos] if len(tokens) < max_len else [])
    if not full or eos in tokens or len(tokens) > max_len:
        return -math.inf
    return _normalised(_sequence_score(model, src, row, bos, full), len(full), alpha)


_BEAM_MISTAKES = {
    "all_start_zero": "your beam search returns the greedy answer: if every beam starts with score 0, the first step "
    "fills the beam with copies of one prefix (start one beam at 0 and the others at -inf); otherwise keep the "
    "beam_size best of every live beam × every token, not only the best one",
    "no_length_penalty": "the finished hypotheses are compared by their total log-probability: compare them by "
    "score / ((5 + length) / 6) ** length_penalty (length = tokens including EOS)",
    "length_without_eos": "the length in the penalty leaves out EOS: a finished hypothesis' length counts its tokens "
    "including EOS, ((5 + length) / 6) ** length_penalty",
    "kept_in_beam": "finished hypotheses stay in the beam and take the places of live ones: set a hypothesis that "
    "ends in EOS aside as finished and keep beam_size live hypotheses (the best candidates that do not end in EOS)",
    "top_k_only": "you kept the beam_size best candidates, so a candidate that ends in EOS leaves fewer live beams: "
    "take the 2·beam_size best (at most beam_size of them end in EOS) and keep the best beam_size that do not",
    "first_finished": "a source row stopped at its first finished hypothesis: it is done when its best finished "
    "hypothesis scores at least as well as its best live one would if it ended now",
    "k_finished": "a source row stopped once beam_size hypotheses had finished (fairseq's rule) while a live one "
    "still scored better: it is done when its best finished hypothesis scores at least as well as its best live one "
    "would if it ended now",
}


@core.recorded
def _beam_rows(inputs: dict, exhaustive: bool) -> list[list[int]]:
    """The right rows: beam search by hand, or the exhaustive search's best (recorded: a student edition
    withholding chapter 4 replays them)."""
    src, max_len, bos, eos = _search_args(inputs)
    beam, alpha = inputs["args"][0], inputs["kwargs"].get("length_penalty", 0.6)
    if exhaustive:
        return _exhaustive_best(_lookup(inputs), src, max_len, bos, eos, alpha)
    return _beam_by_hand(_lookup(inputs), src, beam, max_len, bos, eos, alpha)


@core.recorded
def _beam_mistakes(inputs: dict) -> dict[str, list[list[int]]]:
    """The rows of each mistake of _BEAM_MISTAKES (recorded, as _beam_rows)."""
    src, max_len, bos, eos = _search_args(inputs)
    beam, alpha = inputs["args"][0], inputs["kwargs"].get("length_penalty", 0.6)
    model = _lookup(inputs)
    return {bug: _beam_by_hand(model, src, beam, max_len, bos, eos, alpha, bug) for bug in _BEAM_MISTAKES
            if beam > 1 or bug == "no_length_penalty"}


def _judge_beam(inputs: dict, outputs: dict, *, exhaustive: bool = False) -> None:
    src, max_len, bos, eos = _search_args(inputs)
    beam, alpha = inputs["args"][0], inputs["kwargs"].get("length_penalty", 0.6)
    rows = _rows_of(outputs["out"], src.shape[0])
    model, expected = _lookup(inputs), _beam_rows(inputs, exhaustive)
    # Up front, so that a student edition has them for the visible cases; not for the exhaustive search (a hidden
    # case), whose beam as large as the search space makes the mistakes slow to compute when nothing is wrong.
    mistakes = None if exhaustive else _beam_mistakes(inputs)
    wrong = [r for r, (got, want) in enumerate(zip(rows, expected)) if got != want and not math.isclose(
        _row_value(model, src, r, got, max_len, bos, eos, alpha),
        _row_value(model, src, r, want, max_len, bos, eos, alpha), abs_tol=1e-4)]
    if wrong:
        _judge_calls(inputs, outputs)
        mistakes = _beam_mistakes(inputs) if mistakes is None else mistakes
        if any(eos in row for row in rows):
            fail("a row contains EOS: return each row's tokens up to, not including, its first EOS")
        if any(row[:1] == [bos] for row in rows):
            fail("a row starts with BOS: return the generated tokens only")
        matching = [message for bug, message in _BEAM_MISTAKES.items() if rows == mistakes.get(bug)]
        if matching:  # on a random model two mistakes can give the same output: name them all
            fail(matching[0] if len(matching) == 1 else "your output is what either of these mistakes gives: "
                 + "; or ".join(matching))
        r = wrong[0]
        fail(f"row {r}: expected {expected[r]} (normalised score "
             f"{_row_value(model, src, r, expected[r], max_len, bos, eos, alpha):.3f}), got {rows[r]} — per step: "
             "candidates = every live beam × every token, scored by total log-probability; parent = index // vocab, "
             "token = index % vocab; an EOS among the beam_size best is set aside as finished")
    _judge_calls(inputs, outputs)


def _beam_inputs(gen: torch.Generator, *, beam: int = 3, alpha: float = 0.6, **kwargs: Any) -> dict:
    inputs = _lookup_inputs(gen, rows=3, history=1.5, **kwargs)
    inputs["args"] = (beam, *inputs["args"])
    inputs["kwargs"] = {"length_penalty": alpha}
    return inputs


def _hand_built(gen: torch.Generator, specs: list[list[tuple[int | slice, str | slice, dict[str, float]]]], *,
                beam: int, max_len: int, alpha: float) -> dict:
    """Tables written as next-token probabilities: ``specs[table]`` lists (step, previous token, {token: p}) with
    the tokens named "a" … "d" and "E" (EOS); the letters get random ids, the tables a random order; every token
    not listed gets a tiny probability (logit -12), BOS and padding none."""
    vocab, bos, eos, pad = 8, 1, 2, 0
    letters = dict(zip("abcd", (torch.randperm(vocab - 3, generator=gen)[:4] + 3).tolist()), E=eos)
    first = torch.full((len(specs), max_len + 1, vocab, vocab), -12.0)
    for table, spec in enumerate(specs):
        for step, previous, probabilities in spec:
            after = letters[previous] if isinstance(previous, str) else previous
            for token, p in probabilities.items():
                first[table, step, after, letters[token]] = math.log(p)
    first[..., bos] = NEVER
    first[..., pad] = NEVER
    order = torch.randperm(len(specs), generator=gen)
    src = torch.cat([order[:, None], torch.randint(3, vocab, (len(specs), 3), generator=gen)], dim=1)
    return {"decoder": {"first": first, "second": torch.zeros(len(specs), max_len + 1, vocab + 1, vocab),
                        "pad_id": pad, "src": src},
            "args": (beam, max_len, bos, eos), "kwargs": {"length_penalty": alpha}}


ALL = slice(None)
# Greedy's first choice (a, p 0.5) leads nowhere likely; the runner-up (b, 0.4) ends with p 0.9: 2 beams find it.
_GREEDY_TRAP = [(0, ALL, {"a": 0.5, "b": 0.4, "c": 0.1}), (1, "a", {"c": 0.3, "E": 0.25, "b": 0.25, "d": 0.2}),
                (1, "b", {"E": 0.9, "c": 0.1}), (slice(2, None), ALL, {"E": 0.9, "d": 0.1})]
# "" (EOS first, p 0.3) is more probable than "a c d" (p 0.27), which has the better normalised score; "a" leads
# all the way, so the row goes on until "a c d" has finished.
_LONGER_WINS = [(0, ALL, {"a": 0.5, "E": 0.3, "b": 0.2}), (1, "a", {"c": 0.8, "E": 0.12, "d": 0.08}),
                (2, "c", {"d": 0.8, "E": 0.12, "a": 0.08}), (3, "d", {"E": 0.85, "b": 0.15}),
                (slice(4, None), ALL, {"E": 0.9, "a": 0.1})]
# EOS set aside, it must not take the place of b (p 0.28), whose "b d" ends with p 0.99 · 0.99 and wins.
_SET_ASIDE = [(0, ALL, {"a": 0.42, "E": 0.3, "b": 0.28}), (1, "a", {"c": 0.55, "E": 0.45}),
              (1, "b", {"d": 0.99, "a": 0.01}), (2, "d", {"E": 0.99, "c": 0.01}), (2, "c", {"E": 0.9, "a": 0.1}),
              (slice(3, None), ALL, {"E": 0.9, "b": 0.1})]
# The length counts EOS: "" (p 0.3, 1 token) beats "a c d" (p 0.155, 4 tokens); counted without EOS, 0 tokens
# against 3 would reverse it.
_EOS_COUNTS = [(0, ALL, {"a": 0.5, "E": 0.3, "b": 0.2}), (1, "a", {"c": 0.6, "d": 0.3, "E": 0.1}),
               (2, "c", {"d": 0.7, "E": 0.2, "a": 0.1}), (3, "d", {"E": 0.74, "b": 0.26}),
               (slice(4, None), ALL, {"E": 0.9, "a": 0.1})]
# "" finishes first (p 0.25); "a" (p 0.54) finishes next and wins: a row is not done at its first finished one.
_NOT_THE_FIRST = [(0, ALL, {"a": 0.6, "E": 0.25, "b": 0.15}), (1, "a", {"E": 0.9, "c": 0.1}),
                  (1, "b", {"c": 0.9, "E": 0.1}), (slice(2, None), ALL, {"E": 0.9, "d": 0.1})]


# "" (p 0.25) and "a" (p 0.24) finish first; "a c" (p 0.34) finishes later and wins: two finished hypotheses do
# not end the row while a live one can still beat them.
_NOT_AT_K = [(0, ALL, {"a": 0.6, "E": 0.25, "b": 0.15}), (1, "a", {"c": 0.6, "E": 0.4}),
             (1, "b", {"d": 0.9, "E": 0.1}), (2, "c", {"E": 0.95, "d": 0.05}), (2, "d", {"E": 0.5, "c": 0.5}),
             (slice(3, None), ALL, {"E": 0.9, "a": 0.1})]
# "" (p 0.25) finishes first and is the best answer; kept in the beam, it is pushed out at the next step by "a c"
# and "a d" (p 0.35 and 0.32), which never end.
_DISPLACED = [(0, ALL, {"a": 0.7, "E": 0.25, "b": 0.05}), (1, "a", {"c": 0.5, "d": 0.45, "E": 0.05}),
              (slice(2, None), ALL, {"a": 0.6, "b": 0.4})]

def _trap_inputs(gen: torch.Generator) -> dict:
    """Seven hand-built tables, 2 beams, length_penalty 1: each a trap for one mistake (see their comments)."""
    return _hand_built(gen, [_GREEDY_TRAP, _LONGER_WINS, _SET_ASIDE, _EOS_COUNTS, _NOT_THE_FIRST, _NOT_AT_K, _DISPLACED],
                       beam=2, max_len=5, alpha=1.0)


def _beam_exhaustive_inputs(gen: torch.Generator) -> dict:
    """Without length normalisation a live score only falls, so a beam as large as the search space is exact."""
    alpha = 0.0
    inputs = _lookup_inputs(gen, max_len=3, rows=3, history=1.0)
    words = inputs["decoder"]["first"].shape[-1] - 2  # BOS and padding are never predicted
    inputs["args"] = (words**3, *inputs["args"])  # a beam as large as the search space: exact
    inputs["kwargs"] = {"length_penalty": alpha}
    return inputs


def _beam_one_inputs(gen: torch.Generator) -> dict:
    inputs = _lookup_inputs(gen, rows=4, history=1.0)
    inputs["args"] = (1, *inputs["args"])
    return inputs


def _judge_beam_one(inputs: dict, outputs: dict) -> None:
    src, max_len, bos, eos = _search_args(inputs)
    rows = _rows_of(outputs["out"], src.shape[0])
    model = _lookup(inputs)
    expected = _greedy_rows(inputs)["expected"]
    if not all(_is_greedy(model, src, r, row, max_len, bos, eos) for r, row in enumerate(rows)):
        fail(f"with beam_size=1 beam search must equal greedy decoding: expected {expected}, got {rows}")
    _judge_calls(inputs, outputs)


CHECKS: dict[str, Check] = {
    "teacher_forcing": Check(
        name="teacher_forcing",
        visible=(
            Case("labels are the decoder input shifted left by one (padded rows of different lengths)",
                 lambda g: _tf_inputs(g, default_ids=False), "call", _judge_tf),
            Case("a column of padding in every row is kept (both outputs have seq + 1 columns)",
                 lambda g: _tf_inputs(g, default_ids=False, padding_column=True), "call", _judge_tf),
            Case("bad input refused (the given _check_teacher_forcing_args is called first)", _tf_bad_inputs,
                 "call_each", _judge_tf_bad),
        ),
        hidden=(
            Case("the data set's ids (bos 1, eos 2, pad 0)", _tf_inputs, "call", _judge_tf),
            Case("a row without tokens", lambda g: _tf_inputs(g, default_ids=False, empty_row=True), "call", _judge_tf),
            Case("no padding at all", lambda g: _tf_inputs(g, no_padding=True), "call", _judge_tf),
            Case("a column of padding in every row, the data set's ids", lambda g: _tf_inputs(g, padding_column=True),
                 "call", _judge_tf),
            Case("bad input again, other ids and other ways", lambda g: _tf_bad_inputs(g, other=True), "call_each",
                 _judge_tf_bad),
        ),
    ),
    "DecoderLayer": Check(
        name="DecoderLayer",
        visible=(
            Case("post-norm layer equals nn.TransformerDecoderLayer (source and target of different lengths, padded)",
                 _decoder_inputs, "module_forward_or_error", _judge_decoder),
            Case("a target position never sees later positions", _future_inputs, "module_forward_each", _judge_future),
            Case("more source padding does not change the output (pre-norm)",
                 lambda g: _padding_inputs(g, norm_first=True), "module_forward_each", _judge_padding),
            Case("training mode: dropout where nn.TransformerDecoderLayer puts it (same masks)",
                 lambda g: _decoder_inputs(g, dropout=0.5), "module_forward_fixed_dropout", _judge_train_mode),
        ),
        hidden=(
            Case("pre-norm layer equals nn.TransformerDecoderLayer(norm_first=True)",
                 lambda g: _decoder_inputs(g, norm_first=True), "module_forward_or_error", _judge_decoder),
            Case("GELU feed-forward", lambda g: _decoder_inputs(g, activation="gelu", norm_first=True),
                 "module_forward_or_error", _judge_decoder),
            Case("source shorter than the target", lambda g: _decoder_inputs(g, seq_q=6, seq_k=3),
                 "module_forward_or_error", _judge_decoder),
            Case("source and target of the same length", lambda g: _decoder_inputs(g, seq_q=5, seq_k=5),
                 "module_forward_or_error", _judge_decoder),
            Case("one target position, no padding mask", lambda g: _decoder_inputs(g, seq_q=1, padding=False),
                 "module_forward_or_error", _judge_decoder),
            Case("post-norm: more source padding does not change the output", _padding_inputs,
                 "module_forward_each", _judge_padding),
            Case("training mode, pre-norm: dropout where nn.TransformerDecoderLayer puts it",
                 lambda g: _decoder_inputs(g, norm_first=True, dropout=0.3), "module_forward_fixed_dropout",
                 _judge_train_mode),
        ),
        # nn.MultiheadAttention's and nn.TransformerDecoderLayer's own forward passes.
        forbidden=("multi_head_attention_forward", "_native_multi_head_attention"),
    ),
    "noam_scheduler": Check(
        name="noam_scheduler",
        visible=(
            Case("the lr is the Noam rate at d_model 512 and warmup 4000 (peak ≈ 7.0e-4; step 0 taken as 1)",
                 lambda g: _factor_inputs(g, paper=True), "scheduler_factors", _judge_factors),
            Case("the optimizer's lr follows the schedule, step after step", _scheduler_inputs, "scheduler_lrs",
                 _judge_scheduler),
            Case("an optimizer made with lr=1e-3 is refused", lambda g: _scheduler_inputs(g, lrs=(1e-3,)),
                 "scheduler_lrs", _judge_scheduler_refuses),
            Case("a group whose initial_lr is 1e-3 is refused, whatever its current lr",
                 lambda g: _scheduler_inputs(g, lrs=(1.0,), initial_lrs=(1e-3,)), "scheduler_lrs",
                 _judge_scheduler_refuses),
            Case("a group whose initial_lr is 1.0 is accepted, whatever its current lr",
                 lambda g: _scheduler_inputs(g, lrs=(0.25,), initial_lrs=(1.0,)), "scheduler_lrs", _judge_scheduler),
            Case("d_model 0 is refused (the given _check_noam_args is called first)",
                 lambda g: _scheduler_bad_inputs(g, argument="d_model"), "scheduler_lrs", _judge_scheduler_bad),
        ),
        hidden=(
            Case("other sizes and factors", _factor_inputs, "scheduler_factors", _judge_factors),
            Case("two parameter groups", lambda g: _scheduler_inputs(g, lrs=(1.0, 1.0)), "scheduler_lrs",
                 _judge_scheduler),
            Case("one of two groups with lr=0.5 is refused", lambda g: _scheduler_inputs(g, lrs=(1.0, 0.5)),
                 "scheduler_lrs", _judge_scheduler_refuses),
            Case("a warmup that is not positive is refused", lambda g: _scheduler_bad_inputs(g, argument="warmup"),
                 "scheduler_lrs", _judge_scheduler_bad),
        ),
    ),
    "label_smoothed_cross_entropy": Check(
        name="label_smoothed_cross_entropy",
        visible=(
            Case("equals F.cross_entropy(label_smoothing=ε, ignore_index=pad) on a padded batch", _ls_inputs,
                 "call_or_error", _judge_ls),
            Case("labels padded with PyTorch's ignore_index=-100 are accepted", lambda g: _ls_inputs(g, sentinel=True),
                 "call_or_error", _judge_ls),
            Case("large logits give a finite loss", lambda g: _ls_inputs(g, scale=60.0), "call_or_error", _judge_ls),
            Case("bad input refused (the given _check_smoothing_args is called first)", _ls_bad_inputs, "call_each",
                 _judge_ls_bad),
        ),
        hidden=(
            Case("no ignore_index", lambda g: _ls_inputs(g, ignore=False), "call_or_error", _judge_ls),
            Case("epsilon 0 is the plain cross-entropy", lambda g: _ls_inputs(g, epsilon=0.0), "call_or_error",
                 _judge_ls),
            Case("epsilon 1 is the uniform target", lambda g: _ls_inputs(g, epsilon=1.0), "call_or_error", _judge_ls),
            Case("(N, vocab) logits, ignore_index=-100", lambda g: _ls_inputs(g, flat=True, sentinel=True),
                 "call_or_error", _judge_ls),
            Case("gradient equals F.cross_entropy's", _ls_grad_inputs, "call_with_grad", _judge_ls_grad),
            Case("bad input again, other values", lambda g: _ls_bad_inputs(g, other=True), "call_each", _judge_ls_bad),
        ),
        # PyTorch's own cross-entropy (label_smoothing=...) and the NLL loss under it.
        forbidden=("cross_entropy*", "nll_loss*"),
    ),
    "greedy_search": Check(
        name="greedy_search",
        visible=(
            Case("each row stops at its own EOS (rows of 1, 2, 3 and max_len tokens in one batch), one decoder call "
                 "per step", lambda g: _lookup_inputs(g, default_ids=False, stops=(1, None, 3, 2)), "search_lookup",
                 _judge_greedy),
        ),
        hidden=(
            Case("the data set's ids (bos 1, eos 2, pad 0)", _lookup_inputs, "search_lookup", _judge_greedy),
            Case("other ids, a model with two tokens of history", lambda g: _lookup_inputs(g, default_ids=False,
                                                                                             history=1.5),
                 "search_lookup", _judge_greedy),
            Case("max_len 1", lambda g: _lookup_inputs(g, max_len=1), "search_lookup", _judge_greedy),
        ),
    ),
    "beam_search_over": Check(
        name="beam_search_over",
        visible=(
            Case("2 beams: the translation greedy misses, finished hypotheses set aside, length normalisation with "
                 "EOS counted, a row done when its best finished hypothesis beats every live one", _trap_inputs,
                 "search_lookup", _judge_beam),
            Case("each beam continues its parent's state (3 beams, a model with two tokens of history), one decoder "
                 "call per step", _beam_inputs, "search_lookup", _judge_beam),
            Case("beam_size=1 equals greedy", _beam_one_inputs, "search_lookup", _judge_beam_one),
        ),
        hidden=(
            Case("a beam as large as the search space finds the most probable hypothesis", _beam_exhaustive_inputs,
                 "search_lookup", lambda i, o: _judge_beam(i, o, exhaustive=True)),
            Case("other ids, 4 beams, no length normalisation",
                 lambda g: _beam_inputs(g, beam=4, alpha=0.0, default_ids=False), "search_lookup", _judge_beam),
            Case("5 beams, length_penalty 1", lambda g: _beam_inputs(g, beam=5, alpha=1.0), "search_lookup",
                 _judge_beam),
            Case("the traps again, other letters", _trap_inputs, "search_lookup", _judge_beam),
        ),
    ),
}


run = core.runner(__name__)  # run(name, obj, *, level="visible", seed=0): the notebook's entry point


__all__ = ["CHECKS", "run", "CheckFailed"]
