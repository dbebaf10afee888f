"""The chapter 6 checks: their toy model and references are right, the reference answers pass on many seeds, and a
known mistake gets its own hint (and no other's)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autograder.checks import core, kv_cache
from autograder.checks.toy_lm import ToyCache, ToyLM
from solutions import gpt


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one thread avoids OpenMP overhead on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def toy(seed: int = 0, vocab: int = 9, max_len: int = 30) -> ToyLM:
    g = torch.Generator().manual_seed(seed)
    return ToyLM(torch.randn(vocab, 5, generator=g), torch.randn(max_len, 5, generator=g),
                  torch.randn(5, vocab, generator=g))


def _mutant(name: str):
    from mutants import load_all

    return next(m for m in load_all()["kv_cache_mutants"] if m.name == name).obj


# --- the toy language model -----------------------------------------------------------------------------------


@pytest.mark.parametrize("chunks", [(12,), (1,) * 12, (5, 1, 1, 3, 2)])
def test_toy_model_cache_equals_recompute(chunks: tuple[int, ...]) -> None:
    model = toy()
    idx = torch.randint(0, 9, (2, 12), generator=torch.Generator().manual_seed(1))
    cache, parts, start = model.new_cache(2), [], 0
    for size in chunks:
        parts.append(model(idx[:, start : start + size], cache))
        start += size
    torch.testing.assert_close(torch.cat(parts, dim=1), model(idx), rtol=1e-12, atol=1e-12)
    assert len(cache) == 12 and torch.equal(cache.tokens, idx)
    assert [[call["start"], call["idx"].shape[1]] for call in model.calls[:-1]] == [
        [sum(chunks[:i]), n] for i, n in enumerate(chunks)]


def test_toy_model_left_padding_with_positions_and_mask_equals_the_prompt_alone() -> None:
    """What generate_batch relies on, in the toy: padded rows give the logits of the prompt alone, bit for bit,
    and positions counted from the padding do not."""
    model = toy(2)
    prompt = torch.randint(0, 9, (1, 5), generator=torch.Generator().manual_seed(2))
    padded = torch.cat((torch.zeros(1, 3, dtype=torch.long), prompt), dim=1)
    padding = torch.tensor([[False] * 3 + [True] * 5])
    with torch.no_grad():
        alone = model(prompt)
        right = model(padded, positions=(padding.cumsum(-1) - 1).clamp(min=0), padding=padding)[:, 3:]
        from_padding = model(padded, padding=padding)[:, 3:]
        unmasked = model(padded, positions=(padding.cumsum(-1) - 1).clamp(min=0))[:, 3:]
    assert torch.equal(right, alone)
    assert not torch.allclose(from_padding, alone) and not torch.allclose(unmasked, alone)


def test_toy_cache_truncate_and_retain() -> None:
    model = toy(3)
    idx = torch.randint(0, 9, (3, 10), generator=torch.Generator().manual_seed(3))
    cache = model.new_cache(3)
    model(idx, cache)
    cache.truncate(6)
    cache.retain([2, 0])
    with torch.no_grad():
        torch.testing.assert_close(model(idx[[2, 0], 6:], cache), model(idx[[2, 0]])[:, 6:], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="length"):
        ToyCache(1, 5).truncate(1)


def test_toy_model_refuses_past_max_len_and_empty_calls_and_fails_on_purpose() -> None:
    model = toy()
    with pytest.raises(ValueError, match="max_len=30"):
        model(torch.zeros(1, 31, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one"):
        model(torch.zeros(1, 0, dtype=torch.long))
    failing = ToyLM(model.tokens.detach(), model.positions.detach(), model.out.detach(), fail_at=2)
    failing(torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(RuntimeError, match="on purpose"):
        failing(torch.zeros(1, 2, dtype=torch.long))


def test_generate_batch_and_speculative_agree_with_the_library_on_the_toy() -> None:
    """The checks hand these toys to the learner's code: the library's own answers work on them."""
    target, draft = toy(4), toy(5)
    prompts = [torch.randint(0, 9, (n,), generator=torch.Generator().manual_seed(n)) for n in (2, 6, 4)]
    for prompt, out in zip(prompts, gpt.generate_batch(target, prompts, 10, temperature=0)):
        assert torch.equal(out, gpt.generate(target, prompt[None], 10, temperature=0)[0])
    idx, before = prompts[1][None], len(target.calls)
    tokens, stats = gpt.speculative_generate(target, draft, idx, 12, lookahead=3, temperature=0)
    assert stats["target_calls"] == len(target.calls) - before
    assert torch.equal(tokens, gpt.generate(target, idx, 12, temperature=0))


# --- the references pass, whatever the seed -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["kv_cache_bytes", "decode_tokens_per_second", "PagedKVCache", "generate_batch"])
def test_reference_passes_hidden_checks_on_many_seeds(name: str) -> None:
    check = kv_cache.CHECKS[name]
    verdict = core.judge_check(check, core.local_probe(getattr(gpt, name)), lambda case: range(100, 110),
                               level="hidden")
    assert verdict.passed, verdict.reason


def test_speculative_statistical_check_tolerates_the_reference_on_many_seeds() -> None:
    """The sampling case is statistical: the reference must pass it whatever the seed (the grader draws fresh ones)."""
    check = kv_cache.CHECKS["speculative_generate"]
    sampling = [case for case in check.visible + check.hidden if "sampling" in case.name]
    assert len(sampling) == 2
    one = dataclasses.replace(check, visible=tuple(sampling), hidden=())
    verdict = core.judge_check(one, core.local_probe(gpt.speculative_generate), lambda case: range(200, 204))
    assert verdict.passed, verdict.reason


def test_sampling_pair_sets_the_mistakes_apart() -> None:
    """The sampling case's target and draft are built so that the right first-token distribution and each known
    mistake's are far apart: a mistake cannot pass, and its draws fit its own distribution best."""
    for seed in range(5):
        pair = kv_cache._sampling_pair(seed, 3, {"temperature": 1.0})
        found = core.unstacked(kv_cache._first_token_distributions(pair["target"], pair["draft"], pair["idx"],
                                                                    {"temperature": 1.0}))
        with torch.no_grad():
            p = gpt.next_token_probs(kv_cache._toy(pair["target"])(pair["idx"])[:, -1])[0].double()
        torch.testing.assert_close(found["right"], p)  # one right round gives the target's distribution
        for mistake in kv_cache._MISTAKE:
            assert (found["right"] - found[mistake]).abs().max() >= kv_cache._DETECT


