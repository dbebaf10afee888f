"""The chapter 3 checks: every stated ValueError rule is tried whatever the seed, and named in the hint."""

from __future__ import annotations

import random

import pytest
import torch

from autograder.checks import core
from mutants import load_all

CHECKS = "autograder.checks.positional"
MUTANTS = {m.name: m for m in load_all()["positional_mutants"]}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one thread avoids OpenMP overhead on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name,rule", [
    ("rope_no_4d_check", "(x is not 4-D)"),
    ("rope_start_pos_sign_only", "(start_pos is not an int)"),
    ("learned_no_start_pos_check", "(start_pos is negative)"),
    ("learned_dim_check_only", "(x is not (batch, seq, d_model))"),
    ("bias_no_seq_k_check", "(seq_k is below 1)"),
    ("sinusoid_no_d_model_check", "(d_model is below 1)"),
    ("sinusoid_sign_check_only", "(seq_len is not an int)"),
    ("slopes_sign_check_only", "(n_heads is not an int)"),
])
def test_a_partial_validator_fails_the_visible_checks_and_every_grading_seed(name, rule):
    """The notebook (seed 0), nbgrader's hidden cell and the batch grader's random seeds give one verdict."""
    mutant = MUTANTS[name]
    with pytest.raises(core.CheckFailed) as err:
        core.run(CHECKS, mutant.exercise, mutant.obj, level="visible", seed=0, quiet=True)
    assert rule in str(err.value) and "ValueError" in str(err.value), str(err.value)
    for seed in random.Random(name).sample(range(1_000_000), 30):
        with pytest.raises(core.CheckFailed, match="ValueError"):
            core.run(CHECKS, mutant.exercise, mutant.obj, level="hidden", seed=seed, quiet=True)
