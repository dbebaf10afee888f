"""Checks for chapter 6 (inference as a system), written once for the notebook, the grader and pytest.

The references are independent of the learner's code: the bytes of a cache and the roofline of a
decoding step are arithmetic on the published sizes; a paged cache must hand back, for every row,
exactly what was written to it (after truncations and dropped rows), hold ceil(length / block_size)
blocks per row and never a block twice; batched and speculative generation run on a tiny toy
language model (``autograder.checks.toy_lm``) that logs every call, so the checks see the positions, the padding
and what each cache held, and compare the tokens with the library's ``generate`` on the same toy
(greedy) or with the target's exact distribution (sampling, many runs with fixed generators).
What the checks compute that is an answer (the bytes, the roofline and its known mistakes, what a
cache holds, the greedy tokens, the distributions) is computed in ``@core.recorded`` functions of the
case inputs, called before the early return: a student edition that withholds chapter 6 replays their
results and holds no code computing them.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import Tensor

from autograder.checks import core
from autograder.checks.core import Case, Check, CheckFailed, fail, rand_int
from autograder.checks.toy_lm import ToyLM

ref = core.reference("solutions.gpt")  # in a student edition: replayed from a recording


def _pick(gen: torch.Generator, choices: tuple) -> Any:
    return choices[rand_int(gen, 0, len(choices) - 1)]


def _error_text(error: dict) -> str:
    return f"{error.get('type')}: {error.get('message')}"


# The dtypes the exercises name, and their bytes per element: each is a visible case.
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "float8_e4m3fn": 1}


# --- kv_cache_bytes ---------------------------------------------------------------------------------------------

_MODELS = {  # name: (layers, query heads, K/V heads, d_head, dtype) as published
    "GPT-2 small (124M) in float32": (12, 12, 12, 64, "float32"),
    "LLaMA-2-70B in float16 (GQA, 8 K/V heads)": (80, 64, 8, 128, "float16"),
    "LLaMA-2-70B in float16 without GQA (64 K/V heads)": (80, 64, 64, 128, "float16"),
    "Mistral-7B in bfloat16 (GQA, 8 K/V heads)": (32, 32, 8, 128, "bfloat16"),
}
_GQA_MODELS = ("LLaMA-2-70B in float16 (GQA, 8 K/V heads)", "Mistral-7B in bfloat16 (GQA, 8 K/V heads)")


def _bytes_model_inputs(names: tuple[str, ...], per_token: bool):
    def inputs(gen: torch.Generator) -> dict:
        calls, about = [], []
        for name in names:
            layers, heads, kv_heads, d_head, dtype = _MODELS[name]
            seq_len = 1 if per_token else _pick(gen, (1024, 2048, 4096))
            calls.append(((layers, kv_heads, d_head, seq_len), {"dtype": dtype}))
            about.append({"model": name, "heads": heads})
        return {"calls": calls, "about": about}

    return inputs


def _bytes_dtype_inputs(dtypes: tuple[str, ...], batch: bool = True):
    """One call per dtype of ``dtypes`` with random sizes (``batch=False``: batch left to its default); an empty
    ``dtypes`` means one call with the default dtype."""

    def inputs(gen: torch.Generator) -> dict:
        calls = []
        for dtype in dtypes or (None,):
            args = (rand_int(gen, 2, 12), rand_int(gen, 2, 8), _pick(gen, (16, 32, 64, 80, 128)), rand_int(gen, 2, 500))
            kwargs = {} if dtype is None else {"dtype": dtype}
            if batch:
                kwargs["batch"] = rand_int(gen, 2, 6)
            calls.append((args, kwargs))
        return {"calls": calls, "about": [{} for _ in calls]}

    return inputs


@core.recorded
def _bytes_expected(args: tuple, kwargs: dict) -> int:
    """The library's kv_cache_bytes for one call (the dtype given by name)."""
    dtype = getattr(torch, kwargs.get("dtype", "float32"))
    return ref.kv_cache_bytes(*args, batch=kwargs.get("batch", 1), dtype=dtype)


