"""A student edition withholding chapters 3 and 4 holds no code that computes their answers.

The checks compute each answer, and each known mistake one edit away from an answer, in functions of the case
inputs marked ``@core.recorded``; ``autograder publish`` replays their recorded results and empties their bodies,
and the helpers only they called go with them. (tests/test_publish.py checks that the edition's visible verdicts
equal this repository's.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from autograder import publish

ROOT = Path(__file__).resolve().parent.parent
CHECKS_DIR = ROOT / "autograder" / "checks"
MODULES = ("positional", "encoder_decoder")
# Helpers whose code is an answer of chapter 3 or 4, or a known mistake one edit away from one.
ANSWER_HELPERS = {
    "positional": {"_sinusoid_variant", "_rope_variant", "_naive_slopes"},
    "encoder_decoder": {"_tf_expected", "_noam", "_ls_variant", "_greedy_by_hand", "_beam_by_hand", "_beam_row",
                        "_beam_row_kept_in_beam", "_exhaustive_best", "_decoder_by_hand"},
}
# Calls that compute those answers: the formulas' functions and the library's own (log_softmax stays: beam search
# scores the learner's own rows with it).
ANSWER_CALLS = {"sin", "cos", "polar", "cross_entropy", "one_hot", "TransformerDecoderLayer",
                "sinusoidal_encoding", "rope_angles", "apply_rope", "alibi_slopes", "alibi_bias", "teacher_forcing"}


def _edition_source(module: str) -> str:
    """The checks module as `autograder publish` writes it when its chapter's answers are withheld."""
    imported = {alias.name for path in CHECKS_DIR.glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ImportFrom) for alias in node.names}
    source = publish.strip_hidden((CHECKS_DIR / f"{module}.py").read_text(), imported)
    return publish.strip_hidden(publish.empty_recorded(source), imported)


def _called_names(node: ast.AST) -> set[str]:
    return {getattr(call.func, "attr", getattr(call.func, "id", "")) for call in ast.walk(node)
            if isinstance(call, ast.Call)}


@pytest.mark.parametrize("module", MODULES)
def test_the_helpers_computing_answers_are_used_only_by_recorded_functions(module):
    here = {node.name for node in ast.parse((CHECKS_DIR / f"{module}.py").read_text()).body
            if isinstance(node, ast.FunctionDef)}
    assert here & ANSWER_HELPERS[module], "the repository's checks compute the answers with these helpers"
    edition = ast.parse(_edition_source(module))
    left = {node.name for node in edition.body if isinstance(node, ast.FunctionDef)}
    assert not left & ANSWER_HELPERS[module], sorted(left & ANSWER_HELPERS[module])


@pytest.mark.parametrize("module", MODULES)
def test_no_function_left_in_the_edition_computes_an_answer(module):
    edition = ast.parse(_edition_source(module))
    recorded = [node for node in edition.body if publish._is_recorded(node)]
    assert recorded, f"{module}: no @core.recorded function: nothing would be replayed"
    for node in recorded:  # emptied: the body is one raise (after the docstring)
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        assert len(body) == 1 and isinstance(body[0], ast.Raise), node.name
    for node in edition.body:
        if isinstance(node, ast.FunctionDef) and not publish._is_recorded(node):
            assert not _called_names(node) & ANSWER_CALLS, (node.name, sorted(_called_names(node) & ANSWER_CALLS))
