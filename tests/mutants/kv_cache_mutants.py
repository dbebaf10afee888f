"""Planted bugs for chapter 6 (inference as a system): each must FAIL the hidden checks of its exercise.

Each mutant is the source of ``solutions/gpt.py`` with one realistic change (the ``old -> new``
replacements below, each of which must occur exactly once), compiled as a module of its own: none
of its code runs from the library's file, which the checks' no-delegation rule would flag.
"""

from __future__ import annotations

import inspect
import sys
import types

import solutions.gpt

from mutants import Mutant  # tests/ is on sys.path under pytest

SOURCE = inspect.getsource(solutions.gpt)


def _variant(name: str, replacements: list[tuple[str, str]]) -> types.ModuleType:
    source = SOURCE
    for old, new in replacements:
        found = source.count(old)
        if found != 1:
            raise AssertionError(f"mutant {name}: {old!r} occurs {found} times in solutions/gpt.py, not once")
        source = source.replace(old, new)
    module = types.ModuleType(f"kv_cache_mutant_{name}")
    module.__file__ = f"<kv_cache mutant {name}>"
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def _mutant(name: str, exercise: str, description: str, *replacements: tuple[str, str]) -> Mutant:
    return Mutant(name, exercise, description, getattr(_variant(name, list(replacements)), exercise))