def _judge_bytes_call(args: tuple, kwargs: dict, about: dict, result: dict) -> None:
    if result["error"] is not None:
        fail(f"your code raised {_error_text(result['error'])}")
    out, expected = result["out"], _bytes_expected(args, kwargs)
    layers, kv_heads, d_head, seq_len = args
    dtype = kwargs.get("dtype", "float32")
    itemsize, batch = DTYPES.get(dtype, 8), kwargs.get("batch", 1)
    what = about.get("model", f"{layers} layers, {kv_heads} K/V heads, d_head {d_head}, {seq_len} tokens, "
                              f"batch {batch}, {dtype}")
    if isinstance(out, bool) or not isinstance(out, (int, float)):
        fail(f"{what}: return the number of bytes as an int; got {type(out).__name__}")
    if out == expected:
        if not isinstance(out, int):
            fail(f"{what}: the value is right ({expected}) but return an int, not a {type(out).__name__}")
        return
    mistakes = [
        (expected // 2, "half the expected size: the cache holds keys AND values, the factor 2"),
        (expected // layers, "every layer has its own cache: multiply by n_layers"),
        (expected // itemsize, "that is a number of elements: multiply by the bytes per element, dtype.itemsize"),
        (expected // itemsize * 4, f"the bytes per element come from dtype ({dtype}: {itemsize}), not a fixed 4"),
        (expected // batch, "every sequence of the batch has its own cache: multiply by batch"),
    ]
    heads = about.get("heads", kv_heads)
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


def _judge_bytes(inputs: dict, outputs: dict) -> None:
    for (args, kwargs), about, result in zip(inputs["calls"], inputs["about"], outputs["results"]):
        _judge_bytes_call(args, kwargs, about, result)


def _bytes_bad_inputs(gen: torch.Generator) -> dict:
    calls, bad = [], []
    for name, value in (("n_layers", 0), ("n_kv_heads", 0), ("d_head", -64), ("seq_len", -1), ("batch", 0)):
        values = {"n_layers": 4, "n_kv_heads": 2, "d_head": 64, "seq_len": 10, "batch": 1, name: value}
        calls.append(((values["n_layers"], values["n_kv_heads"], values["d_head"], values["seq_len"]),
                      {"batch": values["batch"], "dtype": "float32"}))
        bad.append((name, value))
    order = torch.randperm(len(calls), generator=gen).tolist()
    return {"calls": [calls[i] for i in order], "bad": [bad[i] for i in order]}


def _judge_bytes_bad(inputs: dict, outputs: dict) -> None:
    for (name, value), result in zip(inputs["bad"], outputs["results"]):
        core.expect_value_error(result["error"], f"{name}={value}", name, word=False)


# --- decode_tokens_per_second: the roofline ------------------------------------------------------------------

_LLMS = {  # name: (parameters, layers, K/V heads, d_head), as published
    "LLaMA-2-7B": (6_738_415_616, 32, 32, 128),
    "Mistral-7B (GQA)": (7_241_732_096, 32, 8, 128),
    "LLaMA-2-70B (GQA)": (68_976_648_192, 80, 8, 128),
    "GPT-2 small": (124_439_808, 12, 12, 64),
}
_ACCELERATORS = {  # name: (memory bandwidth in bytes/s, dense 16-bit peak in FLOP/s), from the data sheets
    "an H100 SXM": (3.35e12, 989e12),
    "an A100 80GB SXM": (2.039e12, 312e12),
    "an L4": (300e9, 121e12),
}


def _roofline_inputs(model: str | None, accelerator: str | None, contexts: tuple[int, ...],
                     batches: tuple[int, ...], dtypes: tuple[str, ...]):
    """One call per (context, batch, dtype); ``model``/``accelerator`` None: drawn at random (sizes or a named one)."""

    def inputs(gen: torch.Generator) -> dict:
        name = model or _pick(gen, tuple(_LLMS))
        where = accelerator or _pick(gen, tuple(_ACCELERATORS))
        params, layers, kv_heads, d_head = _LLMS[name]
        bandwidth, peak = _ACCELERATORS[where]
        calls = []
        for context, batch, dtype in itertools.product(contexts, batches, dtypes):
            calls.append(((params, layers, kv_heads, d_head, context, batch),
                          {"bandwidth": bandwidth, "peak_flops": peak, "dtype": dtype}))
        return {"calls": calls, "what": f"{name} on {where}"}

    return inputs


def _roofline_random_inputs(gen: torch.Generator) -> dict:
    calls = []
    for dtype in DTYPES:
        params = rand_int(gen, 10, 900) * 10_000_000
        args = (params, rand_int(gen, 4, 40), _pick(gen, (1, 2, 4, 8, 16)), _pick(gen, (64, 80, 128)),
                rand_int(gen, 0, 8000), _pick(gen, (1, 3, 16, 100, 400)))
        calls.append((args, {"bandwidth": rand_int(gen, 1, 40) * 1e11, "peak_flops": rand_int(gen, 1, 100) * 1e13,
                             "dtype": dtype}))
    return {"calls": calls, "what": "random sizes and hardware"}


_ROOFLINE_HINTS = {
    "weights_per_sequence": "the weights are read once per step and shared by the whole batch: count them once, "
                            "not once per sequence",
    "no_cache": "each step also reads every sequence's KV cache (context tokens, all layers): add "
                "kv_cache_bytes(n_layers, n_kv_heads, d_head, context, batch, dtype) to the bytes",
    "cache_one_sequence": "every sequence of the batch reads its own cache: pass batch to kv_cache_bytes",
    "sum": "memory traffic and arithmetic overlap: a step lasts as long as the SLOWER of bytes / bandwidth and "
           "FLOPs / peak_flops (max), not their sum",
    "min": "a step lasts as long as the slower of bytes / bandwidth and FLOPs / peak_flops: take the max, not the min",
    "flops_one_sequence": "every sequence of the batch does its own 2 FLOPs per parameter: multiply the FLOPs by batch",
    "flops_without_two": "a parameter costs a multiply AND an add per token: 2 FLOPs, not 1",
    "weights_fixed_bytes": "the weights are stored in dtype too: n_params · dtype.itemsize bytes",
    "seconds": "that is the duration of one step; return tokens per second: batch / step time",
    "per_sequence": "that is tokens per second for one sequence; the step gives one token to EVERY sequence: "
                    "batch / step time",
}


@core.recorded
def _roofline_variants(calls: list) -> dict[str, Any]:
    """For each call: the library's answer ("expected") and what each mistake of _ROOFLINE_HINTS gives, stacked
    (float64, one value per call)."""
    table: dict[str, list[float]] = {name: [] for name in ("expected", *_ROOFLINE_HINTS)}
    for (params, layers, kv_heads, d_head, context, batch), kwargs in calls:
        dtype = getattr(torch, kwargs["dtype"])
        bandwidth, peak = kwargs["bandwidth"], kwargs["peak_flops"]
        table["expected"].append(ref.decode_tokens_per_second(params, layers, kv_heads, d_head, context, batch,
                                                              bandwidth=bandwidth, peak_flops=peak, dtype=dtype))
        weights = params * dtype.itemsize
        cache = ref.kv_cache_bytes(layers, kv_heads, d_head, context, batch, dtype)
        flops = 2 * params * batch

        def tokens(bytes_: float, flops_: float, combine=max) -> float:
            return batch / combine(bytes_ / bandwidth, flops_ / peak)

        step = max((weights + cache) / bandwidth, flops / peak)
        table["weights_per_sequence"].append(tokens(weights * batch + cache, flops))
        table["no_cache"].append(tokens(weights, flops))
        table["cache_one_sequence"].append(tokens(weights + cache / batch, flops))
        table["sum"].append(batch / ((weights + cache) / bandwidth + flops / peak))
        table["min"].append(tokens(weights + cache, flops, min))
        table["flops_one_sequence"].append(tokens(weights + cache, flops / batch))
        table["flops_without_two"].append(tokens(weights + cache, flops / 2))
        table["weights_fixed_bytes"].append(tokens(params * 4 + cache, flops))
        table["seconds"].append(step)
        table["per_sequence"].append(1 / step)
    return core.stacked({name: torch.tensor(values, dtype=torch.float64) for name, values in table.items()})


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=0.0)


def _judge_roofline(inputs: dict, outputs: dict) -> None:
    variants = core.unstacked(_roofline_variants(inputs["calls"]))
    outs, wrong = [], None
    for i, ((args, kwargs), result) in enumerate(zip(inputs["calls"], outputs["results"])):
        what = f"{inputs['what']}, {kwargs['dtype']}, context {args[4]}, batch {args[5]}"
        if result["error"] is not None:
            fail(f"{what}: your code raised {_error_text(result['error'])}")
        out = result["out"]
        if isinstance(out, Tensor) and out.numel() == 1:
            fail(f"{what}: return a Python number (float(...)), not a tensor")
        if isinstance(out, bool) or not isinstance(out, (int, float)):
            fail(f"{what}: return the tokens per second as a float; got {type(out).__name__}")
        outs.append(float(out))
        if wrong is None and not _close(out, float(variants["expected"][i])):
            wrong = (i, what)
    if wrong is None:
        return
    i, what = wrong
    expected = float(variants["expected"][i])
    # The mistake whose numbers are the learner's on every call of the case (two can coincide on one call).
    for name, hint in _ROOFLINE_HINTS.items():
        if all(_close(out, float(v)) for out, v in zip(outs, variants[name])):
            fail(f"{what}: you give {outs[i]:,.6g} tokens/s, expected {expected:,.6g}: {hint}")
    fail(f"{what}: you give {outs[i]:,.6g} tokens/s, expected {expected:,.6g} = batch / max((n_params · itemsize + "
         "kv_cache_bytes(…, context, batch, dtype)) / bandwidth, 2 · n_params · batch / peak_flops)")


# --- PagedKVCache -------------------------------------------------------------------------------------------------


def _paged_inputs(kind: str, dtype: str = "float32"):
    """``kind``: "steps" (a prompt, then one token per step, across block boundaries), "free" (truncate to a length
    inside a block, drop and reorder rows, then write more: the freed blocks are handed out again), "overflow"
    (a pool that runs out)."""

    def inputs(gen: torch.Generator) -> dict:
        n_layers, batch = rand_int(gen, 2, 3), rand_int(gen, 2, 3)
        kv_heads, d_head, block = rand_int(gen, 1, 2), rand_int(gen, 2, 4), _pick(gen, (2, 3, 4))
        if kind == "free":
            batch = 3
        elem = getattr(torch, dtype)

        def chunk(n: int) -> list:
            return [tuple(torch.randn(batch_now, kv_heads, n, d_head, generator=gen, dtype=elem) for _ in range(2))
                    for _ in range(n_layers)]

        batch_now, ops, length, most = batch, [], 0, 0  # most: the blocks the rows hold at the fullest
        if kind == "steps":
            sizes = [rand_int(gen, block + 1, 2 * block + 1)] + [1] * rand_int(gen, block + 1, 2 * block)
        elif kind == "free":
            sizes = [rand_int(gen, 2 * block + 1, 3 * block)]
        else:
            sizes = [rand_int(gen, block + 1, 2 * block)]
        for n in sizes:
            ops.append({"chunk": chunk(n)})
            length += n
        most = batch * -(-length // block)
        if kind == "free":
            length = rand_int(gen, block + 1, length - 1)
            if length % block == 0:
                length += 1  # a length inside a block: its last block still holds tokens
            ops.append({"truncate": length})
            ops.append({"retain": [2, 0] if rand_int(gen, 0, 1) else [1, 2]})
            batch_now = 2
            for n in (rand_int(gen, block, 2 * block), 1, rand_int(gen, 2, block + 1)):
                ops.append({"chunk": chunk(n)})
                length += n
                most = max(most, batch_now * -(-length // block))
        # room to spare but in "overflow": a cache that takes blocks it does not need shows it before running out
        n_blocks = most + rand_int(gen, 0, 2) + (0 if kind == "overflow" else most * (n_layers - 1))
        if kind == "overflow":  # more positions than the whole pool has
            ops.append({"overflow": tuple(torch.randn(batch, kv_heads, block * (n_blocks + 1), d_head, generator=gen,
                                                      dtype=elem) for _ in range(2))})
        free = torch.randperm(n_blocks, generator=gen).tolist()  # blocks handed out in an order of their own
        return {"init_args": (n_layers, batch, kv_heads, d_head),
                "init_kwargs": {"n_blocks": n_blocks, "block_size": block, "dtype": dtype},
                "free": free, "ops": ops}

    return inputs


@core.recorded
def _paged_expected(ops: list) -> list:
    """After each chunk op: every layer's keys and values as a cache must return them, (layer, keys or values,
    batch, kv_heads, positions, d_head) — what was written to each row, in order, after the truncations and the
    rows dropped (None for the other ops)."""
    held = None  # [layer][keys or values] -> (batch, kv_heads, positions, d_head)
    found = []
    for op in ops:
        if "chunk" in op:
            new = [[kv[j] for j in (0, 1)] for kv in op["chunk"]]
            held = new if held is None else [[torch.cat((held[l][j], new[l][j]), dim=-2) for j in (0, 1)]
                                             for l in range(len(new))]
            found.append(torch.stack([torch.stack(pair) for pair in held]))
            continue
        if "truncate" in op:
            held = [[t[:, :, : op["truncate"]] for t in pair] for pair in held]
        elif "retain" in op:
            held = [[t[list(op["retain"])] for t in pair] for pair in held]
        found.append(None)
    return found


def _in_id_order(want: Tensor, tables: list, block: int) -> Tensor:
    """What gathering each row's blocks in the order of their ids (not of the table) returns, from ``want``."""
    length = want.shape[-2]
    padded = torch.nn.functional.pad(want, (0, 0, 0, len(tables[0]) * block - length))
    found = []
    for row, table in enumerate(tables):
        order = sorted(range(len(table)), key=lambda i: table[i])
        found.append(torch.cat([padded[row, :, i * block : (i + 1) * block] for i in order], dim=-2)[:, :length])
    return torch.stack(found)


def _judge_paged_returned(step: dict, expected: Tensor, block: int, held: int, what: str) -> None:
    tables = step.get("tables")
    if not isinstance(tables, list) or not tables or any(len(t) != len(tables[0]) for t in tables) or (
            len(tables) != expected.shape[2] or len(tables[0]) * block < expected.shape[-2]):
        tables = None
    for layer, returned in enumerate(step["returned"]):
        if not isinstance(returned, (list, tuple)) or len(returned) != 2:
            fail(f"{what}: write(layer, k, v) must return a pair (keys, values)")
        for j, name in ((0, "keys"), (1, "values")):
            got, want = returned[j], expected[layer][j]
            if core.same(got, want, 0.0, dtype="kind"):
                continue
            if core.same(got, expected[layer][1 - j], 0.0, dtype="kind"):
                fail(f"{what}: write returns (values, keys): return (keys, values), in that order")
            if not isinstance(got, Tensor) or got.dim() != 4:
                fail(f"{what}: write must return {name} as a tensor (batch, kv_heads, held + new, d_head)")
            length = want.shape[-2]
            if got.shape[-2] == -(-length // block) * block != length and core.same(
                    got[:, :, :length], want, 0.0, dtype="kind"):
                fail(f"{what}: write returns whole blocks ({got.shape[-2]} positions) although {length} are "
                     "filled: attention would also look at the unwritten rest of the last block. Return only "
                     "the first len + new positions")
            if held and core.same(got, want[:, :, held:], 0.0, dtype="kind"):
                fail(f"{what}: write returns only the new {name}: return the held ones followed by the new ones, "
                     "gathered from the row's blocks")
            if tuple(got.shape) != tuple(want.shape):
                fail(f"{what}: write must return {name} of shape {tuple(want.shape)} (batch, kv_heads, held + new, "
                     f"d_head); got {tuple(got.shape)}")
            if tables is not None and core.same(got, _in_id_order(want, tables, block), 0.0, dtype="kind"):
                fail(f"{what}: every {name[:-1]} written came back, but in another order: gather a row's blocks in "
                     "the order of its block table (its logical blocks 0, 1, …), not in the order of their ids")
            empty = (got == 0).all(dim=1).all(dim=-1) & ~(want == 0).all(dim=1).all(dim=-1)  # (batch, positions)
            if bool(empty.any()) or (got.shape[0] > 1 and all(torch.equal(got[0], got[b]) for b in range(1, len(got)))):
                row, p = [int(i) for i in (empty.nonzero()[0] if bool(empty.any()) else (1, 0))]
                fail(f"{what}: row {row}'s {name} at position {p} did not come back from the block its table names: "
                     "the write put them in another block. Position p of row b goes to the pool's block "
                     "block_tables[b][p // block_size] (a physical block id, taken from free_blocks), at offset "
                     "p % block_size; the logical block index p // block_size is not a block id")
            fail(f"{what}: write must return, for each row, the {name} written to it so far, in position order: "
                 "position p of row b is in block block_tables[b][p // block_size] at offset p % block_size")


def _judge_paged_state(step: dict, n_blocks: int, block: int, what: str, truncated: bool = False) -> None:
    tables, free = step["tables"], step["free"]
    if tables is None or free is None:
        fail(f"{what}: keep block_tables (a list of block ids per row) and free_blocks (a list) as __init__ makes "
             "them")
    if not step["in_place"]:
        fail(f"{what}: the pools were replaced: write the keys and values INTO k_pool[layer] / v_pool[layer] "
             "(pool[blocks, :, offsets] = …); they are allocated once, never grown or rebuilt")
    everywhere = [b for table in tables for b in table] + list(free)
    for b in sorted(set(everywhere)):
        owners = [row for row, table in enumerate(tables) if b in table]
        if b in free and owners:
            fail(f"{what}: block {b} is in free_blocks although row {owners[0]} still holds it (freed while in "
                 "use): another row would take it and overwrite its keys. Give back only the blocks no longer "
                 "needed")
        if len(owners) > 1 or everywhere.count(b) > 1:
            fail(f"{what}: block {b} appears twice (in two tables, or twice in free_blocks): a block belongs to "
                 "one row or to the pool")
    if sorted(everywhere) != list(range(n_blocks)):
        lost = sorted(set(range(n_blocks)) - set(everywhere))
        fail(f"{what}: block {lost[0] if lost else '?'} is neither in a row's table nor in free_blocks: blocks "
             "that a row no longer needs must go back to free_blocks")
    need, length = -(-step["length"] // block), step["length"]
    for row, table in enumerate(tables):
        if len(table) == need:
            continue
        if truncated and len(table) < need:
            fail(f"{what}: row {row} kept {len(table)} blocks for {length} tokens: the last of the "
                 f"ceil({length} / {block}) = {need} blocks is partly filled but still in use; give back only the "
                 "blocks past it")
        if truncated:
            fail(f"{what}: row {row} still holds {len(table)} blocks for {length} tokens: give the blocks past "
                 f"ceil({length} / {block}) = {need} back to free_blocks")
        if len(table) < need:
            fail(f"{what}: row {row} holds {len(table)} blocks for {length} tokens; it needs "
                 f"ceil({length} / {block}) = {need}: take a block from free_blocks when a write goes past the last "
                 "one")
        fail(f"{what}: row {row} holds {len(table)} blocks for {length} tokens; ceil({length} / {block}) = {need} "
             "are enough")


def _judge_paged(inputs: dict, outputs: dict) -> None:
    expected = _paged_expected(inputs["ops"])
    n_blocks, block = inputs["init_kwargs"]["n_blocks"], inputs["init_kwargs"]["block_size"]
    length, tables = 0, None
    for i, (op, step) in enumerate(zip(inputs["ops"], outputs["steps"])):
        if "chunk" in op:
            n = op["chunk"][0][0].shape[-2]
            what = f"writing {n} token(s) after {length}"
            moved = [got for got in step["length_after_write"] if got != length]
            if moved:
                fail(f"{what}: len(cache) moved to {moved[0]} inside write: write must not advance the length "
                     "(every layer writes at the same positions); advance does, once")
            taken = step.get("blocks_after_write", [])
            if len(taken) > 1 and any(b != taken[0] for b in taken[1:]):
                fail(f"{what}: the layers after the first took blocks too ({taken} blocks held after each layer's "
                     "write): all layers share one block table, so take blocks only when the table is too short "
                     "for the new positions (the first layer's write), never once per layer")
            if "length" not in step:  # the op raised: reported below
                break
            if step["returned"]:
                _judge_paged_returned(step, expected[i], block, length, what)
            length += n
        elif "length" not in step:  # the op raised: reported below
            break
        elif "truncate" in op:
            what = f"truncate({op['truncate']}) of {length} tokens"
            length = op["truncate"]
            if step["length"] != length:
                fail(f"{what}: len(cache) is {step['length']} afterwards, expected {length}")
        elif "retain" in op:
            rows = op["retain"]
            what = f"retain({rows}) of {len(tables)} rows"
            if step["tables"] != [tables[r] for r in rows]:
                fail(f"{what}: block_tables must become the kept rows' tables, in the order of rows "
                     f"({[tables[r] for r in rows]}); got {step['tables']}")
        else:
            what = "a write that needs more blocks than the pool has free"
            core.expect_value_error(step["error"], what, "n_blocks", word=False)
            if step["tables"] != tables or step["length"] != length:
                fail(f"{what}: refuse before changing anything: the block tables (or the length) changed")
            continue
        if step["length"] != length:
            fail(f"{what}: len(cache) is {step['length']}, expected {length}")
        _judge_paged_state(step, n_blocks, block, what, truncated="truncate" in op)
        tables = step["tables"]
    if outputs["error"] is not None:
        done = len(outputs["steps"])
        op = inputs["ops"][done - 1] if done else {}
        what = ("writing" if "chunk" in op else "truncate" if "truncate" in op else "retain" if "retain" in op
                else "the first write")
        fail(f"{what} (step {done} of {len(inputs['ops'])}): your code raised {_error_text(outputs['error'])}")


# --- the toy language model of the generation checks ---------------------------------------------------------


def _toy_spec(gen: torch.Generator, vocab: int, max_len: int, scale: float = 2.0) -> dict:
    d = 5
    return {"tokens": torch.randn(vocab, d, generator=gen, dtype=torch.float64),
            "positions": torch.randn(max_len, d, generator=gen, dtype=torch.float64),
            "out": torch.randn(d, vocab, generator=gen, dtype=torch.float64) * scale}


def _toy(spec: dict) -> ToyLM:
    return ToyLM(spec["tokens"], spec["positions"], spec["out"], spec.get("fail_at", 0))


@core.recorded
def _ref_generate(spec: dict, idx: Tensor, max_new_tokens: int) -> Tensor:
    """The library's greedy generate on the toy model ``spec`` (eval mode)."""
    return ref.generate(_toy(spec).eval(), idx, max_new_tokens, temperature=0)


@core.recorded
def _draft_choices(draft: dict, tokens: Tensor) -> Tensor:
    """The toy draft's greedy choice after each prefix of ``tokens`` (1, seq): (seq,), entry i follows tokens[:i+1]."""
    with torch.no_grad():
        return _toy(draft)(tokens)[0].argmax(dim=-1)


def _calls_ok(calls: list, who: str = "the model") -> None:
    if any(call["grad"] for call in calls):
        fail(f"{who} ran with autograd on: generate under torch.inference_mode() (or torch.no_grad()), otherwise "
             "every step keeps its graph and memory grows with every token")
    if any(call["training"] for call in calls):
        fail(f"{who} ran in training mode (dropout on): call .eval() while generating")


def _judge_mode(result: dict, training: Any, who: str = "the model") -> None:
    after = result["training"]
    if after != training:
        fail(f"{who} was in {'training' if training else 'eval'} mode before and is not afterwards: keep the mode "
             "(was_training = model.training) and restore it in a finally: block, so that it comes back also when "
             "generation raises")


# --- generate_batch ---------------------------------------------------------------------------------------------


def _batch_inputs(kind: str, *, training: bool = False):
    """``kind``: "greedy" (prompts of different lengths; then sampled twice with one seed), "eos" (a token that ends some rows early), "errors" (a
    model that fails on its third call; prompts past max_len), "sample" (the same generator seed twice),
    "edge" (one prompt; prompts of one length; max_new_tokens=0)."""

    def inputs(gen: torch.Generator) -> dict:
        vocab, max_len = rand_int(gen, 6, 10), rand_int(gen, 24, 32)
        spec = _toy_spec(gen, vocab, max_len)

        def prompts(n: int, low: int = 1, high: int = 7) -> list[Tensor]:
            lengths = [rand_int(gen, low, high) for _ in range(n)]
            if len(set(lengths)) == 1 and n > 1 and kind != "edge":
                lengths[0] = high + 1  # at least two lengths: padding to see
            return [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]

        def run(ps, new, **kwargs) -> dict:
            return {"model": spec, "prompts": ps, "max_new_tokens": new, "training": training,
                    "kwargs": {"temperature": 0.0, **kwargs}}

        if kind == "greedy":  # and sampled with top-k, twice with one seed: top_k and the generator are passed on
            ps = prompts(rand_int(gen, 3, 4))
            once = dict(run(ps, rand_int(gen, 6, 10), temperature=1.3, top_k=rand_int(gen, 2, vocab - 2)),
                        seed=rand_int(gen, 0, 10_000))
            runs = [run(ps, rand_int(gen, 6, 10)), once, dict(once)]
        elif kind == "eos":
            ps, new = prompts(4), rand_int(gen, 8, 12)
            alone = [_ref_generate(spec, p[None], new)[0, len(p) :] for p in ps]
            counts = torch.bincount(torch.cat([a[: new - 1] for a in alone]), minlength=vocab)
            eos = int(counts.argmax())  # the token that ends the most rows early
            runs = [run(ps, new, eos_id=eos)]
        elif kind == "errors":
            failing = dict(spec, fail_at=3)
            ps = prompts(3)
            runs = [{"model": failing, "prompts": ps, "max_new_tokens": 6, "training": True, "kwargs": {}},
                    run(ps, max_len - max(len(p) for p in ps) + rand_int(gen, 1, 3))]
        elif kind == "sample":
            ps, seed = prompts(3), rand_int(gen, 0, 10_000)
            once = dict(run(ps, 8, temperature=1.3, top_k=rand_int(gen, 2, vocab - 1)), seed=seed)
            runs = [once, dict(once)]
        else:
            runs = [run(prompts(1), 7), run(prompts(3, 4, 4), 6), run(prompts(2), 0)]
        return {"runs": runs}

    return inputs


def _expected_rows(spec: dict, prompts: list, new: int, eos: int | None) -> list[Tensor]:
    """Each prompt's greedy tokens alone (the library's generate), cut after the first eos_id."""
    rows = []
    for p in prompts:
        tokens = _ref_generate(spec, p[None], new)[0] if new else p.clone()
        generated = tokens[len(p) :].tolist()
        if eos is not None and eos in generated:
            tokens = tokens[: len(p) + generated.index(eos) + 1]
        rows.append(tokens)
    return rows


@core.recorded
def _batch_layout(prompts: list) -> tuple[Tensor, Tensor]:
    """The first call's padding (batch, width), True at real tokens, and each real token's position (0 at each
    row's first real token; 0 at the pads)."""
    width = max(len(p) for p in prompts)
    padding = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, p in enumerate(prompts):
        padding[row, width - len(p) :] = True
    return padding, (padding.cumsum(dim=-1) - 1).clamp(min=0)


def _judge_first_call(call: dict, prompts: list) -> None:
    width = max(len(p) for p in prompts)
    real, counted = _batch_layout(prompts)
    idx, padding, positions = call["idx"], call["padding"], call["positions"]
    if tuple(idx.shape) != (len(prompts), width):
        fail(f"the first call must feed every prompt at once, left-padded to the longest: idx of shape "
             f"{(len(prompts), width)}; it was {tuple(idx.shape)}")
    for row, p in enumerate(prompts):
        if not torch.equal(idx[row, width - len(p) :], p):
            if torch.equal(idx[row, : len(p)], p):
                fail(f"row {row} is padded on the right: pad on the LEFT, so that every row's last prompt token is "
                     "in the last column, where logits[:, -1] reads the next token")
            fail(f"row {row} of the first call is not its prompt, left-padded")
    if padding is None or padding.dtype != torch.bool or not torch.equal(padding, real):
        fail("pass padding=… to the model: a bool tensor (batch, columns), False at the left padding and True at "
             "the real tokens, so that no real token attends to a pad")
    if positions is None:
        fail("pass positions=… to the model: each row's positions count from its own first real token (0, 1, …); "
             "the default 0, 1, … counts from the first column, the padding")
    for row, p in enumerate(prompts):
        got = positions[row, width - len(p) :]
        if not torch.equal(got, counted[row, width - len(p) :].to(got.dtype)):
            if width != len(p) and got.tolist() == list(range(width - len(p), width)):
                fail(f"row {row}'s positions are counted from the padding ({got.tolist()}): count them from the "
                     "row's first real token (0, 1, …), as if the prompt were alone, e.g. padding.cumsum(-1) - 1")
            fail(f"row {row}'s real tokens must be at positions 0…{len(p) - 1}; they were at {got.tolist()}")


def _judge_later_calls(calls: list, prompts: list, expected: list[Tensor]) -> None:
    """After the prompt, each call feeds one token per row still generating (or per row), at the next position,
    with one more column of padding, True."""
    width = max(len(p) for p in prompts)
    for step, call in enumerate(calls[1:], start=1):
        going = [row for row, (p, e) in enumerate(zip(prompts, expected)) if len(e) - len(p) > step]
        rows = list(range(len(prompts))) if call["idx"].shape[0] == len(prompts) else going
        if call["idx"].shape != (len(rows), 1):
            fail(f"step {step}: feed one new token per row still generating (or per row); the model got idx of "
                 f"shape {tuple(call['idx'].shape)}")
        padding, positions = call["padding"], call["positions"]
        if padding is None or tuple(padding.shape) != (len(rows), width + step):
            fail(f"step {step}: padding must cover every column the cache holds plus the new one: "
                 f"{(len(rows), width + step)}; got {None if padding is None else tuple(padding.shape)} (add a "
                 "column of True for each new token)")
        for i, row in enumerate(rows):
            if row not in going:
                continue
            if not bool(padding[i, -1]):
                fail(f"step {step}: the new token's column of padding must be True (a real token)")
            want = len(prompts[row]) + step - 1
            if positions is None or int(positions[i, -1]) != want:
                got = None if positions is None else int(positions[i, -1])
                fail(f"step {step}: row {row}'s new token is at position {want} (its prompt's {len(prompts[row])} "
                     f"tokens, then one per step); it was given {got}")


def _judge_batch_run(run: dict, result: dict) -> None:
    prompts, new, kwargs = run["prompts"], run["max_new_tokens"], run["kwargs"]
    spec, max_len = run["model"], run["model"]["positions"].shape[0]
    if spec.get("fail_at"):
        if result["error"] is None:
            fail("the model raised in the middle of generation and your code went on: let the error out")
        _judge_mode(result, run["training"])
        return
    width = max(len(p) for p in prompts)
    if width + new > max_len:
        if result["calls"]:
            fail(f"the longest prompt ({width}) + {new} new tokens > max_len={max_len} must be refused BEFORE "
                 f"generating: your code ran the model {len(result['calls'])} time(s) first")
        core.expect_value_error(result["error"], f"the longest prompt ({width}) + {new} new tokens with "
                                f"max_len={max_len}", "max_len", word=False)
        _judge_mode(result, run["training"])
        return
    if result["error"] is not None:
        fail(f"generating {new} tokens after prompts of lengths {[len(p) for p in prompts]} raised "
             f"{_error_text(result['error'])}")
    _judge_mode(result, run["training"])
    _calls_ok(result["calls"])
    out = result["out"]
    if not isinstance(out, (list, tuple)) or len(out) != len(prompts) or not all(
            isinstance(o, Tensor) and o.dim() == 1 for o in out):
        fail(f"return a list of {len(prompts)} 1-d tensors: each prompt followed by its new tokens")
    for row, (p, o) in enumerate(zip(prompts, out)):
        if len(o) < len(p) or not torch.equal(o[: len(p)], p):
            fail(f"output {row} must start with its prompt, unchanged")
    if new == 0:
        if any(len(o) != len(p) for o, p in zip(out, prompts)):
            fail("max_new_tokens=0: return the prompts as they are")
        return
    if kwargs.get("temperature", 1.0) != 0:
        if any(len(o) != len(p) + new for o, p in zip(out, prompts)) or any(
                int(o.min()) < 0 or int(o.max()) >= spec["out"].shape[1] for o in out):
            fail(f"sampling {new} tokens: each output must be its prompt followed by {new} token ids of the vocabulary")
        if kwargs.get("top_k") is not None:
            for row, (p, o) in enumerate(zip(prompts, out)):
                with torch.no_grad():  # the toy's logits before each new token of this row, as if it were alone
                    logits = _toy(spec)(o[None, :-1])[0, len(p) - 1 :]
                allowed = logits >= torch.topk(logits, kwargs["top_k"], dim=-1).values[:, -1:]
                if not bool(allowed.gather(-1, o[len(p) :, None]).all()):
                    fail(f"row {row}: a sampled token is not among the top_k={kwargs['top_k']} of its step's logits: "
                         "pass temperature, top_k, top_p and generator to sample_next_token")
        return
    expected = _expected_rows(spec, prompts, new, kwargs.get("eos_id"))
    if result["calls"]:
        _judge_first_call(result["calls"][0], prompts)
        _judge_later_calls(result["calls"], prompts, expected)
    for row, (o, e) in enumerate(zip(out, expected)):
        if torch.equal(o, e):
            continue
        p = len(prompts[row])
        produced = sorted((j, int(t)) for q, x in zip(prompts, out) for j, t in enumerate(x[len(q) :].tolist()))
        wanted = sorted((j, int(t)) for q, x in zip(prompts, expected) for j, t in enumerate(x[len(q) :].tolist()))
        if produced == wanted:
            fail(f"row {row} got tokens of another row: the right tokens came out, credited to the wrong prompts. "
                 "When finished rows leave the batch (cache.retain(rows)), keep track of which prompt each "
                 "remaining row is")
        if kwargs.get("eos_id") is not None and len(o) > len(e) and torch.equal(o[: len(e)], e):
            fail(f"row {row} went on after its eos_id={kwargs['eos_id']}: a row stops after its own eos_id (kept "
                 "as its last token) while the others go on")
        if kwargs.get("eos_id") is not None and len(o) < len(e) and torch.equal(o, e[: len(o)]):
            fail(f"row {row} stopped after {len(o) - p} new tokens, before its eos_id: each row stops at its OWN "
                 f"eos_id (or after max_new_tokens={new})")
        differ = [t for t in range(min(len(o), len(e))) if int(o[t]) != int(e[t])]
        at = (differ[0] if differ else min(len(o), len(e))) - p
        fail(f"row {row}'s greedy tokens differ from those of its prompt alone from new token {at} on: left-pad, "
             "mask the padding, count each row's positions from its first real token, and feed each step's token "
             "at the next position")


def _judge_batch(inputs: dict, outputs: dict) -> None:
    runs = outputs["runs"]
    if not isinstance(runs, list) or len(runs) != len(inputs["runs"]):
        fail("generate_batch could not be run on every case")
    for run, result in zip(inputs["runs"], runs):
        _judge_batch_run(run, result)
    sampled = [(run, result) for run, result in zip(inputs["runs"], runs) if run.get("seed") is not None]
    if len(sampled) == 2 and not all(torch.equal(a, b) for a, b in zip(sampled[0][1]["out"], sampled[1][1]["out"])):
        fail("the same generator seed gave different tokens: draw every token from the given generator "
             "(sample_next_token(..., generator))")


# --- speculative_generate ---------------------------------------------------------------------------------------


@core.recorded
def _first_token_distributions(target: dict, draft: dict, idx: Tensor, sampling: dict) -> dict[str, Any]:
    """The first new token's distribution after one round with one drafted token, stacked: the target's ("right":
    what a correct speculative step gives), the draft's ("draft": drafted tokens kept unchecked), accepting with
    min(1, q/p) ("inverted"), and resampling a rejected token from p instead of norm(max(0, p - q)) ("from_p")."""
    with torch.no_grad():
        p = ref.next_token_probs(_toy(target)(idx)[:, -1], **sampling)[0].double()
        q = ref.next_token_probs(_toy(draft)(idx)[:, -1], **sampling)[0].double()

    def speculative(accept: Tensor, resample: Tensor) -> Tensor:
        kept = q * accept  # drafted x and kept
        return kept + (1 - kept.sum()) * resample / resample.sum()

    ratio = torch.where(q > 0, p / q.clamp_min(1e-300), torch.zeros_like(p))
    inverse = torch.where(p > 0, q / p.clamp_min(1e-300), torch.ones_like(p))
    residual = (p - q).clamp(min=0)
    return core.stacked({"right": speculative(ratio.clamp(max=1), residual), "draft": q,
                         "inverted": speculative(inverse.clamp(max=1), residual),
                         "from_p": speculative(ratio.clamp(max=1), p)})


@core.recorded
def _target_joint(target: dict, idx: Tensor, n: int, sampling: dict) -> Tensor:
    """The target's probability of each of the vocab ** n continuations of ``idx`` (in itertools.product order)."""
    model = _toy(target)
    vocab = target["out"].shape[1]
    probs = []
    with torch.no_grad():
        for seq in itertools.product(range(vocab), repeat=n):
            prob, prefix = 1.0, idx
            for token in seq:
                prob *= float(ref.next_token_probs(model(prefix)[:, -1], **sampling)[0, token])
                prefix = torch.cat((prefix, torch.tensor([[token]])), dim=1)
            probs.append(prob)
    return torch.tensor(probs, dtype=torch.float64)


_REPEATS = 600  # speculative runs of a sampling case
_DETECT = 0.2  # the target's first-token distribution and each mistake's differ by at least this in some token
_APART = 0.15  # and resampling from p differs as much from the two acceptance mistakes


def _spec_pair(gen: torch.Generator, vocab: int, max_len: int, same: bool = False) -> tuple[dict, dict]:
    target = _toy_spec(gen, vocab, max_len, scale=2.5)
    return target, (target if same else _toy_spec(gen, vocab, max_len, scale=2.5))


@core.recorded
def _sampling_pair(seed: int, vocab: int, sampling: dict) -> dict[str, Any]:
    """A target, a draft and a prompt whose first-token distributions p and q set the right answer and each
    known mistake of _first_token_distributions apart (by _DETECT from the right one, _APART from one another).
    Random toys rarely do; here the toys' output matrices are solved for chosen p and q."""
    gen = torch.Generator().manual_seed(seed)
    temperature, top_k = sampling.get("temperature", 1.0), sampling.get("top_k")
    while True:
        specs = [_toy_spec(gen, vocab, 8) for _ in range(2)]
        idx = torch.randint(0, vocab, (1, rand_int(gen, 1, 3)), generator=gen)
        for spec in specs:
            toy = _toy(spec)
            x = (toy.tokens[idx] + toy.positions[: idx.shape[1]])[0].detach()
            h = torch.tanh(x[-1] + x.mean(dim=0))  # the toy's last hidden vector for this prompt
            probs = torch.rand(vocab, generator=gen, dtype=torch.float64) ** 3
            if top_k is not None:  # what top-k cuts away gets almost nothing
                probs[probs.argsort()[: vocab - top_k]] = 1e-6
            logits = (probs / probs.sum()).log() * temperature
            spec["out"] = torch.outer(h, logits) / h.dot(h)  # h @ out = logits at the prompt's last position
        # the undecorated function: only this search's result is recorded, not each of its attempts
        found = core.unstacked(_first_token_distributions.__wrapped__(specs[0], specs[1], idx, sampling))
        if all(float((found["right"] - found[m]).abs().max()) >= _DETECT for m in _MISTAKE) and all(
                float((found["from_p"] - found[m]).abs().max()) >= _APART for m in ("draft", "inverted")):
            return {"target": specs[0], "draft": specs[1], "idx": idx}


def _speculative_inputs(kind: str, *, training: bool = False, top_k: bool = False):
    """``kind``: "greedy" (lookahead 1-4; then the target as its own draft), "sample" (_REPEATS runs of two tokens
    with lookahead 1, against the target's distribution, with a draft far from it), "rollback" (a draft that is
    often rejected; a model that fails on its third call; a prompt past max_len)."""

    def inputs(gen: torch.Generator) -> dict:
        if kind == "sample":
            vocab, sampling = (4, {"temperature": 0.8, "top_k": 3}) if top_k else (3, {"temperature": 1.0})
            pair = _sampling_pair(rand_int(gen, 0, 10_000), vocab, sampling)
            run = {**pair, "max_new_tokens": 2, "training": training, "seed": rand_int(gen, 0, 10_000),
                   "repeat": _REPEATS, "kwargs": {"lookahead": 1, **sampling}}
            return {"runs": [run], "sampling": sampling}
        vocab, max_len = rand_int(gen, 5, 8), rand_int(gen, 24, 30)
        idx = torch.randint(0, vocab, (1, rand_int(gen, 1, 5)), generator=gen)
        greedy = {"temperature": 0.0}
        if kind == "greedy":
            target, draft = _spec_pair(gen, vocab, max_len)
            new = rand_int(gen, 9, 14)
            runs = [{"target": target, "draft": draft, "idx": idx, "max_new_tokens": new, "training": training,
                     "kwargs": {"lookahead": k, **greedy}} for k in (1, rand_int(gen, 2, 4))]
            k = rand_int(gen, 2, 4)
            runs.append({"target": target, "draft": target, "idx": idx, "max_new_tokens": new, "training": training,
                         "kwargs": {"lookahead": k, **greedy}, "same": True})
        else:
            target, draft = _spec_pair(gen, vocab, max_len)
            sampled = {"target": target, "draft": draft, "idx": idx, "max_new_tokens": rand_int(gen, 12, 16),
                       "training": training, "seed": rand_int(gen, 0, 10_000),
                       "kwargs": {"lookahead": rand_int(gen, 2, 4), "temperature": 2.5}}  # flat: u matters
            runs = [sampled, dict(sampled, twin=True),  # the same seed twice: the same tokens
                    {"target": dict(target, fail_at=3), "draft": draft, "idx": idx, "max_new_tokens": 8,
                     "training": True, "kwargs": {"lookahead": 2, **greedy}},
                    {"target": target, "draft": draft, "idx": idx, "training": training,
                     "max_new_tokens": max_len - idx.shape[1] + rand_int(gen, 1, 2), "kwargs": {"lookahead": 2}}]
        return {"runs": runs}

    return inputs


def _judge_held(calls: list, tokens: Tensor) -> None:
    """At the start of each round — a model's pass right after the other model's, or the very first — its cache
    holds only tokens of the final output (nothing rejected). Within a round a cache also holds the round's
    drafts, not yet judged."""
    previous = None
    for call in calls:
        who, held = f"the {call['model']}", call["held"]
        if held is None:
            fail(f"every call of {who} must go through its cache (model(idx, cache))")
        if call["model"] != previous and (
                held.shape[1] > tokens.shape[1] or not torch.equal(held[0], tokens[0, : held.shape[1]])):
            wrong = next((i for i in range(held.shape[1])
                          if i >= tokens.shape[1] or int(held[0, i]) != int(tokens[0, i])), held.shape[1])
            fail(f"{who}'s cache still held a rejected draft token (position {wrong}) when the next round fed it: "
                 "after accepting n drafted tokens, roll both caches back to the accepted ones "
                 "(cache.truncate(length)) before the next round")
        previous = call["model"]


def _judge_stats(stats: Any, result: dict, run: dict) -> dict:
    if not isinstance(stats, dict) or not all(
            isinstance(stats.get(key), int) and not isinstance(stats.get(key), bool)
            for key in ("proposed", "accepted", "target_calls")):
        fail("return (tokens, stats) with stats a dict of ints: proposed, accepted, target_calls")
    ran = sum(call["model"] == "target" for call in result["calls"])
    if stats["target_calls"] != ran:
        fail(f"stats['target_calls'] is {stats['target_calls']} but the target ran {ran} times: count every forward "
             "pass of the target")
    if not 0 <= stats["accepted"] <= stats["proposed"] <= run["kwargs"].get("lookahead", 4) * stats["target_calls"]:
        fail(f"stats {stats}: 0 <= accepted <= proposed <= lookahead · target_calls must hold (proposed counts the "
             "drafted tokens the target scored, accepted those it kept)")
    return stats


def _judge_speculative_run(run: dict, result: dict) -> None:
    idx, new, training = run["idx"], run["max_new_tokens"], run["training"]
    max_len = min(run["target"]["positions"].shape[0], run["draft"]["positions"].shape[0])

    def both() -> None:
        for mode, who in zip(result["training"], ("the target", "the draft")):
            _judge_mode({"training": mode}, training, who)

    if run["target"].get("fail_at"):
        if result["error"] is None:
            fail("the target raised in the middle of generation and your code went on: let the error out")
        both()
        return
    if idx.shape[1] + new > max_len:
        if result["calls"]:
            fail(f"a prompt of {idx.shape[1]} + {new} new tokens > max_len={max_len} must be refused BEFORE "
                 "generating: your code ran the models first")
        core.expect_value_error(result["error"], f"a prompt of {idx.shape[1]} + {new} new tokens with "
                                f"max_len={max_len}", "max_len", word=False)
        both()
        return
    greedy = run["kwargs"].get("temperature", 1.0) == 0
    if result["error"] is not None:
        if greedy:  # a cache left holding rejected tokens often ends in an error: say why first
            _judge_held(result["calls"], _ref_generate(run["target"], idx, new))
        fail(f"generating {new} tokens with lookahead={run['kwargs'].get('lookahead')} raised "
             f"{_error_text(result['error'])}")
    both()
    _calls_ok([c for c in result["calls"] if c["model"] == "target"], "the target")
    _calls_ok([c for c in result["calls"] if c["model"] == "draft"], "the draft")
    tokens = result["tokens"]
    if not isinstance(tokens, Tensor) or tuple(tokens.shape) != (1, idx.shape[1] + new):
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        fail(f"return (tokens, stats) with tokens the prompt followed by the {new} new tokens, shape "
             f"{(1, idx.shape[1] + new)}; got {shape}")
    if not torch.equal(tokens[:, : idx.shape[1]], idx):
        fail("the output must start with the prompt, unchanged")
    stats = _judge_stats(result["stats"], result, run)
    _judge_held(result["calls"], tokens)
    if not greedy:
        return
    expected = _ref_generate(run["target"], idx, new)
    draft_next = _draft_choices(run["draft"], expected)
    if not torch.equal(tokens, expected):
        first = int((tokens[0] != expected[0]).nonzero()[0])  # tokens[:, :first] is the target's greedy text
        at = first - idx.shape[1]
        if int(tokens[0, first]) == int(draft_next[first - 1]):
            fail(f"greedy (temperature 0): new token {at} is the draft's choice where the target chooses another: "
                 "a drafted token x is kept with probability min(1, p(x) / q(x)), p the target's probability and q "
                 "the draft's; at temperature 0 p(x) is 0 for every token but the target's argmax, so it is "
                 "rejected")
        fail(f"greedy (temperature 0) must give the target's own greedy tokens; they differ from new token {at} on "
             f"(lookahead={run['kwargs']['lookahead']}): accept a drafted token with probability min(1, p/q) and, "
             "at the first rejection, take the next token from norm(max(0, p − q)); with temperature 0 both are "
             "one-hot, so the target's argmax wins")
    if run.get("same"):
        k = run["kwargs"]["lookahead"]
        if stats["accepted"] != stats["proposed"]:
            fail(f"with the target as its own draft every drafted token must be accepted (p = q); "
                 f"{stats['proposed'] - stats['accepted']} of {stats['proposed']} were rejected")
        rounds = -(-new // (k + 1))
        if stats["target_calls"] > rounds + 1:
            fail(f"the target ran {stats['target_calls']} times for {new} tokens with lookahead={k} and every draft "
                 f"accepted: score all the drafted tokens of a round in ONE target pass through its cache (at most "
                 f"{rounds} rounds of k + 1 = {k + 1} tokens, one pass each)")


def _deviation(freq: Tensor, probs: Tensor, repeats: int) -> float:
    """How far the frequencies are from ``probs``, in units of 6 sigma (+ one sample); inf if an outcome of
    probability 0 came out. At most 1: the frequencies could come from ``probs``."""
    if bool(((probs == 0) & (freq > 0)).any()):
        return math.inf
    sigma = (probs * (1 - probs) / repeats).sqrt()
    return float(((freq - probs).abs() / (6 * sigma + 1.0 / repeats)).max())


_SAMPLE_HINTS = {
    "acceptance": "the drafts are kept too often: a drafted token x is kept with probability min(1, p(x) / q(x)) "
                  "(p the target's probability, q the draft's; not q/p, and never without the test u < p(x) / q(x)), "
                  "so that the tokens the draft overrates are the ones rejected",
    "from_p": "after a rejection you draw the token from the target's p: draw it from the residual "
              "norm(max(0, p − q)), since the accepted drafts already gave every token min(p, q)",
}
_MISTAKE = {"draft": "acceptance", "inverted": "acceptance", "from_p": "from_p"}  # distribution -> its hint


def _judge_speculative_sample(inputs: dict, run: dict, result: dict) -> None:
    outs, n = result["outs"], run["max_new_tokens"]
    vocab, start = run["target"]["out"].shape[1], run["idx"].shape[1]
    if result["error"] is not None:
        fail(f"sampling with lookahead=1 raised {_error_text(result['error'])}")
    if len(outs) != run["repeat"] or not all(isinstance(o, Tensor) and tuple(o.shape) == (1, start + n) for o in outs):
        fail(f"every run must return (tokens, stats), tokens of shape (1, {start + n})")
    tokens = torch.stack([o[0, start:] for o in outs])
    if int(tokens.min()) < 0 or int(tokens.max()) >= vocab:
        fail(f"token ids must be in 0…{vocab - 1}")
    found = core.unstacked(_first_token_distributions(run["target"], run["draft"], run["idx"], inputs["sampling"]))
    first = torch.bincount(tokens[:, 0], minlength=vocab).double() / len(outs)
    if _deviation(first, found["right"], len(outs)) <= 1.0:  # the first token is right: then the whole text?
        code = sum(tokens[:, i] * vocab ** (n - 1 - i) for i in range(n))
        freq = torch.bincount(code, minlength=vocab ** n).double() / len(outs)
        if _deviation(freq, _target_joint(run["target"], run["idx"], n, inputs["sampling"]), len(outs)) <= 1.0:
            return
        fail(f"over {len(outs)} runs with fixed generators the first token has the target's distribution but the "
             "tokens after it do not: after a round, go on from the accepted tokens (and the one drawn after them), "
             "with both caches rolled back to them")
    # The known mistake that explains the draws best (multinomial log-likelihood), if it fits them and explains
    # them clearly better than the next one: the hint then names it and no other.
    counts = torch.bincount(tokens[:, 0], minlength=vocab).double()
    fits = sorted(((float((counts * found[name].clamp_min(1e-12).log()).sum()), name) for name in _MISTAKE),
                  reverse=True)
    best = fits[0][1]
    rival = next(f for f in fits if _MISTAKE[f[1]] != _MISTAKE[best])
    if _deviation(first, found[best], len(outs)) <= 1.0 and fits[0][0] - rival[0] >= 10.0:
        fail(f"over {len(outs)} runs with fixed generators, the first new token is not distributed as the target's: "
             + _SAMPLE_HINTS[_MISTAKE[best]])
    token = int((first - found["right"]).abs().argmax())
    fail(f"over {len(outs)} runs with fixed generators, the first new token was {token} in {first[token]:.1%} of "
         f"them; the target gives it {found['right'][token]:.1%}: accept a drafted token x with probability "
         "min(1, p(x) / q(x)) and otherwise draw from norm(max(0, p − q))")


def _judge_speculative(inputs: dict, outputs: dict) -> None:
    runs = outputs["runs"]
    if not isinstance(runs, list) or len(runs) != len(inputs["runs"]):
        fail("speculative_generate could not be run on every case")
    for i, (run, result) in enumerate(zip(inputs["runs"], runs)):
        if run.get("repeat", 1) > 1:
            _judge_speculative_sample(inputs, run, result)
        else:
            _judge_speculative_run(run, result)
        if run.get("twin") and not torch.equal(result["tokens"], runs[i - 1]["tokens"]):
            fail("the same generator seed gave different tokens: draw every random number from the given generator "
                 "(torch.rand((), generator=generator), torch.multinomial(…, generator=generator))")


# --- the table ---------------------------------------------------------------------------------------------

_NAMED = tuple(DTYPES)

CHECKS: dict[str, Check] = {
    "kv_cache_bytes": Check(
        name="kv_cache_bytes",
        visible=(
            Case("per token: GPT-2 small 72 KiB, LLaMA-2-70B 320 KiB", _bytes_model_inputs(
                ("GPT-2 small (124M) in float32", "LLaMA-2-70B in float16 (GQA, 8 K/V heads)"), per_token=True),
                "calls_with_dtype", _judge_bytes),
            Case("LLaMA-2-70B with and without GQA", _bytes_model_inputs(
                ("LLaMA-2-70B in float16 (GQA, 8 K/V heads)", "LLaMA-2-70B in float16 without GQA (64 K/V heads)"),
                per_token=False), "calls_with_dtype", _judge_bytes),
            Case("every dtype the exercise names, with a batch", _bytes_dtype_inputs(_NAMED), "calls_with_dtype",
                 _judge_bytes),
            Case("a size that is not a positive int raises ValueError", _bytes_bad_inputs, "calls_with_dtype",
                 _judge_bytes_bad),
        ),
        hidden=(
            Case("published models", _bytes_model_inputs(tuple(_MODELS), per_token=False), "calls_with_dtype",
                 _judge_bytes),
            Case("GQA models: LLaMA-2-70B, Mistral-7B", _bytes_model_inputs(_GQA_MODELS, per_token=False),
                 "calls_with_dtype", _judge_bytes),
            Case("random sizes, every dtype and float64", _bytes_dtype_inputs(_NAMED + ("float64",)),
                 "calls_with_dtype", _judge_bytes),
            Case("default batch and dtype", _bytes_dtype_inputs((), batch=False), "calls_with_dtype", _judge_bytes),
        ),
    ),
    "decode_tokens_per_second": Check(
        name="decode_tokens_per_second",
        visible=(
            Case("LLaMA-2-7B in float16 on an H100, batch 1 to 2048, no cache yet: memory-bound, then compute-bound",
                 _roofline_inputs("LLaMA-2-7B", "an H100 SXM", (0,), (1, 8, 64, 256, 512, 2048), ("float16",)),
                 "calls_with_dtype", _judge_roofline),
            Case("LLaMA-2-7B on an H100 with 1,024 tokens of cache per sequence, batch 1 to 256",
                 _roofline_inputs("LLaMA-2-7B", "an H100 SXM", (1024,), (1, 16, 256), ("float16",)),
                 "calls_with_dtype", _judge_roofline),
            Case("every dtype the exercise names: Mistral-7B (GQA) on an A100",
                 _roofline_inputs("Mistral-7B (GQA)", "an A100 80GB SXM", (4096,), (4,), _NAMED),
                 "calls_with_dtype", _judge_roofline),
        ),
        hidden=(
            Case("random sizes and hardware, every dtype", _roofline_random_inputs, "calls_with_dtype",
                 _judge_roofline),
            Case("LLaMA-2-70B (GQA) on an H100, contexts and batches",
                 _roofline_inputs("LLaMA-2-70B (GQA)", "an H100 SXM", (0, 512, 8192), (1, 32, 300, 1000),
                                  ("bfloat16", "int8")), "calls_with_dtype", _judge_roofline),
            Case("GPT-2 small in float32 on an L4",
                 _roofline_inputs("GPT-2 small", "an L4", (0, 1024), (1, 4, 64, 2048), ("float32",)),
                 "calls_with_dtype", _judge_roofline),
        ),
    ),
    "PagedKVCache": Check(
        name="PagedKVCache",
        visible=(
            Case("a prompt, then one token per step, over several blocks and rows: equal to what was written",
                 _paged_inputs("steps"), "paged_cache_steps", _judge_paged),
            Case("truncate and retain give blocks back, and they are reused", _paged_inputs("free"),
                 "paged_cache_steps", _judge_paged),
            Case("a pool that runs out: ValueError naming n_blocks, nothing changed", _paged_inputs("overflow"),
                 "paged_cache_steps", _judge_paged),
        ),
        hidden=(
            Case("more steps, other sizes", _paged_inputs("steps"), "paged_cache_steps", _judge_paged),
            Case("freeing and reusing, float64", _paged_inputs("free", "float64"), "paged_cache_steps", _judge_paged),
            Case("running out", _paged_inputs("overflow"), "paged_cache_steps", _judge_paged),
        ),
    ),
    "generate_batch": Check(
        name="generate_batch",
        visible=(
            Case("greedy: each row's tokens are those of its prompt alone; sampling passes top_k and the generator on",
                 _batch_inputs("greedy"),
                 "generate_batch_runs", _judge_batch),
            Case("eos_id: each row stops at its own", _batch_inputs("eos"), "generate_batch_runs", _judge_batch),
            Case("the model's mode comes back, also when a step raises; past max_len: ValueError first",
                 _batch_inputs("errors"), "generate_batch_runs", _judge_batch),
        ),
        hidden=(
            Case("greedy, model in training mode before", _batch_inputs("greedy", training=True),
                 "generate_batch_runs", _judge_batch),
            Case("eos_id, other prompts", _batch_inputs("eos"), "generate_batch_runs", _judge_batch),
            Case("sampling: the same generator seed, the same tokens", _batch_inputs("sample"), "generate_batch_runs",
                 _judge_batch),
            Case("one prompt; prompts of one length; max_new_tokens=0", _batch_inputs("edge"), "generate_batch_runs",
                 _judge_batch),
            Case("errors, other sizes", _batch_inputs("errors"), "generate_batch_runs", _judge_batch),
        ),
    ),
    "speculative_generate": Check(
        name="speculative_generate",
        visible=(
            Case("greedy: the target's own tokens, whatever the draft and lookahead", _speculative_inputs("greedy"),
                 "speculative_runs", _judge_speculative),
            Case("rejected drafts leave both caches; the modes come back, also when a step raises",
                 _speculative_inputs("rollback"), "speculative_runs", _judge_speculative),
            Case(f"sampling: the target's distribution ({_REPEATS} runs with fixed generators)",
                 _speculative_inputs("sample"), "speculative_runs", _judge_speculative),
        ),
        hidden=(  # the sampling case last: it takes the longest
            Case("greedy, models in training mode before", _speculative_inputs("greedy", training=True),
                 "speculative_runs", _judge_speculative),
            Case("rollback, other sizes", _speculative_inputs("rollback", training=True), "speculative_runs",
                 _judge_speculative),
            Case("sampling with temperature and top-k", _speculative_inputs("sample", top_k=True), "speculative_runs",
                 _judge_speculative),
        ),
    ),
}


run = core.runner(__name__)  # run(name, obj, *, level="visible", seed=0): the notebook's entry point


__all__ = ["CHECKS", "run", "CheckFailed"]
