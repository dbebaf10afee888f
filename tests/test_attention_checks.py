"""The chapter 1 and 2 checks: a known mistake gets the hint that names it (visible checks, as in the notebook)."""

from __future__ import annotations

import pytest
import torch

from autograder.checks import core
from mutants import load_all

MUTANTS = {m.name: m for found in load_all().values() for m in found}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _visible_hint(checks: str, name: str) -> str:
    mutant = MUTANTS[name]
    with pytest.raises(core.CheckFailed) as err:
        core.run(checks, mutant.exercise, mutant.obj, level="visible", seed=0, quiet=True)
    return str(err.value)


@pytest.mark.parametrize("name", ["sdpa_inverted_mask", "sdpa_inverted_mask_rows_zeroed"])
def test_check_sdpa_names_inverted_polarity_whatever_the_fill_and_the_zeroing(name):
    """masked_fill(mask, finfo.min) with the rows of mask.any() zeroed used to be told '-1e4 is not enough'."""
    hint = _visible_hint("autograder.checks.attention", name)
    assert "wrong polarity" in hint and "-1e4" not in hint, hint


def test_check_sdpa_still_names_a_fill_that_is_not_negative_enough():
    hint = _visible_hint("autograder.checks.attention", "sdpa_fill_minus_1e4")
    assert "-1e4 is not enough" in hint and "polarity" not in hint, hint


def test_check_mha_names_a_module_that_ignores_context():
    """A module written for self-attention only attends over x: the hint says so before any padded case, where
    the mask no longer fits its scores."""
    hint = _visible_hint("autograder.checks.multihead", "mha_no_cross_attention")
    assert hint.startswith("MultiHeadAttention: cross-attention to a longer context: your module ignores context"), hint
    assert "does not broadcast" not in hint


def test_check_mha_cross_attention_case_without_a_mask_comes_before_the_padded_one():
    from autograder.checks import multihead

    names = [case.name for case in multihead.CHECKS["MultiHeadAttention"].visible]
    assert names.index("cross-attention to a longer context") < names.index(
        "cross-attention to a longer context, with a key padding mask")
