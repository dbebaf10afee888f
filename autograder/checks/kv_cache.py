"""Checks for chapter 6 (KV-cache inference), written once for the notebook, the grader and pytest.

The references are independent of the learner's code: a cache must hand back the
concatenation of everything written to it; attention and the model fed in chunks through a
cache must give what one full pass gives (plain PyTorch from the same weights, or the
library's model with them); sampling is compared with the analytic distribution; generation
with the library's ``generate`` on a toy model whose calls are logged. The cases feed
prompts in chunks of several tokens: a causal mask that is not offset for the cached prefix
is invisible when every step feeds one token. What the checks compute themselves (what a cache
holds, attention over it, the greedy tokens) and every mistake one edit away from an answer are
computed in ``@core.recorded`` functions of the case inputs, called before the early return: a
student edition that withholds chapter 6 replays their results and holds no code computing them.
The sampling distribution (``_filtered``) stays: the top-p cases draw their inputs with it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from autograder.checks import core
from autograder.checks.core import Case, Check, CheckFailed, expect_close, fail, rand_int, same
from autograder.checks.probes import _ToyLM
ref = core.reference("solutions.gpt")  # in a student edition: replayed from a recording


def _pick(gen: torch.Generator, choices: tuple) -> Any:
    return choices[rand_int(gen, 0, len(choices) - 1)]


def _error_text(error: dict) -> str:
    return f"{error.get('type')}: {error.get('message')}"


# Not core.expect_value_error: these hints say what must raise ("top_k=0 must raise ValueError, ..."), where core's
# describe the situation; a learner's verdicts keep their wording.
def _expect_value_error(error: dict | None, what: str, name: str) -> None:
    """``error`` (from a probe) must be a ValueError whose message contains ``name``."""
    if error is None:
        fail(f"{what} must raise ValueError, but your code went on: check it first and say what to change")
    if error.get("type") != "ValueError":
        fail(f"{what} must raise ValueError naming {name}; your code raised {_error_text(error)}")
    if name not in error.get("message", ""):
        fail(f"{what}: the ValueError should name {name} and say what to change; it said {error.get('message')!r}")


# --- KVCache --------------------------------------------------------------------------------------


def _cache_inputs(sizes: str, *, overflow: bool = False, dtype: torch.dtype = torch.float32):
    """``sizes``: "prompt" (a prompt of 2-5 tokens, then one token per step) or "chunks" (chunks of 1-4 tokens)."""

    def inputs(gen: torch.Generator) -> dict:
        n_layers, batch = rand_int(gen, 2, 3), rand_int(gen, 1, 2)
        kv_heads, d_head = rand_int(gen, 1, 3), rand_int(gen, 2, 5)
        if sizes == "prompt":
            chunk_sizes = [rand_int(gen, 2, 5)] + [1] * rand_int(gen, 2, 4)
        else:
            chunk_sizes = [rand_int(gen, 2, 4)] + [rand_int(gen, 1, 4) for _ in range(rand_int(gen, 2, 4))]
        max_len = sum(chunk_sizes) + rand_int(gen, 1, 4)

        def kv(n: int) -> tuple[Tensor, Tensor]:
            return tuple(torch.randn(batch, kv_heads, n, d_head, generator=gen, dtype=dtype) for _ in range(2))

        data = {"init_args": (n_layers, batch, kv_heads, max_len, d_head),
                "chunks": [[kv(n) for _ in range(n_layers)] for n in chunk_sizes]}
        if overflow:
            data["overflow"] = kv(max_len - sum(chunk_sizes) + rand_int(gen, 1, 3))
        return data

    return inputs


def _judge_written(returned: Any, expected: Tensor, new: Tensor, held: int, max_len: int, what: str) -> None:
    """``returned`` (keys or values from ``write``) must be the held ones followed by ``new``."""
    if same(returned, expected, 0.0, dtype="kind"):
        return
    if isinstance(returned, Tensor) and returned.dim() == 4 and returned.shape[-2] == max_len != expected.shape[-2]:
        fail(f"write returns the whole preallocated buffer ({max_len} positions) although only "
             f"{expected.shape[-2]} are filled: attention would also look at the empty (zero) rows. "
             "Return only the filled part, [:, :, :length + new]")
    if held and same(returned, new, 0.0, dtype="kind"):
        fail(f"write returns only the new {what}: it must return the held ones followed by the new ones, "
             "so that the new queries attend to the whole prefix")
    first = slice(0, new.shape[-2])
    if (held and isinstance(returned, Tensor) and returned.shape == expected.shape
            and torch.equal(returned[:, :, first], new) and not torch.equal(expected[:, :, first], new)):
        fail(f"the new {what} land at position 0, over the first held token: write them after the held ones, "
             "at [length : length + new] (a cache that is overwritten makes the model repeat itself)")
    if not isinstance(returned, Tensor) or tuple(returned.shape) != tuple(expected.shape):
        shape = tuple(returned.shape) if isinstance(returned, Tensor) else type(returned).__name__
        fail(f"after {held} held and {new.shape[-2]} new tokens, write must return {what} of shape "
             f"{tuple(expected.shape)} (batch, kv_heads, held + new, d_head); got {shape}")
    fail(f"write must return the held {what} followed by the new ones (everything written to this layer, "
         "in order): each layer keeps its own buffer")


@core.recorded
def _written(chunks: list) -> Tensor:
    """(layer, keys or values, batch, kv_heads, positions, d_head): every chunk written to each layer, concatenated
    in order (after chunk i the cache holds the first positions of these)."""
    return torch.stack([torch.stack([torch.cat([c[layer][j] for c in chunks], dim=-2) for j in (0, 1)])
                        for layer in range(len(chunks[0]))])


def _judge_cache(inputs: dict, outputs: dict) -> None:
    n_layers, batch, kv_heads, max_len, d_head = inputs["init_args"]
    steps, error = outputs["steps"], outputs["error"]
    written = _written(inputs["chunks"])
    length = 0
    for i, (chunk, step) in enumerate(zip(inputs["chunks"], steps)):
        n = chunk[0][0].shape[-2]
        held, length = length, length + n
        moved = [got for got in step["length_after_write"] if got != held]
        if moved:
            fail(f"len(cache) moved from {held} to {moved[0]} inside write: write must not advance the length "
                 "(every layer writes its new tokens at the same positions); the model calls advance(n_tokens) "
                 "once, after the last layer")
        for layer, returned in enumerate(step["returned"]):
            if not isinstance(returned, (list, tuple)) or len(returned) != 2:
                fail("write(layer, k, v) must return a pair (keys, values)")
            for j, what in ((0, "keys"), (1, "values")):
                expected, other = written[layer][j][:, :, :length], written[layer][1 - j][:, :, :length]
                if same(returned[j], other, 0.0, dtype="kind") and not same(returned[j], expected, 0.0, dtype="kind"):
                    fail("write returns (values, keys): return (keys, values), in that order")
                _judge_written(returned[j], expected, chunk[layer][j], held, max_len, what)
        if "length" not in step:
            break
        got = step["length"]
        if got != length:
            if n > 1 and got == held + 1:
                fail(f"after a chunk of {n} tokens the length grew by 1: advance(n_tokens) must add n_tokens "
                     "(invisible when every step feeds one token, wrong as soon as a prompt is fed)")
            if got == held:
                fail("advance(n_tokens) must move the length on by n_tokens: len(cache) did not change")
            fail(f"after {length} tokens written in chunks, len(cache) is {got}, expected {length}")
        for layer in range(n_layers):
            for j, name in enumerate(("keys", "values")):
                if not same(step[name][layer], written[layer][j][:, :, :length], 0.0, dtype="kind"):
                    fail(f"after advance, cache.{name}({layer}) must be the {length} {name} written so far "
                         "(a view of the filled part of the buffer)")
    if error is not None:
        fail(f"writing {[c[0][0].shape[-2] for c in inputs['chunks']]} tokens through {n_layers} layers into a "
             f"cache of max_len={max_len}, your code raised {_error_text(error)}")
    overflow = outputs.get("overflow")
    if inputs.get("overflow") is not None:
        extra = inputs["overflow"][0].shape[-2]
        _expect_value_error(overflow["error"], f"writing {extra} more positions to a cache holding {length} of "
                            f"max_len={max_len}", "max_len")
        if overflow["length"] != length:
            fail("a write that does not fit must change nothing: len(cache) moved")


# --- CausalSelfAttention ------------------------------------------------------------------------


def _layer_config(gen: torch.Generator, kind: str) -> dict:
    """Sizes of a small attention layer: "mha", "gqa" (kv_heads >= 2 and groups >= 2: tiling and grouping
    differ) or "mqa"."""
    if kind == "gqa":
        n_heads, n_kv_heads = _pick(gen, ((4, 2), (6, 2), (6, 3), (8, 2), (8, 4)))
    elif kind == "mqa":
        n_heads, n_kv_heads = _pick(gen, (2, 3, 4)), 1
    else:
        n_heads, n_kv_heads = _pick(gen, (1, 2, 3, 4)), None
    d_head = rand_int(gen, 2, 5)
    return dict(vocab=rand_int(gen, 5, 20), max_len=rand_int(gen, 12, 20), d_model=n_heads * d_head, n_heads=n_heads,
                n_layers=1, n_kv_heads=n_kv_heads)


def _chunk_sizes(gen: torch.Generator, total: int, style: str) -> list[int]:
    """Chunks adding up to ``total``: "prompt" = a prompt of several tokens, one-token steps, then a chunk;
    "random" = chunks of 1-4 tokens, the first and another of at least 2."""
    if style == "prompt":
        first, last = rand_int(gen, 2, total - 4), rand_int(gen, 2, 3)
        return [first] + [1] * (total - first - last) + [last]
    sizes, left = [], total
    while left:
        size = min(left, rand_int(gen, 1, 4))
        sizes.append(size)
        left -= size
    if max(sizes[1:], default=0) < 2 and total >= 4:
        sizes = [2, 2] + [1] * (total - 4)
    return sizes


def _attention_inputs(kind: str, style: str = "prompt", dtype: torch.dtype = torch.float32):
    def inputs(gen: torch.Generator) -> dict:
        config = _layer_config(gen, kind)
        d_model, n_heads = config["d_model"], config["n_heads"]
        kv_heads = config["n_kv_heads"] or n_heads
        d_head = d_model // n_heads
        seq, batch = rand_int(gen, 8, config["max_len"]), rand_int(gen, 1, 2)

        def linear(rows: int) -> tuple[Tensor, Tensor]:
            return (torch.randn(rows, d_model, generator=gen) / math.sqrt(d_model) * 1.5,
                    torch.randn(rows, generator=gen) * 0.1)

        state = {}
        for name, rows in (("q_proj", n_heads * d_head), ("kv_proj", 2 * kv_heads * d_head), ("out_proj", d_model)):
            state[f"{name}.weight"], state[f"{name}.bias"] = linear(rows)
        return {"config": config, "state": state, "x": torch.randn(batch, seq, d_model, generator=gen),
                "chunks": _chunk_sizes(gen, seq, style), "cache": (1, batch, kv_heads, config["max_len"], d_head)}

    return inputs


def _qkv(x: Tensor, state: dict, n_heads: int, kv_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """Projections as plain matrix products: q (batch, heads, seq, d_head), k and v (batch, kv_heads, ...)."""
    batch, seq, d_model = x.shape
    d_head = d_model // n_heads
    q = (x @ state["q_proj.weight"].T + state["q_proj.bias"]).view(batch, seq, n_heads, d_head).transpose(1, 2)
    kv = (x @ state["kv_proj.weight"].T + state["kv_proj.bias"]).view(batch, seq, 2, kv_heads, d_head)
    return q, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, state: dict, *, tiled: bool = False) -> Tensor:
    """softmax(q kᵀ/√d) v with K/V heads shared by consecutive query heads (or tiled), then out_proj."""
    group = q.shape[1] // k.shape[1]
    if tiled:
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    else:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    batch, heads, seq, d_head = out.shape
    return out.transpose(1, 2).reshape(batch, seq, heads * d_head) @ state["out_proj.weight"].T + state["out_proj.bias"]


def _attention_reference(inputs: dict, *, mask: str = "end", cache: bool = True, tiled: bool = False) -> Tensor:
    """The layer's output for ``x`` fed in ``chunks``: each chunk's queries over the keys up to its end
    (``cache=False``: over its own keys only), with ``mask`` "end" (the right one), "top_left", "top_left_if_several"
    (top-left for a chunk of several tokens, none for one: ``is_causal=q.shape[-2] > 1``) or "none"."""
    config, state, x = inputs["config"], inputs["state"], inputs["x"]
    n_heads = config["n_heads"]
    q, k, v = _qkv(x, state, n_heads, config["n_kv_heads"] or n_heads)
    outs, start = [], 0
    for size in inputs["chunks"]:
        end = start + size
        first = start if not cache else 0
        seq_q, seq_k = size, end - first
        if mask == "end":
            allowed = torch.ones(seq_q, seq_k, dtype=torch.bool).tril(diagonal=seq_k - seq_q)
        elif mask == "top_left" or (mask == "top_left_if_several" and seq_q > 1):
            allowed = torch.ones(seq_q, seq_k, dtype=torch.bool).tril()
        else:
            allowed = None
        outs.append(_attend(q[:, :, start:end], k[:, :, first:end], v[:, :, first:end], allowed, state, tiled=tiled))
        start = end
    return torch.cat(outs, dim=1)


@core.recorded
def _attention_outputs(inputs: dict) -> dict[str, Any]:
    """The layer's output for x in one pass ("expected"), and the outputs of the mistakes of _full_pass_hints (one
    pass) and _chunked_hints (fed in the inputs' chunks) but those equal to "expected" (never told apart from it),
    stacked."""
    one_pass = dict(inputs, chunks=[inputs["x"].shape[1]])
    expected = _attention_reference(one_pass)
    found = {"tiled": _attention_reference(one_pass, tiled=True),
             "no_mask": _attention_reference(one_pass, mask="none"),
             "top_left": _attention_reference(inputs, mask="top_left"),
             "top_left_if_several": _attention_reference(inputs, mask="top_left_if_several"),
             "none": _attention_reference(inputs, mask="none"),
             "no_cache": _attention_reference(inputs, cache=False)}
    return core.stacked({"expected": expected, **{bug: out for bug, out in found.items()
                                                  if not torch.equal(out, expected)}})


def _full_pass_hints(config: dict) -> dict[str, str]:
    kv_heads = config["n_kv_heads"] or config["n_heads"]
    grouped = f"query head h uses K/V head h // {config['n_heads'] // kv_heads}"
    return {
        "tiled": f"with {config['n_heads']} query heads and {kv_heads} K/V heads, {grouped}: consecutive query heads "
        "share a K/V head (repeat_kv_heads of chapter 2, or repeat_interleave); k.repeat(1, group, 1, 1) tiles "
        "them instead, which is not how GQA checkpoints are laid out",
        "no_mask": "without a cache this is causal self-attention: token i must not see tokens after it (causal mask)",
    }


def _chunked_hints(chunks: list[int]) -> dict[str, str]:
    return {
        "top_left": f"fed in chunks {chunks}, the new queries see too few keys: your causal mask is aligned to the "
        "top-left corner (as F.scaled_dot_product_attention(is_causal=True) is when seq_q < seq_k). The new tokens are "
        "the LAST seq_q positions of the seq_k keys: use the end-aligned causal_mask(seq_q, seq_k) of chapter 1 "
        "(or attention(..., is_causal=True))",
        "top_left_if_several": f"fed in chunks {chunks}, a chunk of several new tokens after a cached prefix sees too "
        "few keys: the mask is aligned to the top-left, not offset by the cached prefix (F.scaled_dot_product_attention"
        "(is_causal=q.shape[-2] > 1) does this when seq_q < seq_k; one-token steps hide it, since they need no mask). "
        "The new tokens are the LAST seq_q of the seq_k keys: use the end-aligned causal_mask(seq_q, seq_k) of "
        "chapter 1 (or attention(..., is_causal=True))",
        "none": f"fed in chunks {chunks}, a new token sees the new tokens after it: one-token steps need no mask, "
        "but a chunk of several new tokens does, aligned to the end: causal_mask(seq_q, seq_k)",
        "no_cache": "with a cache, the new queries must attend to the cached keys too: use the keys and values that "
        "cache.write(layer, k, v) returns (held + new), not only the new ones",
    }


def _first_mistake(actual: Any, found: dict[str, Tensor], hints: dict[str, str]) -> None:
    """Fail with the hint of the first mistake of ``hints`` (in order) whose output ``actual`` is."""
    for bug, hint in hints.items():
        if bug in found and same(actual, found[bug], dtype="kind"):
            fail(hint)


def _judge_attention(inputs: dict, outputs: dict) -> None:
    found = core.unstacked(_attention_outputs(inputs))
    expected, full = found["expected"], outputs["full"]
    if not same(full, expected, dtype="kind"):
        _first_mistake(full, found, _full_pass_hints(inputs["config"]))
        expect_close(full, expected, "without a cache the output must be causal self-attention over x: "
                     "q_proj, kv_proj (K then V, each (kv_heads d_head)), attention per head, out_proj")
    chunked = outputs["chunked"]
    if not isinstance(chunked, (list, tuple)) or not all(isinstance(c, Tensor) for c in chunked):
        fail("forward(x_new, cache, layer) must return a tensor (batch, seq_new, d_model)")
    for c, size in zip(chunked, inputs["chunks"]):
        if c.dim() != 3 or c.shape[1] != size:
            fail(f"fed {size} new tokens, forward must return (batch, {size}, d_model); got {tuple(c.shape)}")
    got = torch.cat(list(chunked), dim=1)
    if same(got, expected, dtype="kind"):
        return
    chunks = inputs["chunks"]
    _first_mistake(got, found, _chunked_hints(chunks))
    expect_close(got, expected, f"fed in chunks {chunks} through the cache, the outputs must equal one full pass: "
                 "write the new k, v to the cache and attend the new queries over everything it returns")


# --- GPT -------------------------------------------------------------------------------------------


@core.recorded
def _gpt_layout(config: dict) -> tuple[list, list]:
    """The reference GPT's parameters [(name, shape)] in order, and its state_dict as [(key, the parameter it
    holds or None, the buffer or None)] (tied weights: two keys, one parameter)."""
    model = ref.GPT(ref.GPTConfig(**config))
    parameters = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    owner = {p.data_ptr(): name for name, p in model.named_parameters()}
    layout = []
    for key, value in model.state_dict().items():
        name = owner.get(value.data_ptr()) if key not in dict(parameters) else key
        layout.append((key, name, None if name else value))
    return parameters, layout


@core.recorded
def _ref_generate(model: tuple, idx: Tensor, max_new_tokens: int, kwargs: dict, training: bool) -> Tensor:
    """The library's generate on a fresh toy model built from ``model`` (in ``training`` mode)."""
    toy = _ToyLM(*model)
    toy.train(training)
    return ref.generate(toy, idx, max_new_tokens, **kwargs)