# --- hints: each mistake its own ------------------------------------------------------------------------------------

SPECULATIVE_HINTS = {
    "spec_resample_from_target": "draw it from the residual",
    "spec_drafts_never_rejected": "is the draft's choice where the target chooses another",
    "spec_ratio_inverted": "is the draft's choice where the target chooses another",
    "spec_target_cache_not_rolled_back": "the target's cache still held a rejected draft token",
    "spec_draft_cache_not_rolled_back": "the draft's cache still held a rejected draft token",
    "spec_verified_token_by_token": "in ONE target pass",
    "spec_mode_restored_only_on_success": "restore it in a finally: block",
    "spec_global_random_state": "the same generator seed gave different tokens",
}


@pytest.mark.parametrize("name", SPECULATIVE_HINTS)
def test_speculative_mistakes_each_get_their_own_hint(name: str) -> None:
    check = kv_cache.CHECKS["speculative_generate"]
    for seed in (0, 1):
        verdict = core.judge_check(check, core.local_probe(_mutant(name)), lambda case: [seed])
        assert not verdict.passed
        assert SPECULATIVE_HINTS[name] in verdict.reason, (seed, verdict.reason)
        others = [hint for hint in SPECULATIVE_HINTS.values() if hint != SPECULATIVE_HINTS[name]]
        assert not any(hint in verdict.reason for hint in others), (seed, verdict.reason)


def test_speculative_sampling_hint_names_inverted_acceptance_when_only_sampling_shows_it() -> None:
    """p/q inverted, seen in the sampled runs alone (greedy left out): the likelihood picks it, not the others."""
    check = kv_cache.CHECKS["speculative_generate"]
    sampling = tuple(case for case in check.visible if "sampling" in case.name)
    one = dataclasses.replace(check, visible=sampling, hidden=())
    for seed in (0, 3):
        verdict = core.judge_check(one, core.local_probe(_mutant("spec_ratio_inverted")), lambda case: [seed])
        assert not verdict.passed and "kept too often" in verdict.reason, verdict.reason


BATCH_HINTS = {
    "batch_positions_from_padding": "positions are counted from the padding",
    "batch_right_padding": "padded on the right",
    "batch_padding_not_masked": "pass padding=",
    "batch_stops_at_first_eos": "stops at its OWN eos_id",
    "batch_eos_ignored": "went on after its eos_id",
    "batch_positions_not_advanced": "new token is at position",
    "batch_rows_not_followed": "credited to the wrong prompts",
    "batch_mode_restored_only_on_success": "restore it in a finally: block",
    "batch_with_autograd": "autograd on",
    "batch_no_context_check": "BEFORE generating",
    "batch_sampling_ignores_top_k": "is not among the top_k=",
}


