"""The chapter 4 checks: each stated rule is checked visibly (argument checks, dropout in training mode, PyTorch's
ignore_index=-100, one decoder call per step, the decoder reordered with its beams), and known mistakes get their
own hint, and no other."""

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
    ("scheduler_no_arg_checks", "d_model is not a positive int (call the given _check_noam_args"),
    ("label_smoothing_no_checks", "epsilon is above 1"),
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


@pytest.mark.parametrize("name,words", [
    ("decoder_dropout_after_residual", "dropout is applied after the residual add"),
    ("decoder_no_sublayer_dropout", "never calls self.dropout1"),
    ("decoder_dropout_on_input", "dropout is applied to the sub-layer's input"),
    ("ls_refuses_sentinel", "ignore_index=-100, PyTorch's default"),
    ("greedy_two_calls_per_step", "call it once per step"),
    ("beam_decoder_not_reordered", "decoder.reorder(rows)"),
    ("tf_trims_padding_columns", "you cut the columns that are padding in every row"),
    ("beam_length_without_eos", "the length in the penalty leaves out EOS"),
    ("beam_kept_in_beam", "finished hypotheses stay in the beam"),
    ("beam_top_k_only", "take the 2·beam_size best"),
    ("beam_k_finished", "once beam_size hypotheses had finished"),
])
def test_a_stated_rule_is_checked_visibly_and_its_hint_names_that_mistake(name, words):
    hint = _visible_hint(name)
    assert words in hint, hint
    assert "either of these" not in hint, hint


def test_each_beam_search_mistake_has_its_own_hint_on_the_visible_traps():
    """On the visible trap case, no two planted beam-search mistakes share a hint."""
    hints = {name: _visible_hint(name) for name in MUTANTS if MUTANTS[name].exercise == "beam_search_over"}
    assert len(set(hints.values())) == len(hints), hints