def _gpt_inputs(kind: str, style: str = "prompt", past: bool = True):
    def inputs(gen: torch.Generator) -> dict:
        layer = _layer_config(gen, kind)
        config = dict(layer, n_layers=2, max_len=rand_int(gen, 12, 18))  # two layers: advancing per layer shows
        parameters, layout = _gpt_layout(config)
        values = {}
        for name, shape in parameters:
            if name.endswith("bias"):
                values[name] = torch.randn(shape, generator=gen) * 0.1
            elif "norm" in name:
                values[name] = 1 + torch.randn(shape, generator=gen) * 0.1
            else:
                values[name] = torch.randn(shape, generator=gen) / math.sqrt(shape[-1]) * 1.5
        seq, batch = rand_int(gen, 8, config["max_len"] - 2), rand_int(gen, 1, 2)
        kv_heads, d_head = config["n_kv_heads"] or config["n_heads"], config["d_model"] // config["n_heads"]
        data = {"config": config, "state": {key: values[name] if name else buffer for key, name, buffer in layout},
                "idx": torch.randint(0, config["vocab"], (batch, seq), generator=gen),
                "chunks": _chunk_sizes(gen, seq, style),
                "cache": (config["n_layers"], batch, kv_heads, config["max_len"], d_head)}
        if past:
            data["past"] = torch.randint(0, config["vocab"], (batch, config["max_len"] - seq + rand_int(gen, 1, 2)),
                                         generator=gen)
        data["other_batch"] = torch.randint(0, config["vocab"], (batch + 1, 2), generator=gen)
        return data

    return inputs