@pytest.mark.parametrize("name", BATCH_HINTS)
def test_generate_batch_mistakes_each_get_their_own_hint(name: str) -> None:
    check = kv_cache.CHECKS["generate_batch"]
    verdict = core.judge_check(check, core.local_probe(_mutant(name)), lambda case: [0])
    assert not verdict.passed
    assert BATCH_HINTS[name] in verdict.reason, verdict.reason
    assert not any(hint in verdict.reason for other, hint in BATCH_HINTS.items() if other != name), verdict.reason


PAGED_HINTS = {
    "paged_logical_block_as_physical": "the logical block index p // block_size is not a block id",
    "paged_blocks_gathered_in_id_order": "in the order of its block table",
    "paged_truncate_frees_partial_block": "partly filled but still in use",
    "paged_retain_frees_kept_rows": "freed while in use",
    "paged_retain_never_frees": "is neither in a row's table nor in free_blocks",
    "paged_truncate_keeps_blocks": "give the blocks past",
    "paged_blocks_taken_per_layer": "never once per layer",
    "paged_returns_whole_blocks": "write returns whole blocks",
    "paged_pool_copied": "the pools were replaced",
    "paged_no_pool_check": "the error must be a ValueError naming n_blocks",
}


@pytest.mark.parametrize("name", PAGED_HINTS)
def test_paged_cache_mistakes_each_get_their_own_hint(name: str) -> None:
    check = kv_cache.CHECKS["PagedKVCache"]
    verdict = core.judge_check(check, core.local_probe(_mutant(name)), lambda case: [0])
    assert not verdict.passed
    assert PAGED_HINTS[name] in verdict.reason, verdict.reason
    assert not any(hint in verdict.reason for other, hint in PAGED_HINTS.items() if other != name), verdict.reason


def test_roofline_hints_name_each_mistake() -> None:
    """Every mistake of the roofline gives a distinct number on the visible cases, and its hint names it."""
    hints = {"roofline_weights_per_sequence": "shared by the whole batch", "roofline_without_cache": "also reads every",
             "roofline_cache_of_one_sequence": "pass batch to kv_cache_bytes", "roofline_sum_not_max": "not their sum",
             "roofline_flops_of_one_sequence": "multiply the FLOPs by batch",
             "roofline_one_flop_per_parameter": "2 FLOPs, not 1", "roofline_weights_in_float32": "stored in dtype",
             "roofline_returns_seconds": "the duration of one step", "roofline_per_sequence": "for one sequence"}
    check = kv_cache.CHECKS["decode_tokens_per_second"]
    for name, hint in hints.items():
        verdict = core.judge_check(check, core.local_probe(_mutant(name)), lambda case: [0])
        assert not verdict.passed and hint in verdict.reason, (name, verdict.reason)


def test_roofline_visible_cases_name_every_dtype_and_both_regimes() -> None:
    """Every dtype the statement names is a visible case, and the visible batches reach both sides of the ridge."""
    check = kv_cache.CHECKS["decode_tokens_per_second"]
    calls = [call for case in check.visible for call in case.inputs(torch.Generator().manual_seed(0))["calls"]]
    assert {kwargs["dtype"] for _, kwargs in calls} == set(kv_cache.DTYPES)
    regimes = set()
    for args, kwargs in calls:
        params, layers, kv_heads, d_head, context, batch = args
        dtype = getattr(torch, kwargs["dtype"])
        memory = (params * dtype.itemsize + gpt.kv_cache_bytes(layers, kv_heads, d_head, context, batch, dtype)) / \
            kwargs["bandwidth"]
        regimes.add(memory >= 2 * params * batch / kwargs["peak_flops"])
    assert regimes == {True, False}
    bytes_calls = [call for case in kv_cache.CHECKS["kv_cache_bytes"].visible
                   for call in case.inputs(torch.Generator().manual_seed(0))["calls"]]
    assert set(kv_cache.DTYPES) <= {kwargs.get("dtype", "float32") for _, kwargs in bytes_calls}


