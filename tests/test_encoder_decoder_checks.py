"""The chapter 4 checks: each stated ValueError rule is checked visibly, and known mistakes get their own hint."""

from __future__ import annotations

import pytest
import torch

from autograder.checks import core
from mutants import load_all

CHECKS = "autograder.checks.encoder_decoder"
MUTANTS = {m.name: m for m in load_all()["encoder_decoder_mutants"]}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one thread avoids OpenMP overhead on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _visible_hint(name: str) -> str:
    mutant = MUTANTS[name]
    with pytest.raises(core.CheckFailed) as err:
        core.run(CHECKS, mutant.exercise, mutant.obj, level="visible", seed=0, quiet=True)
    return str(err.value)


@pytest.mark.parametrize("name,rule", [
    ("teacher_forcing_no_checks", "tgt is not 2-D"),
    ("tf_no_right_padding_check", "a row is not right-padded"),
    ("noam_lr_no_checks", "step is negative"),
    ("noam_lr_step_check_only", "d_model is not a positive int (call the given _check_noam_args"),
    ("label_smoothing_no_checks", "epsilon is above 1"),
    ("ls_no_target_checks", "target holds floats, not class ids"),
])
def test_a_missing_argument_check_fails_the_visible_checks_and_the_hint_names_the_rule(name, rule):
    hint = _visible_hint(name)
    assert rule in hint and "ValueError" in hint, hint


@pytest.mark.parametrize("name,words", [
    ("ls_pad_column_excluded", "the padding column gets no smoothing"),
    ("ls_summed", "you summed the loss over the positions"),
])
def test_label_smoothing_mistakes_are_named(name, words):
    assert words in _visible_hint(name)
    mutant = MUTANTS[name]
    for seed in (1, 2, 3):  # the hidden level too: the named hint, not the generic "loss …, expected …"
        with pytest.raises(core.CheckFailed, match=words):
            core.run(CHECKS, mutant.exercise, mutant.obj, level="hidden", seed=seed, quiet=True)