@core.recorded
@torch.no_grad()
def _gpt_reference(inputs: dict) -> dict[str, Any]:
    """The library model's logits in one pass ("full"), and fed in the inputs' chunks through a cache with every
    chunk placed at positions 0… ("zero_positions": the positions-not-advanced mistake), stacked."""
    model = ref.GPT(ref.GPTConfig(**inputs["config"]))
    model.load_state_dict(inputs["state"])
    model.eval()
    idx = inputs["idx"]
    full = model(idx)
    cache = model.new_cache(idx.shape[0])
    parts, start = [], 0
    for size in inputs["chunks"]:
        x = model.position(model.token_embedding(idx[:, start : start + size]), start_pos=0)
        for layer, block in enumerate(model.blocks):
            x = block(x, cache, layer)
        cache.advance(size)
        parts.append(model.lm_head(model.norm(x)))
        start += size
    return core.stacked({"full": full, "zero_positions": torch.cat(parts, dim=1)})


def _judge_gpt_cache_use(chunks: list, outputs: dict, n_layers: int) -> int:
    """Every block writes the new tokens at the same positions, to its own layer; the cache advances once per
    pass. Returns the number of tokens the cache should hold after the chunks it reported on."""
    lengths = outputs["lengths"]
    done = 0
    for size, writes in zip(chunks, outputs["writes"]):
        expected = [[layer, done, size] for layer in range(n_layers)]
        if writes != expected[: len(writes)] or (len(writes) < n_layers and outputs["error"] is None):
            positions = [w[1] for w in writes]
            if [w[0] for w in writes] != list(range(len(writes))):
                fail(f"block i must write to the cache's layer i; the layers written were {[w[0] for w in writes]}")
            if len(set(positions)) > 1:
                fail(f"the layers wrote {size} new tokens at positions {positions}: the cache was advanced between "
                     "two layers. Every layer writes at the same positions; advance the cache once per forward "
                     "pass, after the last layer")
            if positions and positions[0] > done:
                fail(f"{size} new tokens were written at position {positions[0]} of a cache holding {done}: the "
                     "cache was advanced before the blocks ran; advance it after the last layer")
            if len(writes) < n_layers:
                fail(f"only {len(writes)} of the {n_layers} blocks wrote to the cache: pass it to every block")
        done += size
    done = 0
    for size, got in zip(chunks, lengths):
        held, done = done, done + size
        if got == done:
            continue
        if got == held + size * n_layers and n_layers > 1:
            fail(f"the cache grew by {got - held} for {size} new tokens through {n_layers} layers: advance it once "
                 "per forward pass, after the last layer, not inside the loop over the layers")
        if got == held:
            fail("forward(idx, cache) must extend the cache: call cache.advance(seq) once every layer has written")
        fail(f"after feeding chunks {chunks[: len(lengths)]}, len(cache) should be {done}; it is {got}")
    return done


