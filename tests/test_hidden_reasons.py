"""A hidden case's inputs never reach the learner's feedback, whatever the learner's code writes.

A learner's function that passes the visible cases and, on a hidden one, raises with the inputs in its message
(their shape, dtype, values) must get a reason that names the case and the mistake and quotes nothing of it: the
text its code wrote is cut out, an exception is named only by a built-in class name, and every number is `…`.
"""

from __future__ import annotations

import re

import torch

from autograder.checks import core
from autograder import registry

SEEDS = [11, 12, 13]


def _leaky_softmax(visible_shapes: set[tuple[int, ...]]):
    def softmax(x, dim=-1):
        if tuple(x.shape) not in visible_shapes:
            raise ValueError(f"LEAK shape={tuple(x.shape)} dtype={x.dtype} first={x.flatten()[:3].tolist()} dim={dim}")
        shifted = x - x.amax(dim=dim, keepdim=True)
        return shifted.exp() / shifted.exp().sum(dim=dim, keepdim=True)

    return softmax


def test_a_hidden_case_reason_quotes_nothing_the_learners_code_wrote():
    ch1 = registry.get("01_attention_by_hand")
    check = ch1.load_checks()["softmax"]
    seen: set[tuple[int, ...]] = set()

    def recorder(x, dim=-1):  # the shapes of the visible cases, as a learner's code could learn them
        seen.add(tuple(x.shape))
        return torch.softmax(x, dim)

    assert core.judge_check(check, core.local_probe(recorder, ()), lambda case: SEEDS, level="visible").passed
    verdict = core.judge_check(check, core.local_probe(_leaky_softmax(seen), ()), lambda case: SEEDS, level="hidden")
    assert not verdict.passed
    assert "(a hidden case)" in verdict.reason, verdict.reason
    assert "LEAK" not in verdict.reason and "shape=" not in verdict.reason, verdict.reason
    assert not re.search(r"\d", verdict.reason.split("(a hidden case)", 1)[1]), verdict.reason
    assert "ValueError" in verdict.reason or "an exception" in verdict.reason, verdict.reason


def test_hidden_reason_cuts_the_learners_text_and_every_number():
    learner = "KeyError: 'secret (3, 7) float64 1.25'"
    reason = core.hidden_reason("rows of a matrix", f"your code raised {learner} at step 4", [learner])
    assert reason == "rows of a matrix (a hidden case): your code raised KeyError at step …"
    custom = "MyError: the input was 4096 long"
    reason = core.hidden_reason("long rows", f"your code raised {custom}", [custom])
    assert "MyError" not in reason and "4096" not in reason and "an exception" in reason