MUTANTS: list[Mutant] = [
    # --- kv_cache_bytes ---
    _mutant(
        "bytes_without_factor_two", "kv_cache_bytes",
        "The factor 2 is missing: only the keys (or only the values) are counted.",
        ("return 2 * n_layers * n_kv_heads", "return n_layers * n_kv_heads"),
    ),
    _mutant(
        "bytes_without_layers", "kv_cache_bytes",
        "The number of layers is missing: one layer's cache instead of the model's.",
        ("return 2 * n_layers * n_kv_heads", "return 2 * n_kv_heads"),
    ),
    _mutant(
        "bytes_fixed_four_per_element", "kv_cache_bytes",
        "Four bytes per element whatever the dtype: float16/bfloat16 caches are counted twice too large.",
        ("* batch * dtype.itemsize", "* batch * 4"),
    ),
    _mutant(
        "bytes_without_batch", "kv_cache_bytes",
        "The batch is ignored: a server with 32 concurrent sequences needs 32 caches.",
        ("* seq_len * batch * dtype.itemsize", "* seq_len * dtype.itemsize"),
    ),
    _mutant(
        "bytes_query_heads_for_kv_heads", "kv_cache_bytes",
        "n_heads used for n_kv_heads: the cache is sized for the query heads (a config's num_attention_heads) "
        "instead of the K/V heads (num_key_value_heads), so GQA's saving is lost: 8x too large for LLaMA-2-70B "
        "(64 query heads, 8 K/V heads), 4x for Mistral-7B. The mistake is made where the sizes are read from the "
        "config; the function's own arguments cannot show it, so the mutant maps the two published GQA models' "
        "sizes to their query heads.",
        ("    return 2 * n_layers * n_kv_heads * d_head",
         "    n_kv_heads = {(80, 8, 128): 64, (32, 8, 128): 32}.get((n_layers, n_kv_heads, d_head), n_kv_heads)\n"
         "    return 2 * n_layers * n_kv_heads * d_head"),
    ),
    _mutant(
        "bytes_unchecked", "kv_cache_bytes",
        "No argument checks: kv_cache_bytes(0, ...) answers 0 bytes and a negative seq_len a negative size, "
        "where the exercise asks for a ValueError naming the argument (a sizing tool fed a typo says nothing).",
        ('    for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("d_head", d_head), ("batch", batch)):\n'
         '        if not isinstance(value, int) or isinstance(value, bool) or value < 1:\n'
         '            raise ValueError(f"{name} must be a positive int; got {value!r}")\n'
         '    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 0:\n'
         '        raise ValueError(f"seq_len must be a non-negative int; got {seq_len!r}")\n', ""),
    ),
    # --- decode_tokens_per_second ---
    _mutant(
        "roofline_weights_per_sequence", "decode_tokens_per_second",
        "The weights counted once per sequence: the batch shares them (one read per step), which is the whole "
        "point of batching decode; this predicts no gain from batching at all.",
        ("weight_bytes = n_params * dtype.itemsize", "weight_bytes = n_params * dtype.itemsize * batch"),
    ),
    _mutant(
        "roofline_without_cache", "decode_tokens_per_second",
        "The cache is left out of the bytes moved: right for a short context, far too optimistic for a long one "
        "(LLaMA-2-7B reads 512 KiB of cache per token of context per sequence).",
        ("step = max((weight_bytes + cache_bytes) / bandwidth", "step = max(weight_bytes / bandwidth"),
    ),
    _mutant(
        "roofline_cache_of_one_sequence", "decode_tokens_per_second",
        "One sequence's cache for the whole batch: every sequence reads its own cache.",
        ("kv_cache_bytes(n_layers, n_kv_heads, d_head, context, batch, dtype)",
         "kv_cache_bytes(n_layers, n_kv_heads, d_head, context, 1, dtype)"),
    ),
    _mutant(
        "roofline_sum_not_max", "decode_tokens_per_second",
        "Memory time and compute time added: on a GPU they overlap, and the roofline takes the slower one.",
        ("step = max((weight_bytes + cache_bytes) / bandwidth, 2 * n_params * batch / peak_flops)",
         "step = (weight_bytes + cache_bytes) / bandwidth + 2 * n_params * batch / peak_flops"),
    ),
    _mutant(
        "roofline_flops_of_one_sequence", "decode_tokens_per_second",
        "The FLOPs of one sequence for the whole batch: decode never turns compute-bound.",
        ("2 * n_params * batch / peak_flops", "2 * n_params / peak_flops"),
    ),
    _mutant(
        "roofline_one_flop_per_parameter", "decode_tokens_per_second",
        "One FLOP per parameter: a multiply-add is two.",
        ("2 * n_params * batch / peak_flops", "n_params * batch / peak_flops"),
    ),
    _mutant(
        "roofline_weights_in_float32", "decode_tokens_per_second",
        "The weights counted at 4 bytes whatever the dtype: an fp16 model reads half of that.",
        ("weight_bytes = n_params * dtype.itemsize", "weight_bytes = n_params * 4"),
    ),
    _mutant(
        "roofline_returns_seconds", "decode_tokens_per_second",
        "The duration of a step returned instead of tokens per second.",
        ("    return batch / step\n", "    return step\n"),
    ),
    _mutant(
        "roofline_per_sequence", "decode_tokens_per_second",
        "Tokens per second of one sequence: a step gives a token to every sequence of the batch.",
        ("    return batch / step\n", "    return 1 / step\n"),
    ),
    # --- PagedKVCache ---
    _mutant(
        "paged_logical_block_as_physical", "PagedKVCache",
        "A logical block mapped to the wrong physical block: the write uses the logical block index "
        "(position // block_size) as the pool's block id instead of looking it up in the row's block table, "
        "so every row writes into blocks 0, 1, … (right only for one sequence in a fresh pool).",
        ("blocks, offsets = tables[:, positions // self.block_size], positions % self.block_size",
         "blocks, offsets = (positions // self.block_size).expand(self.batch, -1), positions % self.block_size"),
    ),
    _mutant(
        "paged_blocks_gathered_in_id_order", "PagedKVCache",
        "The blocks are read in the order of their ids (sorted), not in the table's order: right while the pool "
        "hands out blocks in increasing order, scrambled once freed blocks come back in another order.",
        ("rearrange(pool[tables],", "rearrange(pool[tables.sort(dim=-1).values],"),
    ),
    _mutant(
        "paged_truncate_frees_partial_block", "PagedKVCache",
        "truncate frees the last, partly used block too (floor instead of ceil): the block is still in use, "
        "another row takes it and overwrites the kept tokens.",
        ("keep = -(-length // self.block_size)  # a block that still holds a token stays",
         "keep = length // self.block_size"),
    ),
    _mutant(
        "paged_retain_frees_kept_rows", "PagedKVCache",
        "retain gives back the blocks of the rows it keeps instead of the others': blocks still in use go to "
        "the pool, while the dropped rows' blocks are lost.",
        ("            if row not in rows:\n                self.free_blocks.extend(table)",
         "            if row in rows:\n                self.free_blocks.extend(table)"),
    ),
    _mutant(
        "paged_retain_never_frees", "PagedKVCache",
        "retain drops rows without giving their blocks back: the pool leaks a sequence's blocks each time one "
        "ends, which is the memory a paged cache exists to reuse.",
        ("            if row not in rows:\n                self.free_blocks.extend(table)\n",
         "            pass\n"),
    ),
    _mutant(
        "paged_truncate_keeps_blocks", "PagedKVCache",
        "truncate only moves the length: the blocks past it stay taken.",
        ("        for table in self.block_tables:\n            self.free_blocks.extend(table[keep:])\n"
         "            del table[keep:]\n", ""),
    ),
    _mutant(
        "paged_blocks_taken_per_layer", "PagedKVCache",
        "Blocks taken at every layer's write: each layer grabs its own blocks for the same positions although "
        "all layers share one block table, so the pool runs out n_layers times too fast.",
        ("needed = -(-end // self.block_size) - len(self.block_tables[0])",
         "needed = -(-end // self.block_size) - len(self.block_tables[0]) // len(self.k_pool)"),
    ),
    _mutant(
        "paged_returns_whole_blocks", "PagedKVCache",
        "The gathered blocks returned unsliced: the rest of the last block (zeros, or a freed sequence's old keys) "
        "is attended too.",
        ("        return keys[:, :, :end], values[:, :, :end]\n\n    def truncate",
         "        return keys, values\n\n    def truncate"),
    ),
    _mutant(
        "paged_pool_copied", "PagedKVCache",
        "An out-of-place update: each write copies the pool (clone, or index_put without the underscore) "
        "instead of writing into it, which costs the whole pool per token and breaks anyone holding it.",
        ("        self.k_pool[layer][blocks, :, offsets] = rearrange(",
         "        self.k_pool[layer] = self.k_pool[layer].clone()\n        self.v_pool[layer] = self.v_pool[layer].clone()\n"
         "        self.k_pool[layer][blocks, :, offsets] = rearrange("),
    ),
    _mutant(
        "paged_no_pool_check", "PagedKVCache",
        "No check that the pool has enough free blocks: popping from an empty list raises IndexError halfway, "
        "after some rows took blocks, instead of a ValueError naming n_blocks before anything changes.",
        ("            if needed * self.batch > len(self.free_blocks):\n                raise ValueError(\n"
         "                    f\"the pool of n_blocks={self.n_blocks} has {len(self.free_blocks)} free blocks; \"\n"
         "                    f\"{self.batch} sequences need {needed} more each: make the pool larger or end a sequence\"\n"
         "                )\n", ""),
    ),
    # --- generate_batch ---
    _mutant(
        "batch_positions_from_padding", "generate_batch",
        "Left padding with positions counted from the padding: every row's positions start at the first column, "
        "so a short prompt's tokens sit at the positions of a long one's and its tokens change.",
        ("positions = (padding.cumsum(dim=-1) - 1).clamp(min=0)",
         "positions = torch.arange(width).expand(len(prompts), width)"),
    ),
    _mutant(
        "batch_right_padding", "generate_batch",
        "Right padding: a shorter row's last column is padding, so the next token is read from a pad's logits.",
        ("        idx[row, width - len(prompt) :] = prompt\n        padding[row, width - len(prompt) :] = True\n",
         "        idx[row, : len(prompt)] = prompt\n        padding[row, : len(prompt)] = True\n"),
    ),
    _mutant(
        "batch_padding_not_masked", "generate_batch",
        "No padding mask for the prompt: the real tokens attend to the pads, so a row's tokens depend on how "
        "long the other prompts are.",
        ("logits = model(idx, cache, positions=positions, padding=padding)[:, -1]",
         "logits = model(idx, cache, positions=positions)[:, -1]"),
    ),
    _mutant(
        "batch_stops_at_first_eos", "generate_batch",
        "The whole batch stops when one row produces eos_id: the other rows are cut short.",
        ("if not going or step + 1 == max_new_tokens:", "if len(going) < len(rows) or step + 1 == max_new_tokens:"),
    ),
    _mutant(
        "batch_eos_ignored", "generate_batch",
        "No per-row stop: rows go on past their eos_id.",
        ("if t != eos_id]", "]"),
    ),
    _mutant(
        "batch_positions_not_advanced", "generate_batch",
        "Positions not advanced after the prompt: every new token gets the last prompt token's position.",
        ("positions = positions[:, -1:] + 1", "positions = positions[:, -1:]"),
    ),
    _mutant(
        "batch_rows_not_followed", "generate_batch",
        "Finished rows leave the cache but the list of which prompt each row is stays: later tokens are "
        "credited to the wrong prompts.",
        ("rows, token = [rows[i] for i in going], token[going]", "token = token[going]"),
    ),
    _mutant(
        "batch_mode_restored_only_on_success", "generate_batch",
        "The model's mode is restored after the loop, not in a finally: block: when a step raises (out of "
        "memory, a bad token), the model stays in eval mode and a training loop goes on without dropout.",
        ("    finally:\n        model.train(was_training)\n    return [torch.cat((prompt,",
         "    except BaseException:\n        raise\n    model.train(was_training)\n    return [torch.cat((prompt,"),
    ),
    _mutant(
        "batch_with_autograd", "generate_batch",
        "Generating with autograd on: every step keeps its graph and memory grows with every token.",
        ("        with torch.inference_mode():\n            cache = model.new_cache(len(prompts))",
         "        with torch.enable_grad():\n            cache = model.new_cache(len(prompts))"),
    ),
    _mutant(
        "batch_no_context_check", "generate_batch",
        "No context check: generation runs until the model fails past max_len, after the prompts' work.",
        ("if width + max_new_tokens > model.config.max_len:", "if False:"),
    ),
    _mutant(
        "batch_sampling_ignores_top_k", "generate_batch",
        "top_k not passed on to the sampler: the batch samples from the whole vocabulary whatever top_k says.",
        ("                token = sample_next_token(logits, temperature, top_k, top_p, generator)\n"
         "                for row, t in zip(rows",
         "                token = sample_next_token(logits, temperature, None, top_p, generator)\n"
         "                for row, t in zip(rows"),
    ),
    # --- speculative_generate ---
    _mutant(
        "spec_ratio_inverted", "speculative_generate",
        "Acceptance with p/q inverted: a drafted token is kept with probability min(1, q/p), so the tokens the "
        "draft overrates are the ones kept.",
        ("ps[n, x] / qs[n][0, x]", "qs[n][0, x] / ps[n, x]"),
    ),
    _mutant(
        "spec_resample_from_target", "speculative_generate",
        "No resampling from the residual: a rejected token is replaced by a draw from the target's p instead of "
        "norm(max(0, p - q)), which counts the accepted share of p twice.",
        ("residual = (ps[n] - qs[n][0]).clamp(min=0)", "residual = ps[n]"),
    ),
    _mutant(
        "spec_drafts_never_rejected", "speculative_generate",
        "Every drafted token accepted unchecked: the output is the draft's, fast and wrong.",
        ("if torch.rand((), generator=generator, device=ps.device) >= ps[n, x] / qs[n][0, x]:", "if False:"),
    ),
    _mutant(
        "spec_target_cache_not_rolled_back", "speculative_generate",
        "The target's cache not rolled back past a rejected token: the next round is fed after the rejected "
        "drafts, at the wrong positions.",
        ("                t_cache.truncate(accepted)\n", ""),
    ),
    _mutant(
        "spec_draft_cache_not_rolled_back", "speculative_generate",
        "The draft's cache not rolled back: its next proposals are conditioned on rejected tokens (still right in "
        "distribution, since the target decides, but the draft's cache fills up with tokens that are not in the "
        "text and its proposals get worse).",
        ("                d_cache.truncate(min(len(d_cache), accepted))\n", ""),
    ),
    _mutant(
        "spec_verified_token_by_token", "speculative_generate",
        "The drafted tokens verified one target pass each, not in one chunked pass: right, but as slow as "
        "plain decoding (the point of speculation is one target pass for k tokens).",
        ("                logits = target(fed, t_cache)[0, -(k + 1) :]\n                stats[\"target_calls\"] += 1\n",
         "                logits = torch.cat([target(fed[:, i : i + 1], t_cache)[0] for i in range(fed.shape[1])])"
         "[-(k + 1) :]\n                stats[\"target_calls\"] += fed.shape[1]\n"),
    ),
    _mutant(
        "spec_global_random_state", "speculative_generate",
        "The acceptance test's uniform draw taken from torch's global random state instead of the generator: right "
        "in distribution, but a seeded generator no longer reproduces the text.",
        ("torch.rand((), generator=generator, device=ps.device)", "torch.rand((), device=ps.device)"),
    ),
    _mutant(
        "spec_mode_restored_only_on_success", "speculative_generate",
        "The models' modes restored after generating, not in a finally: block: a failing step leaves them in "
        "eval mode.",
        ("            return out, stats\n    finally:\n        target.train(modes[0])\n        draft.train(modes[1])",
         "    except BaseException:\n        raise\n    target.train(modes[0])\n    draft.train(modes[1])\n"
         "    return out, stats"),
    ),
]