def test_check_bytes_names_query_heads_used_for_kv_heads() -> None:
    """n_heads where n_kv_heads belongs: 8x too large for LLaMA-2-70B, 4x for Mistral-7B, and the hint says why."""
    mutant = _mutant("bytes_query_heads_for_kv_heads")
    verdict = core.judge_check(kv_cache.CHECKS["kv_cache_bytes"], core.local_probe(mutant), lambda case: [0])
    assert not verdict.passed
    assert "8× too large" in verdict.reason and "n_kv_heads" in verdict.reason, verdict.reason
    right = 2 * 32 * 8 * 128 * 4096 * 2
    about = {"model": "Mistral-7B", "heads": 32}
    with pytest.raises(core.CheckFailed, match="4× too large.*n_kv_heads"):
        kv_cache._judge_bytes_call((32, 8, 128, 4096), {"dtype": "bfloat16"}, about, {"error": None, "out": 4 * right})
    kv_cache._judge_bytes_call((32, 8, 128, 4096), {"dtype": "bfloat16"}, about, {"error": None, "out": right})


# --- what a shared run of the chapter-6 notebook should show (called by the session fixtures' tests) -------------

# Cells of 06_kv_cache_inference that run an exercise's code, and the exercise they name while it is not done.
WAITING_CELLS = {"c042": "1", "c108": "2", "c110": "2", "c124": "3", "c134": "4", "c136": "3 and 4", "c146": "5"}
# Cells that work in an untouched release: the model, its training, sampling, the measurements, the labs.
WORKING_CELLS = ("c022", "c034", "c046", "c047", "c101", "c103", "c127", "c141", "c151", "c065", "c066")


def _stream(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def untouched_release_problems(nb) -> list[str]:
    """For the executed release of chapter 6, exercises untouched: what is wrong (empty when all is well). Each
    graded test cell says "not done yet" (its only error); each cell of WAITING_CELLS prints one line naming its
    exercise and raises nothing; the cells of WORKING_CELLS print their results; nothing else raises."""
    problems, cells = [], {c.get("id"): c for c in nb.cells if c.cell_type == "code"}
    for cid, cell in cells.items():
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        graded = cell.get("metadata", {}).get("nbgrader", {}).get("grade")
        if graded:
            if not errors or "not done yet" not in errors[0].get("evalue", ""):
                problems.append(f"{cid}: a test cell of an untouched exercise must say 'not done yet'")
        elif errors:
            problems.append(f"{cid}: raised {errors[0].get('ename')}: {errors[0].get('evalue', '')[:200]}")
    for cid, exercise in WAITING_CELLS.items():
        if f"(after exercise {exercise} (" not in _stream(cells[cid]):
            problems.append(f"{cid}: should print one line naming exercise {exercise}")
    for cid in WORKING_CELLS:
        text = _stream(cells[cid])
        if not text.strip() or "(after exercise" in text:
            problems.append(f"{cid}: should print its results without any exercise done")
    return problems


def solved_source_problems(nb) -> list[str]:
    """For the executed source notebook of chapter 6 (answers in; quick or full run): what is wrong. Every test cell
    passes its visible and hidden checks, no cell waits for an exercise or raises, and the proofs hold."""
    problems, cells = [], {c.get("id"): c for c in nb.cells if c.cell_type == "code"}
    for cid, cell in cells.items():
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            problems.append(f"{cid}: raised {errors[0].get('ename')}: {errors[0].get('evalue', '')[:200]}")
        if "(after exercise" in _stream(cell):
            problems.append(f"{cid}: still waits for an exercise")
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade") and _stream(cell).count("✓") != 2:
            problems.append(f"{cid}: the visible and the hidden checks should both pass")
    expected = {"c022": "largest logit difference", "c034": "6 of 6 models",
                "c124": "logits identical, bit for bit: True", "c127": "recomputing with the window mask: True",
                "c134": "8 of 8 identical", "c146": "the target's own tokens with either draft: True"}
    for cid, needle in expected.items():
        if needle not in _stream(cells[cid]):
            problems.append(f"{cid}: should print {needle!r}")
    if "identical with both caches: True" not in _stream(cells["c124"]):
        problems.append("c124: greedy generation should be identical with the paged cache")
    return problems


@pytest.mark.parametrize("cid", sorted(WAITING_CELLS) + list(WORKING_CELLS))
def test_notebook_cells_named_here_exist(cid: str) -> None:
    """The cell ids the two functions above look for are in both the source notebook and its release."""
    import nbformat

    from autograder import registry

    chapter = registry.get("06_kv_cache_inference")
    for path in (chapter.source_path(), chapter.release_path()):
        assert cid in {c.get("id") for c in nbformat.read(path, as_version=4).cells}, (path, cid)
