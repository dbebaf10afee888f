"""Planted bugs for chapter 6 (KV-cache inference): each must FAIL the hidden checks of its exercise.

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
    # --- KVCache ---
    _mutant(
        "cache_overwritten_at_start", "KVCache",
        "Cache not appended: the new keys/values are written at position 0 instead of after the held ones, so "
        "every step overwrites the first token. Greedy generation then repeats one token (bug hunt 1).",
        ("self.k[layer][:, :, self.length : end] = k", "self.k[layer][:, :, : k.shape[-2]] = k"),
        ("self.v[layer][:, :, self.length : end] = v", "self.v[layer][:, :, : v.shape[-2]] = v"),
    ),
    _mutant(
        "cache_attended_unsliced", "KVCache",
        "A preallocated cache attended unsliced: write returns the whole max_len buffer, so attention also "
        "looks at the empty (zero) rows, and the new queries are end-aligned to position max_len.",
        ("return self.k[layer][:, :, :end], self.v[layer][:, :, :end]", "return self.k[layer], self.v[layer]"),
    ),
    _mutant(
        "cache_returns_new_only", "KVCache",
        "write stores the new keys/values but returns only them: the new token attends to itself, never to "
        "the prefix (every step is a bigram model).",
        ("return self.k[layer][:, :, :end], self.v[layer][:, :, :end]", "return k, v"),
    ),
    _mutant(
        "cache_advances_in_write", "KVCache",
        "The length advances inside write, once per layer: the second layer writes after the first layer's "
        "tokens and the cache runs out n_layers times too fast (correct with one layer only).",
        ("        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]",
         "        self.length = end\n        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]"),
        ("        self.length += n_tokens", "        pass"),
    ),
    _mutant(
        "cache_advances_by_one", "KVCache",
        "advance adds 1 whatever the number of tokens: right when every step feeds one token, wrong as soon "
        "as a prompt is fed (the next token is written over the prompt).",
        ("self.length += n_tokens", "self.length += 1"),
    ),
    _mutant(
        "cache_no_overflow_check", "KVCache",
        "No max_len check in write: a write past the end fails deep inside the slice assignment with a shape "
        "error (or, with a buffer view, silently keeps fewer tokens) instead of a ValueError naming max_len.",
        ("        if end > self.max_len:  # a slice past the buffer would silently come back shorter\n"
         "            raise ValueError(\n"
         "                f\"{self.length} held + {k.shape[-2]} new positions exceed the cache's max_len={self.max_len}\"\n"
         "            )\n", ""),
    ),
    # --- CausalSelfAttention ---
    _mutant(
        "mask_not_offset_for_prefix", "CausalSelfAttention",
        "Causal mask not offset for the cached prefix: causal only when several queries come at once, with "
        "PyTorch's top-left alignment (F.scaled_dot_product_attention(is_causal=True) when seq_q < seq_k: "
        "pytorch/pytorch#103082, #108108, #144858), no mask for one query. Invisible with one-token steps; a "
        "prompt fed in chunks is wrong.",
        ("out = attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)",
         "top_left = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()\n"
         "        out = attention(q, k, v, top_left if q.shape[-2] > 1 else None,"
         " dropout_p=self.dropout if self.training else 0.0)"),
    ),
    _mutant(
        "no_causal_mask", "CausalSelfAttention",
        "No causal mask: right for one-token steps (the only new token may see every key), but the prompt's "
        "tokens see the future.",
        ("is_causal=True, dropout_p=self.dropout", "is_causal=False, dropout_p=self.dropout"),
    ),
    _mutant(
        "gqa_tiled_not_grouped", "CausalSelfAttention",
        "GQA expanded with repeat instead of grouping: query head h uses K/V head h % kv_heads, not "
        "h // (n_heads / kv_heads) as GQA checkpoints (LLaMA's repeat_kv) do. Same as MHA when kv_heads = "
        "n_heads or 1.",
        ("            k, v = cache.write(layer, k, v)\n",
         "            k, v = cache.write(layer, k, v)\n"
         "        k = k.repeat(1, self.n_heads // self.kv_heads, 1, 1)\n"
         "        v = v.repeat(1, self.n_heads // self.kv_heads, 1, 1)\n"),
    ),
    _mutant(
        "cache_written_not_read", "CausalSelfAttention",
        "The new keys/values are written to the cache, but attention uses only the new ones: the new tokens "
        "never see the prefix.",
        ("            k, v = cache.write(layer, k, v)", "            cache.write(layer, k, v)"),
    ),
    # --- GPT ---
    _mutant(
        "positions_not_advanced", "GPT",
        "Positions not advanced: every forward pass places its tokens at positions 0, 1, ... even with a "
        "cache. The first new token is right (the prompt is fed from 0), then generation diverges from the "
        "second step on (bug hunt 2).",
        ("self.position(self.token_embedding(idx), start_pos=start)",
         "self.position(self.token_embedding(idx), start_pos=0)"),
    ),
    _mutant(
        "cache_advanced_per_layer", "GPT",
        "The cache is advanced inside the loop over the blocks: layer 2 writes after layer 1's new tokens and "
        "the length grows n_layers times too fast (correct with one layer only).",
        ("            x = block(x, cache, layer)\n        if cache is not None:\n"
         "            cache.advance(idx.shape[1])\n",
         "            x = block(x, cache, layer)\n            if cache is not None:\n"
         "                cache.advance(idx.shape[1])\n"),
    ),
    _mutant(
        "cache_advanced_before_blocks", "GPT",
        "The cache is advanced before the blocks run: the new keys are written one chunk too far and the "
        "queries attend to empty rows.",
        ("        x = self.dropout(self.position(self.token_embedding(idx), start_pos=start))\n",
         "        x = self.dropout(self.position(self.token_embedding(idx), start_pos=start))\n"
         "        if cache is not None:\n            cache.advance(idx.shape[1])\n"),
        ("        if cache is not None:\n            cache.advance(idx.shape[1])\n        return",
         "        return"),
    ),
    _mutant(
        "gpt_no_batch_check", "GPT",
        "No check that the cache was made for this batch: a cache for one prompt fed two (or the reverse) fails "
        "deep inside the cache's slice assignment with a shape error instead of a ValueError naming batch.",
        ("        if cache is not None and cache.batch != idx.shape[0]:\n"
         "            raise ValueError(f\"the cache was made for batch={cache.batch} but idx has batch {idx.shape[0]}; \"\n"
         "                             f\"use model.new_cache(batch={idx.shape[0]})\")\n", ""),
    ),
    # --- sample_next_token ---
    _mutant(
        "temperature_after_softmax", "sample_next_token",
        "Temperature applied after the softmax: the probabilities divided by T are renormalised by the "
        "sampler, so T has no effect at all.",
        ("logits = logits.float() / temperature", "logits = logits.float()"),
        ("return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)",
         "return torch.multinomial(torch.softmax(logits, dim=-1) / temperature, 1, generator=generator)"),
    ),
    _mutant(
        "temperature_zero_divides", "sample_next_token",
        "T = 0 not special-cased: logits / 0 are infinite, the softmax is NaN and sampling fails instead of "
        "being greedy.",
        ("    if temperature == 0:\n        return logits.argmax(dim=-1, keepdim=True)\n    logits = logits.float()",
         "    logits = logits.float()"),
    ),
    _mutant(
        "top_k_drops_kth", "sample_next_token",
        "top-k mask with <= instead of <: the k-th most likely token is dropped too, k - 1 tokens remain.",
        ("logits.masked_fill(logits < kth,", "logits.masked_fill(logits <= kth,"),
    ),
    _mutant(
        "top_k_breaks_ties_by_index", "sample_next_token",
        "top-k keeps exactly k indices from torch.topk: of two tokens tied at the k-th logit one is dropped, "
        "chosen by position in the vocabulary, not by probability (the contract keeps ties, as nanoGPT and "
        "Hugging Face's TopKLogitsWarper do).",
        ("        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]\n"
         "        logits = logits.masked_fill(logits < kth, float(\"-inf\"))\n",
         "        top = torch.topk(logits, top_k).indices\n"
         "        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, top, True)\n"
         "        logits = logits.masked_fill(~keep, float(\"-inf\"))\n"),
    ),
    _mutant(
        "top_p_drops_crossing_token", "sample_next_token",
        "top-p keeps the tokens whose cumulative probability (including their own) is below p: the token that "
        "crosses p is dropped, so the kept set sums to less than p.",
        ("before = sorted_probs.cumsum(dim=-1) - sorted_probs", "before = sorted_probs.cumsum(dim=-1)"),
    ),
    _mutant(
        "top_p_before_temperature", "sample_next_token",
        "top-p computed on the distribution before temperature (and top-k): the nucleus is the wrong size for "
        "T != 1.",
        ("sorted_probs, order = torch.softmax(logits, dim=-1).sort(",
         "sorted_probs, order = torch.softmax(logits * temperature, dim=-1).sort("),
    ),
    _mutant(
        "global_random_state", "sample_next_token",
        "The generator argument is ignored: sampling uses torch's global random state, so a seeded generator "
        "does not make generation reproducible.",
        ("return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)",
         "return torch.multinomial(torch.softmax(logits, dim=-1), 1)"),
    ),
    # --- generate ---
    _mutant(
        "cache_not_reset_between_prompts", "generate",
        "Cache not reset between prompts: one cache is kept on the model and reused, so the second prompt is "
        "appended after the first one's tokens (wrong positions, then the context limit).",
        ("cache = model.new_cache(idx.shape[0]) if use_cache else None",
         "if use_cache and getattr(model, \"_kept_cache\", None) is None:\n"
         "                model._kept_cache = model.new_cache(idx.shape[0])\n"
         "            cache = model._kept_cache if use_cache else None"),
    ),
    _mutant(
        "whole_sequence_into_cache", "generate",
        "With the cache, the whole sequence is fed again at every step: the cache receives duplicates at "
        "wrong positions and the context limit is hit after a few tokens.",
        ("logits = model(token, cache)[:, -1] if use_cache", "logits = model(out, cache)[:, -1] if use_cache"),
    ),
    _mutant(
        "no_inference_mode", "generate",
        "Generating without no_grad/inference_mode: every step builds an autograd graph that keeps the "
        "activations alive, so memory grows with every token.",
        ("with torch.inference_mode():  # no autograd graph", "with torch.enable_grad():  # no autograd graph"),
    ),
    _mutant(
        "context_limit_off_by_one", "generate",
        "The context check uses >= instead of >: a prompt plus new tokens that fill the context exactly is "
        "refused.",
        ("if idx.shape[1] + max_new_tokens > max_len:", "if idx.shape[1] + max_new_tokens >= max_len:"),
    ),
    _mutant(
        "no_context_check", "generate",
        "No context check: generation runs until the model itself fails past max_len (after the prompt and "
        "several steps of work) instead of refusing up front.",
        ("if idx.shape[1] + max_new_tokens > max_len:", "if False:"),
    ),
    _mutant(
        "forward_after_last_token", "generate",
        "The model is run once more after the last new token, for logits nobody uses: wasted work (without the "
        "cache, the most expensive pass of all).",
        ("                if step + 1 == max_new_tokens:  # the last new token needs no forward pass\n"
         "                    break\n", ""),
    ),
    _mutant(
        "training_mode_not_restored", "generate",
        "The model is left in eval mode after generating: a training loop that samples text now and then "
        "silently trains without dropout.",
        ("        model.train(was_training)", "        model.eval()"),
    ),
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
]