def _judge_gpt(inputs: dict, outputs: dict) -> None:
    logits = core.unstacked(_gpt_reference(inputs))
    full_expected = logits["full"]
    if not same(outputs["full"], full_expected, 1e-4, dtype="kind"):
        expect_close(outputs["full"], full_expected,
                     "without a cache, forward(idx) must give the logits of the whole model: token embedding plus "
                     "the positions 0…seq-1, every block, the final norm, lm_head (if CausalSelfAttention fails its "
                     "check, fix it first)", atol=1e-4)
    chunks = inputs["chunks"]
    done = _judge_gpt_cache_use(chunks, outputs, inputs["config"]["n_layers"])
    if outputs["error"] is not None:
        fail(f"feeding chunks {chunks} through a cache, your code raised {_error_text(outputs['error'])}")
    chunked = outputs["chunked"]
    if not isinstance(chunked, (list, tuple)) or not all(isinstance(c, Tensor) for c in chunked):
        fail("forward(idx, cache=cache) must return logits (batch, seq_new, vocab)")
    for c, size in zip(chunked, chunks):
        if c.dim() != 3 or c.shape[1] != size:
            fail(f"fed {size} new tokens, forward must return logits (batch, {size}, vocab); got {tuple(c.shape)}")
    got = torch.cat(list(chunked), dim=1)
    if not same(got, full_expected, 1e-4, dtype="kind"):
        if same(got, logits["zero_positions"], 1e-4, dtype="kind"):
            fail(f"fed in chunks {chunks}, every chunk is placed at positions 0, 1, … again: the new tokens sit at "
                 "positions len(cache), len(cache)+1, …; pass start_pos=len(cache) to the position embedding "
                 "(positions not advanced: generation diverges from the second new token on)")
        expect_close(got, full_expected, f"fed in chunks {chunks} through a cache, the logits must equal one full "
                     "pass: read start = len(cache) first, pass the cache and the layer index to every block, and "
                     "advance the cache once at the end", atol=1e-4)
    other = outputs.get("other_batch")
    if inputs.get("other_batch") is not None:
        batch = inputs["cache"][1]
        _expect_value_error(other["error"], f"a cache made for batch={batch} fed {batch + 1} sequences", "batch")
        if other["length"] != 0:
            fail("a batch that does not match the cache's must change nothing: check it before the blocks run "
                 f"(the cache's length moved from 0 to {other['length']})")
    past = outputs.get("past")
    if inputs.get("past") is not None:
        extra, max_len = inputs["past"].shape[1], inputs["config"]["max_len"]
        _expect_value_error(past["error"], f"{done} cached + {extra} new tokens with max_len={max_len}", "max_len")
        if past["length"] != done:
            fail("tokens that do not fit must change nothing: check start + seq against max_len before touching "
                 f"the cache (its length moved from {done} to {past['length']})")


# --- kv_cache_bytes ---------------------------------------------------------------------------------

_MODELS = {  # name: (layers, query heads, K/V heads, d_head, dtype) as published
    "GPT-2 small (124M) in float32": (12, 12, 12, 64, "float32"),
    "LLaMA-2-70B in float16 (GQA, 8 K/V heads)": (80, 64, 8, 128, "float16"),
    "LLaMA-2-70B in float16 without GQA (64 K/V heads)": (80, 64, 64, 128, "float16"),
    "Mistral-7B in bfloat16 (GQA, 8 K/V heads)": (32, 32, 8, 128, "bfloat16"),
}
_GQA_MODELS = ("LLaMA-2-70B in float16 (GQA, 8 K/V heads)", "Mistral-7B in bfloat16 (GQA, 8 K/V heads)")


def _bytes_model_inputs(names: tuple[str, ...], per_token: bool):
    def inputs(gen: torch.Generator) -> dict:
        name = _pick(gen, names)
        layers, heads, kv_heads, d_head, dtype = _MODELS[name]
        seq_len = 1 if per_token else _pick(gen, (1024, 2048, 4096))
        return {"args": (layers, kv_heads, d_head, seq_len), "kwargs": {"dtype": dtype}, "model": name,
                "heads": heads}

    return inputs


def _bytes_random_inputs(dtypes: tuple[str, ...] | None, batch: bool = True):
    """Random sizes; ``dtypes=None`` and ``batch=False`` leave those arguments to their defaults."""

    def inputs(gen: torch.Generator) -> dict:
        args = (rand_int(gen, 2, 12), rand_int(gen, 2, 8), _pick(gen, (16, 32, 64, 80, 128)), rand_int(gen, 2, 500))
        kwargs = {} if dtypes is None else {"dtype": _pick(gen, dtypes)}
        if batch:
            kwargs["batch"] = rand_int(gen, 2, 6)
        return {"args": args, "kwargs": kwargs}

    return inputs


def _bytes_expected(inputs: dict) -> int:
    layers, kv_heads, d_head, seq_len = inputs["args"]
    itemsize = getattr(torch, inputs["kwargs"].get("dtype", "float32")).itemsize
    return 2 * layers * kv_heads * d_head * seq_len * inputs["kwargs"].get("batch", 1) * itemsize


