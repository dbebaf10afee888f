"""Chapters 1 and 2: every "raise a ValueError when…" of an exercise's text is checked by the visible test, the same
way whatever the seed, so the notebook (seed 0), nbgrader's hidden cell (a fixed seed) and ``autograder grade``
(random seeds) agree on an answer that skips one of the rules."""

from __future__ import annotations

import re

import nbformat
import pytest
import torch

from autograder import registry
from autograder.checks import core
from mutants import load_all

CHAPTERS = registry.CHAPTERS[:2]
SEEDS = (0, 1, 2, 3, 101, 202, 303, 9_999_991)
# Answers that check some of their arguments and not others (or with Python's own error): each must fail the
# visible checks, at every seed, in the case of the rule it skips.
PARTIAL = {
    "causal_no_size_check": "sizes below 1 raise ValueError",
    "causal_unchecked": "seq_k < seq_q raises ValueError",
    "sdpa_mask_unchecked": "a float mask raises ValueError",
    "tiled_block_size_unchecked": "block_size that is not a positive int",
    "tiled_block_size_not_int_unchecked": "block_size that is not a positive int",
    "split_heads_unchecked": "d_model not divisible by n_heads raises ValueError",
    "split_heads_truncating": "d_model not divisible by n_heads raises ValueError",
    "split_heads_unpacks_shape": "x that is not 3-D raises ValueError",
    "merge_heads_unchecked": "x that is not 4-D raises ValueError",
    "merge_heads_unpacks_shape": "x that is not 4-D raises ValueError",
    "count_unchecked_n_heads": "d_model not divisible by n_heads raises ValueError",
    "count_unchecked_kv_heads": "n_kv_heads that does not divide n_heads raises ValueError",
    "repeat_kv_heads_unchecked": "n_heads not a multiple of the K/V heads raises ValueError",
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _exercise_texts(chapter) -> dict[str, str]:
    """Exercise name -> the text that asks for it: the nearest markdown cell above its solution cell, from its
    "Exercise" heading on."""
    texts, markdown = {}, ""
    for cell in nbformat.read(chapter.source_path(), as_version=4).cells:
        if cell.cell_type == "markdown":
            markdown = cell.source
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        if cell.metadata.get("nbgrader", {}).get("solution") and grade_id.endswith("_solution"):
            texts[grade_id.removesuffix("_solution")] = markdown[markdown.rfind("Exercise"):]
    return texts


def _rules(case: core.Case, seed: int) -> list:
    """What a bad-argument case asks at ``seed``: its calls (tensors by shape) and the argument each must name."""
    inputs = case.inputs(torch.Generator().manual_seed(seed))
    calls = [(tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args), kwargs)
             for args, kwargs in inputs["calls"]]
    return calls + inputs.get("rules", [])


def test_value_error_rules_of_the_text_are_visible_cases_with_every_rule_at_every_seed():
    stated = 0
    for chapter in CHAPTERS:
        checks, texts = chapter.load_checks(), _exercise_texts(chapter)
        assert set(texts) == {e.name for e in chapter.exercises}
        for name, text in texts.items():
            bad = [c for c in checks[name].cases("hidden") if "ValueError" in c.name]
            if not re.search(r"\bValueError\b", text):
                continue
            stated += len(re.findall(r"\bValueError\b", text))
            assert any("ValueError" in c.name for c in checks[name].visible), f"{name}: no visible ValueError case"
            for case in bad:  # every rule a case lists is tried in turn (call_each), the same ones whatever the seed
                assert case.probe == "call_each", f"{name}: {case.name!r} tries one call"
                assert all(_rules(case, seed) == _rules(case, 0) for seed in SEEDS), f"{name}: {case.name!r}"
    assert stated >= 7


@pytest.mark.parametrize("name", sorted(PARTIAL))
def test_value_error_rules_a_partial_check_fails_the_visible_test_at_every_seed(name):
    found = {m.name: (module, m) for module, mutants in load_all().items() for m in mutants}
    module, mutant = found[name]
    checks = "autograder.checks." + module.removesuffix("_mutants")
    for seed in SEEDS:
        with pytest.raises(core.CheckFailed) as err:
            core.run(checks, mutant.exercise, mutant.obj, level="visible", seed=seed, quiet=True)
        assert str(err.value).startswith(f"{mutant.exercise}: {PARTIAL[name]}"), str(err.value)