def _judge_bytes(inputs: dict, outputs: dict) -> None:
    if outputs["error"] is not None:
        fail(f"your code raised {_error_text(outputs['error'])}")
    out, expected = outputs["out"], _bytes_expected(inputs)
    layers, kv_heads, d_head, seq_len = inputs["args"]
    itemsize = getattr(torch, inputs["kwargs"].get("dtype", "float32")).itemsize
    batch = inputs["kwargs"].get("batch", 1)
    what = inputs.get("model", f"{layers} layers, {kv_heads} K/V heads, d_head {d_head}, {seq_len} tokens, "
                                f"batch {batch}, {inputs['kwargs'].get('dtype', 'float32')}")
    if isinstance(out, bool) or not isinstance(out, (int, float)):
        fail(f"return the number of bytes as an int; got {type(out).__name__}")
    if out == expected:
        if not isinstance(out, int):
            fail(f"the value is right ({expected}) but return an int, not a {type(out).__name__}")
        return
    mistakes = [
        (expected // 2, "half the expected size: the cache holds keys AND values, the factor 2"),
        (expected // layers, "every layer has its own cache: multiply by n_layers"),
        (expected // itemsize, "that is a number of elements: multiply by the bytes per element, dtype.itemsize"),
        (expected // itemsize * 4, "the bytes per element come from dtype (torch.float16: 2, torch.float32: 4)"),
        (expected // batch, "every sequence of the batch has its own cache: multiply by batch"),
    ]
    heads = inputs.get("heads", kv_heads)
    if heads != kv_heads:  # a published GQA model: its config has both numbers
        mistakes.append((expected // kv_heads * heads,
                         f"{heads // kv_heads}× too large: that is the size for {heads} K/V heads, the model's query "
                         f"heads (n_heads, num_attention_heads). With GQA only {kv_heads} K/V heads are cached, each "
                         "shared by a group of query heads: count n_kv_heads (num_key_value_heads), not n_heads"))
    for wrong, hint in mistakes:
        if out == wrong and wrong != expected:
            fail(f"{what}: you give {out:,} bytes, expected {expected:,}: {hint}")
    fail(f"{what}: you give {out:,} bytes, expected {expected:,} = "
         "2 · layers · kv_heads · d_head · seq_len · batch · dtype.itemsize")


def _bytes_bad_inputs(gen: torch.Generator) -> dict:
    name, value = _pick(gen, (("n_layers", 0), ("n_kv_heads", 0), ("d_head", -64), ("seq_len", -1), ("batch", 0)))
    values = {"n_layers": 4, "n_kv_heads": 2, "d_head": 64, "seq_len": 10, "batch": 1, name: value}
    return {"args": (values["n_layers"], values["n_kv_heads"], values["d_head"], values["seq_len"]),
            "kwargs": {"batch": values["batch"], "dtype": "float32"}, "bad": name}


def _judge_bytes_bad(inputs: dict, outputs: dict) -> None:
    name = inputs["bad"]
    value = dict(zip(("n_layers", "n_kv_heads", "d_head", "seq_len"), inputs["args"]), **inputs["kwargs"])[name]
    _expect_value_error(outputs["error"], f"{name}={value}", name)


# --- sample_next_token --------------------------------------------------------------------------------

_REPEATS = 6000  # samples per distinct row: the frequencies are within ±0.04 of the probabilities at 6 sigma


def _sample_inputs(kind: str, *, temperature: tuple = (1.0,), top_k: bool = False, top_p: bool = False):
    """``kind``: "greedy" (temperature 0), "sample" (one to three distinct rows, each repeated), "ties" (the k-th
    largest logit is tied with the next one)."""

    def inputs(gen: torch.Generator) -> dict:
        vocab = rand_int(gen, 6, 10)
        seed = rand_int(gen, 0, 10_000)
        if kind == "greedy":
            rows = torch.randn(rand_int(gen, 3, 8), vocab, generator=gen) * 2
            return {"args": (rows,), "kwargs": {"temperature": 0.0}, "seed": seed, "distinct": rows, "repeats": 1}
        if kind == "ties":
            k = rand_int(gen, 2, 3)
            values = torch.sort(torch.randn(vocab, generator=gen), descending=True).values
            values[k] = values[k - 1]  # the k-th and (k+1)-th largest logits are equal
            rows = values[torch.randperm(vocab, generator=gen)][None]
            kwargs = {"temperature": 1.0, "top_k": k}
        else:
            kwargs = {"temperature": float(_pick(gen, temperature))}
            if top_k:
                kwargs["top_k"] = rand_int(gen, 3, vocab - 2)
            rows = torch.randn(2 if top_p else rand_int(gen, 2, 3), vocab, generator=gen) * 1.5
            if top_p:
                rows, kwargs["top_p"] = _top_p_rows(gen, rows, kwargs)
        return {"args": (rows.repeat_interleave(_REPEATS, dim=0),), "kwargs": kwargs, "seed": seed,
                "distinct": rows, "repeats": _REPEATS}

    return inputs


def _top_p_rows(gen: torch.Generator, rows: Tensor, kwargs: dict) -> tuple[Tensor, float]:
    """Rows and a top_p that keeps at least two tokens of every row and lies at least 0.04 away from every
    cumulative probability of the (temperature, top-k) distribution (0.01 for the untempered one), so that what
    it keeps is clear-cut; and with which the right distribution and three mistakes' are far apart
    (_top_p_separates), so that each mistake gets its own hint. Two rows: one row often cannot tell top-p before
    the temperature from the dropped crossing token (with top_k=3 and T > 1 it never can)."""
    temperature, top_k = kwargs["temperature"], kwargs.get("top_k")
    for _ in range(300):
        tempered, untempered = (_filtered(rows, t, top_k, None) for t in (temperature, 1.0))
        cumulative, untempered_cumulative = (d.sort(dim=-1, descending=True).values.cumsum(dim=-1)
                                             for d in (tempered, untempered))
        low = float(cumulative[:, 0].max()) + 0.04
        for _ in range(50):
            p = round(low + (0.96 - low) * float(torch.rand((), generator=gen)), 4)
            if (low < 0.96 and float((cumulative - p).abs().min()) >= 0.04
                    and float((untempered_cumulative - p).abs().min()) >= 0.01
                    and _top_p_separates(rows, temperature, top_k, p)):
                return rows, p
        rows = torch.randn(rows.shape, generator=gen)
    raise RuntimeError("no clear-cut top_p found")  # never reached in practice: random rows give one quickly


def _top_p_separates(rows: Tensor, temperature: float, top_k: int | None, top_p: float) -> bool:
    """Whether the right distribution and three mistakes' (the token crossing p dropped, top-p before the
    temperature, no temperature at all) differ pairwise, in some token, by more than 6 sigma of each plus one
    sample: draws from one of them then never fit another."""
    candidates = [_filtered(rows, temperature, top_k, top_p),
                  _filtered(rows, temperature, top_k, top_p, p_inclusive=True),
                  _filtered(rows, temperature, top_k, top_p, p_before_temperature=True),
                  _filtered(rows, 1.0, top_k, top_p)]
    sigmas = [(c * (1 - c) / _REPEATS).sqrt() for c in candidates]
    return all(bool(((candidates[i] - candidates[j]).abs() > 6 * (sigmas[i] + sigmas[j]) + 1 / _REPEATS).any())
               for i in range(len(candidates)) for j in range(i + 1, len(candidates)))


def _filtered(rows: Tensor, temperature: float, top_k: int | None, top_p: float | None, *,
              drop_kth: bool = False, p_inclusive: bool = False, p_before_temperature: bool = False) -> Tensor:
    """The sampling distribution (float64), or a known mistake's."""
    logits = rows.double() / temperature
    if top_k is not None:
        kth = torch.sort(logits, dim=-1, descending=True).values[:, top_k - 1 : top_k]
        logits = logits.masked_fill(logits <= kth if drop_kth else logits < kth, float("-inf"))
    if top_p is not None:
        source = rows.double() if p_before_temperature else logits
        if p_before_temperature and top_k is not None:
            source = source.masked_fill(logits == float("-inf"), float("-inf"))
        probs = torch.softmax(source, dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        cumulative = sorted_probs.cumsum(dim=-1)
        keep_sorted = (cumulative < top_p) if p_inclusive else (cumulative - sorted_probs < top_p)
        keep_sorted[:, 0] = True
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        logits = logits.masked_fill(~keep, float("-inf"))
    return torch.softmax(logits, dim=-1)


def _deviation(freq: Tensor, probs: Tensor, repeats: int) -> float:
    """How far the frequencies are from ``probs``, in units of 6 sigma (+ one sample); inf if a token of
    probability 0 was drawn. At most 1: the frequencies could come from ``probs``."""
    if bool(((probs == 0) & (freq > 0)).any()):
        return math.inf
    sigma = (probs * (1 - probs) / repeats).sqrt()
    return float(((freq - probs).abs() / (6 * sigma + 1.0 / repeats)).max())


def _consistent(freq: Tensor, probs: Tensor, repeats: int) -> bool:
    return _deviation(freq, probs, repeats) <= 1.0


def _check_sample_form(first: Any, second: Any, rows: int, vocab: int) -> None:
    """The draws are (batch, 1) integer ids in the vocabulary, the same for the same generator."""
    if not isinstance(first, Tensor) or first.is_floating_point() or tuple(first.shape) != (rows, 1):
        shape = tuple(first.shape) if isinstance(first, Tensor) else type(first).__name__
        fail(f"return the token ids as an integer tensor of shape (batch, 1) = {(rows, 1)}; got {shape}")
    if not isinstance(second, Tensor) or not torch.equal(first, second):
        fail("with the same generator, the same tokens must come out: draw with the `generator` argument "
             "(torch.multinomial(probs, 1, generator=generator)), not with torch's global random state")
    if bool(((first < 0) | (first >= vocab)).any()):
        fail(f"token ids must be in 0…{vocab - 1}")


def _sample_mistakes(distinct: Tensor, temperature: float, top_k: int | None, top_p: float | None,
                     probs: Tensor) -> list[tuple[Tensor, str]]:
    """(the distribution a known mistake samples from, its hint); the filters' mistakes first: when two
    candidates coincide, the more specific hint wins."""
    mistakes = []
    if top_k is not None:
        mistakes += [
            (_filtered(distinct, temperature, top_k, top_p, drop_kth=True) if top_k > 1 else probs,
             f"top_k={top_k} keeps {top_k - 1} tokens: keep the logits >= the k-th largest (mask with <, not <=)"),
            (_filtered(distinct, temperature, None, top_p), f"top_k={top_k} has no effect: keep only the k most "
                                                            "likely tokens (mask the others with -inf)"),
        ]
    if top_p is not None:
        mistakes += [
            (_filtered(distinct, temperature, top_k, top_p, p_inclusive=True),
             f"top_p={top_p} drops the token that crosses p: keep the smallest set of most likely tokens whose "
             "total probability reaches p, i.e. a token stays if the tokens MORE likely than it sum to < p"),
            (_filtered(distinct, temperature, top_k, top_p, p_before_temperature=True),
             "top-p must be applied to the distribution after temperature (and top-k), not before"),
            (_filtered(distinct, temperature, top_k, None), f"top_p={top_p} has no effect: keep only the smallest "
                                                            "set of most likely tokens whose probability reaches p"),
        ]
    mistakes += [
        (_filtered(distinct, 1.0, top_k, top_p),
         f"the temperature ({temperature}) has no effect: divide the LOGITS by it before the softmax (probabilities "
         "divided by T after the softmax are renormalised and T cancels out)"),
        (_filtered(distinct * temperature ** 2, temperature, top_k, top_p),
         "you multiply by the temperature: divide the logits by it (T < 1 sharpens, T > 1 flattens)"),
    ]
    return mistakes


def _explain_sample(freq: Tensor, probs: Tensor, distinct: Tensor, kwargs: dict, repeats: int) -> None:
    """Fail with the hint of the known mistake that best fits the draws, else with what is off."""
    temperature, top_k, top_p = kwargs.get("temperature", 1.0), kwargs.get("top_k"), kwargs.get("top_p")
    mistakes = _sample_mistakes(distinct, temperature, top_k, top_p, probs)
    matching = [(_deviation(freq, candidate, repeats), hint) for candidate, hint in mistakes
                if not torch.allclose(candidate, probs, atol=0.02)]
    matching = [(deviation, hint) for deviation, hint in matching if deviation <= 1.0]
    if matching:  # the known mistakes that fit the draws, best first (on ties the more specific)
        ranked = [hint for _, hint in sorted(matching, key=lambda m: m[0])]
        fail(ranked[0] + (f" (or: {ranked[1]})" if len(ranked) > 1 else ""))
    if top_k is not None:
        kth = torch.sort(distinct, dim=-1, descending=True).values[:, top_k - 1 : top_k]
        tied = (distinct == kth) & ((distinct == kth).sum(dim=-1, keepdim=True) > 1)
        if bool((tied & (freq == 0) & (probs > 0.01)).any()):
            fail(f"top_k={top_k}: a token tied with the k-th largest logit was never drawn; keep every logit >= the "
                 "k-th largest (mask with logits < kth), not exactly k indices from torch.topk, which drops one of "
                 "two equally likely tokens by its position in the vocabulary")
    if bool(((probs == 0) & (freq > 0)).any()):
        row, token = [int(i) for i in ((probs == 0) & (freq > 0)).nonzero()[0]]
        fail(f"token {token} was sampled although {kwargs} excludes it (its logit is {distinct[row, token]:.3f}; "
             "top-k keeps the logits >= the k-th largest, ties included; top-p keeps the smallest set reaching p)")
    row, token = [int(i) for i in ((freq - probs).abs() == (freq - probs).abs().max()).nonzero()[0]]
    fail(f"with {kwargs}, token {token} was drawn {freq[row, token]:.1%} of the time, its probability is "
         f"{probs[row, token]:.1%}: sample from softmax(logits / temperature) restricted by top_k, then top_p, "
         "and renormalised")


@core.recorded
def _greedy_tokens(logits: Tensor) -> Tensor:
    """Temperature 0's tokens: the argmax of each row, (batch, 1)."""
    return logits.argmax(dim=-1, keepdim=True)


def _judge_sample(inputs: dict, outputs: dict) -> None:
    (logits,), kwargs = inputs["args"], inputs["kwargs"]
    first, second = outputs["first"], outputs["second"]
    temperature, top_k, top_p = kwargs.get("temperature", 1.0), kwargs.get("top_k"), kwargs.get("top_p")
    if outputs.get("error") is not None:
        if temperature == 0:
            fail(f"temperature 0 means greedy: return the argmax of each row, before any division by the "
                 f"temperature (your code raised {_error_text(outputs['error'])})")
        fail(f"with {kwargs}, your code raised {_error_text(outputs['error'])}")
    _check_sample_form(first, second, logits.shape[0], logits.shape[-1])
    distinct, repeats = inputs["distinct"], inputs["repeats"]
    if temperature == 0:
        if not torch.equal(first, _greedy_tokens(logits)):
            fail("temperature 0 means greedy: return the argmax of each row (never divide by 0)")
        return
    tokens = first.view(distinct.shape[0], repeats)
    freq = torch.stack([torch.bincount(t, minlength=logits.shape[-1]) for t in tokens]).double() / repeats
    probs = _filtered(distinct, temperature, top_k, top_p)
    if not _consistent(freq, probs, repeats):
        _explain_sample(freq, probs, distinct, kwargs, repeats)


def _sample_bad_inputs(gen: torch.Generator) -> dict:
    name, value = _pick(gen, (("temperature", -0.5), ("top_k", 0), ("top_p", 0.0), ("top_p", 1.5)))
    return {"args": (torch.randn(2, 6, generator=gen),), "kwargs": {name: value}, "bad": name}


def _judge_sample_bad(inputs: dict, outputs: dict) -> None:
    name = inputs["bad"]
    _expect_value_error(outputs["error"], f"{name}={inputs['kwargs'][name]}", name)


# --- generate ------------------------------------------------------------------------------------------


def _toy_model(gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    vocab, d, max_len = rand_int(gen, 7, 13), 6, rand_int(gen, 20, 32)
    return (torch.randn(vocab, d, generator=gen, dtype=torch.float64),
            torch.randn(max_len, d, generator=gen, dtype=torch.float64),
            torch.randn(d, vocab, generator=gen, dtype=torch.float64) * 2)


def _generate_inputs(kind: str, *, training: bool = False):
    """Runs on one toy model: "greedy" (with and without the cache), "two_prompts" (cached, one after the other),
    "limit" (one token too many, both paths, then an exact fit), "sample" (the same generator seed with and
    without the cache), "zero" (max_new_tokens=0)."""

    def inputs(gen: torch.Generator) -> dict:
        model = _toy_model(gen)
        vocab, max_len = model[0].shape[0], model[1].shape[0]

        def prompt(batch: int, seq: int) -> Tensor:
            return torch.randint(0, vocab, (batch, seq), generator=gen)

        batch, seq = rand_int(gen, 1, 3), rand_int(gen, 2, 6)
        new = rand_int(gen, 6, max_len - seq)
        if kind == "greedy":
            p = prompt(batch, seq)
            runs = [{"idx": p, "max_new_tokens": new, "kwargs": {"use_cache": c, "temperature": 0.0}}
                    for c in (True, False)]
        elif kind == "two_prompts":
            runs = [{"idx": prompt(batch, s), "max_new_tokens": rand_int(gen, 4, max_len - 8),
                     "kwargs": {"use_cache": True, "temperature": 0.0}} for s in (seq, rand_int(gen, 2, 8))]
        elif kind == "limit":
            p = prompt(batch, seq)
            runs = [{"idx": p, "max_new_tokens": max_len - seq + rand_int(gen, 1, 3),
                     "kwargs": {"use_cache": c, "temperature": 0.0}} for c in (True, False)]
            runs.append({"idx": p, "max_new_tokens": max_len - seq, "kwargs": {"use_cache": True, "temperature": 0.0}})
        elif kind == "sample":
            p, seed, top_k = prompt(batch, seq), rand_int(gen, 0, 10_000), rand_int(gen, 2, vocab - 1)
            runs = [{"idx": p, "max_new_tokens": new, "seed": seed,
                     "kwargs": {"use_cache": c, "temperature": 1.5, "top_k": top_k}} for c in (True, False)]
        else:  # "zero"
            runs = [{"idx": prompt(batch, seq), "max_new_tokens": 0, "kwargs": {"use_cache": c, "temperature": 0.0}}
                    for c in (True, False)]
        return {"model": model, "training": training, "runs": runs}

    return inputs


def _judge_calls(run: dict, result: dict, training: bool) -> None:
    """How the model was called: with the cache the prompt once and then one token per step; without it, the
    whole sequence every step; never with autograd on or in training mode; the mode restored afterwards."""
    calls, seq = result["calls"], run["idx"].shape[1]
    use_cache = run["kwargs"].get("use_cache", True)
    if any(call[2] for call in calls):
        fail("the model ran with autograd on: generate under torch.inference_mode() (or torch.no_grad()), "
             "otherwise every step keeps its graph and memory grows with every token")
    if any(call[3] for call in calls):
        fail("the model ran in training mode (dropout on): call model.eval() while generating")
    if result["training"] != training:
        fail(f"the model was in {'training' if training else 'eval'} mode before generate and is not afterwards: "
             "restore its mode (model.train(was_training)), also when an error is raised")
    if len(calls) != run["max_new_tokens"]:
        fail(f"{len(calls)} forward passes for {run['max_new_tokens']} new tokens: the prompt's pass gives the "
             "first new token, each new token's pass the next one; the last new token needs no pass")
    for i, (start, fed, *_rest) in enumerate(calls):
        if use_cache:
            want = (0, seq) if i == 0 else (seq + i - 1, 1)
            if (start, fed) != want:
                if i == 0:
                    fail(f"with use_cache=True the first call must feed the whole prompt into a NEW cache; it fed "
                         f"{fed} tokens to a cache already holding {start}: make a fresh model.new_cache(batch) "
                         "for every prompt")
                fail(f"with use_cache=True, step {i} must feed only the newest token (positions {seq + i - 1}); "
                     f"you fed {fed} token(s) to a cache holding {start}")
        elif (start, fed) != (0, seq + i):
            fail(f"with use_cache=False, step {i} must recompute the whole sequence ({seq + i} tokens) without a "
                 f"cache; you fed {fed} token(s) after {start} cached")


def _judge_generate(inputs: dict, outputs: dict) -> None:
    runs = outputs["runs"]
    if not isinstance(runs, list) or len(runs) != len(inputs["runs"]):
        fail("generate could not be run on every prompt")
    training = inputs["training"]
    outs = []
    for run, result in zip(inputs["runs"], runs):
        seq, new = run["idx"].shape[1], run["max_new_tokens"]
        model = _ToyLM(*inputs["model"])
        max_len = model.config.max_len
        if seq + new > max_len:
            if result["calls"]:
                fail(f"a prompt of {seq} + {new} new tokens > max_len={max_len} must be refused BEFORE generating: "
                     f"your code ran the model {len(result['calls'])} time(s) first")
            _expect_value_error(result["error"], f"a prompt of {seq} + {new} new tokens with max_len={max_len}",
                                "max_len")
            if result["training"] != training:
                fail("after refusing, the model's mode must be what it was")
            continue
        if result["error"] is not None:
            fail(f"generating {new} tokens after a prompt of {seq} (max_len={max_len}) raised "
                 f"{_error_text(result['error'])}")
        _judge_calls(run, result, training)
        out = result["out"]
        if not isinstance(out, Tensor) or tuple(out.shape) != (run["idx"].shape[0], seq + new):
            shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            fail(f"generate must return the prompt followed by the new tokens, shape {(run['idx'].shape[0], seq + new)}"
                 f"; got {shape}")
        if not torch.equal(out[:, :seq], run["idx"]):
            fail("the output must start with the prompt, unchanged")
        outs.append(out)
        kwargs = run["kwargs"]
        if kwargs.get("temperature", 1.0) == 0:
            model.train(training)
            expected = _ref_generate(inputs["model"], run["idx"], new, kwargs, training)
            if not torch.equal(out, expected):
                position = int((out != expected).any(dim=0).nonzero()[0]) - seq
                fail(f"greedy tokens differ from the expected ones from new token {position} on "
                     f"(use_cache={kwargs.get('use_cache', True)}): feed the model's last-position logits to "
                     "sample_next_token, append the token, and feed the model the newest token with the cache (or "
                     "the whole sequence without it)")
        elif kwargs.get("top_k") is not None:
            with torch.no_grad():
                logits = model(out[:, :-1])[:, seq - 1 :]
            allowed = logits >= torch.topk(logits, kwargs["top_k"], dim=-1).values[..., -1:]
            if not allowed.gather(-1, out[:, seq:, None]).all():
                fail(f"a sampled token is not among the top_k={kwargs['top_k']} of its step's logits: pass top_k (and "
                     "temperature, top_p, generator) to sample_next_token")
    sampled = [o for o, r in zip(outs, inputs["runs"]) if r.get("seed") is not None]
    if len(sampled) == 2 and not torch.equal(*sampled):
        fail("sampling with the same generator seed gave different tokens with and without the cache: both paths "
             "see the same logits, so draw exactly once per step from the given generator (sample_next_token)")


# --- the table ---------------------------------------------------------------------------------------------

CHECKS: dict[str, Check] = {
    "KVCache": Check(
        name="KVCache",
        visible=(
            Case("a prompt, then one token per step", _cache_inputs("prompt"), "kv_cache_steps", _judge_cache),
            Case("chunks of several tokens", _cache_inputs("chunks"), "kv_cache_steps", _judge_cache),
            Case("a write past max_len raises ValueError", _cache_inputs("prompt", overflow=True), "kv_cache_steps",
                 _judge_cache),
        ),
        hidden=(
            Case("more chunks, other sizes", _cache_inputs("chunks"), "kv_cache_steps", _judge_cache),
            Case("a float64 cache", _cache_inputs("chunks", dtype=torch.float64), "kv_cache_steps", _judge_cache),
            Case("chunks, then a write past max_len", _cache_inputs("chunks", overflow=True), "kv_cache_steps",
                 _judge_cache),
        ),
    ),
    "CausalSelfAttention": Check(
        name="CausalSelfAttention",
        visible=(
            Case("a prompt fed in chunks equals one pass (MHA)", _attention_inputs("mha"), "attention_with_cache",
                 _judge_attention),
            Case("grouped-query attention, prompt in chunks", _attention_inputs("gqa"), "attention_with_cache",
                 _judge_attention),
        ),
        hidden=(
            Case("GQA, random chunks", _attention_inputs("gqa", "random"), "attention_with_cache", _judge_attention),
            Case("MQA, random chunks", _attention_inputs("mqa", "random"), "attention_with_cache", _judge_attention),
            Case("MHA, random chunks", _attention_inputs("mha", "random"), "attention_with_cache", _judge_attention),
        ),
    ),
    "GPT": Check(
        name="GPT",
        visible=(
            Case("a prompt fed in chunks equals one pass; past max_len or another batch: ValueError", _gpt_inputs("mha"),
                 "gpt_chunks", _judge_gpt),
        ),
        hidden=(
            Case("GQA, random chunks", _gpt_inputs("gqa", "random"), "gpt_chunks", _judge_gpt),
            Case("MQA, random chunks", _gpt_inputs("mqa", "random"), "gpt_chunks", _judge_gpt),
            Case("MHA, random chunks", _gpt_inputs("mha", "random"), "gpt_chunks", _judge_gpt),
        ),
    ),
    "sample_next_token": Check(
        name="sample_next_token",
        visible=(
            Case("temperature 0 is the argmax", _sample_inputs("greedy"), "sample_twice", _judge_sample),
            Case("temperature divides the logits", _sample_inputs("sample", temperature=(0.5, 2.0)), "sample_twice",
                 _judge_sample),
            Case("top-k keeps the k most likely", _sample_inputs("sample", top_k=True), "sample_twice", _judge_sample),
            Case("top-k keeps the tokens tied with the k-th", _sample_inputs("ties"), "sample_twice", _judge_sample),
            Case("top-p keeps the smallest set reaching p, after temperature",
                 _sample_inputs("sample", temperature=(0.5, 2.0), top_p=True), "sample_twice", _judge_sample),
        ),
        hidden=(
            Case("temperature 0 is the argmax", _sample_inputs("greedy"), "sample_twice", _judge_sample),
            Case("temperature, other values", _sample_inputs("sample", temperature=(0.3, 0.7, 1.5, 3.0)),
                 "sample_twice", _judge_sample),
            Case("top-k with ties at the k-th logit keeps them all", _sample_inputs("ties"), "sample_twice",
                 _judge_sample),
            Case("temperature, then top-k, then top-p", _sample_inputs("sample", temperature=(0.6, 1.8), top_k=True,
                                                                        top_p=True), "sample_twice", _judge_sample),
            Case("top-p after temperature", _sample_inputs("sample", temperature=(0.5, 2.5), top_p=True),
                 "sample_twice", _judge_sample),
            Case("bad arguments raise ValueError", _sample_bad_inputs, "call_or_error", _judge_sample_bad),
        ),
    ),
    "generate": Check(
        name="generate",
        visible=(
            Case("greedy: the same tokens with and without the cache", _generate_inputs("greedy"), "generate_runs",
                 _judge_generate),
            Case("two prompts in a row: a fresh cache for each; the model's mode restored",
                 _generate_inputs("two_prompts", training=True), "generate_runs", _judge_generate),
            Case("past max_len: ValueError before generating", _generate_inputs("limit"), "generate_runs",
                 _judge_generate),
        ),
        hidden=(
            Case("greedy, model in training mode before", _generate_inputs("greedy", training=True), "generate_runs",
                 _judge_generate),
            Case("sampling: the same generator seed, the same tokens", _generate_inputs("sample"), "generate_runs",
                 _judge_generate),
            Case("two prompts in a row, eval mode before", _generate_inputs("two_prompts"), "generate_runs",
                 _judge_generate),
            Case("context limit, exact fit", _generate_inputs("limit"), "generate_runs", _judge_generate),
            Case("max_new_tokens=0 returns the prompt", _generate_inputs("zero"), "generate_runs", _judge_generate),
        ),
    ),
    "kv_cache_bytes": Check(
        name="kv_cache_bytes",
        visible=(
            Case("per token: GPT-2 small 72 KiB, LLaMA-2-70B 320 KiB", _bytes_model_inputs(
                ("GPT-2 small (124M) in float32", "LLaMA-2-70B in float16 (GQA, 8 K/V heads)"), per_token=True),
                "call_with_dtype_or_error", _judge_bytes),
            Case("LLaMA-2-70B with and without GQA", _bytes_model_inputs(
                ("LLaMA-2-70B in float16 (GQA, 8 K/V heads)", "LLaMA-2-70B in float16 without GQA (64 K/V heads)"),
                per_token=False), "call_with_dtype_or_error", _judge_bytes),
            Case("batch and dtype", _bytes_random_inputs(("float16", "bfloat16", "float64")),
                 "call_with_dtype_or_error", _judge_bytes),
            Case("a size that is not a positive int raises ValueError", _bytes_bad_inputs, "call_with_dtype_or_error",
                 _judge_bytes_bad),
        ),
        hidden=(
            Case("published models", _bytes_model_inputs(tuple(_MODELS), per_token=False), "call_with_dtype_or_error",
                 _judge_bytes),
            Case("GQA models: LLaMA-2-70B, Mistral-7B", _bytes_model_inputs(_GQA_MODELS, per_token=False),
                 "call_with_dtype_or_error", _judge_bytes),
            Case("random sizes, batch and dtype", _bytes_random_inputs(("float16", "bfloat16", "float32", "float64",
                                                                        "int8")), "call_with_dtype_or_error",
                 _judge_bytes),
            Case("default batch and dtype", _bytes_random_inputs(None, batch=False), "call_with_dtype_or_error",
                 _judge_bytes),
            Case("bad sizes raise ValueError", _bytes_bad_inputs, "call_with_dtype_or_error", _judge_bytes_bad),
        ),
    ),
}


def run(name: str, obj: Any, *, level: str = "visible", seed: int = 0) -> None:
    """Check the learner's ``obj`` for exercise ``name``; raises CheckFailed with a hint when wrong."""
    core.run(__name__, name, obj, level=level, seed=seed)


__all__ = ["CHECKS", "run", "CheckFailed"]
