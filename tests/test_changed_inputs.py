"""A function that changes its inputs fails its check with a hint: their values, and their autograd state
(requires_grad switched on, a gradient left in .grad), which the wire now carries from the learner's kernel."""

from __future__ import annotations

import pytest
import torch

from autograder import wire
from autograder.checks import core
from mutants import load_all

MUTANTS = {m.name: m for found in load_all().values() for m in found}


def _inputs() -> dict:
    return {"args": (torch.randn(2, 3), torch.randn(3, 4)), "kwargs": {"scaled": True}}


def test_changed_inputs_reports_requires_grad_and_grad_of_an_input():
    before = _inputs()
    flagged = wire.decode_value(wire.encode_value(before))
    flagged["args"][1].requires_grad_(True)
    assert core.changed_inputs(before, flagged) == ["args[1].requires_grad"]
    graded = wire.decode_value(wire.encode_value(before))
    graded["args"][1].grad = torch.ones(3, 4)
    assert core.changed_inputs(before, graded) == ["args[1].grad"]
    both = wire.decode_value(wire.encode_value(flagged))
    both["args"][1].grad = torch.ones(3, 4)
    assert core.changed_inputs(before, both) == ["args[1].requires_grad", "args[1].grad"]
    moved = wire.decode_value(wire.encode_value(before))
    moved["args"][0].mul_(2)
    assert core.changed_inputs(before, moved) == ["args[0]"]
    assert core.changed_inputs(before, wire.decode_value(wire.encode_value(before))) == []


def test_changed_inputs_hints_name_the_argument_and_the_way_out():
    assert "changed its input (argument 1) in place" in core.changed_message(["args[0]", "args[1].grad"])
    flag = core.changed_message(["args[1].requires_grad", "args[1].grad"])
    assert "requires_grad of its input (argument 2)" in flag and "w.detach().requires_grad_(True)" in flag
    grad = core.changed_message(["kwargs['w_q'].grad"])
    assert "left a gradient in .grad of its input (argument `w_q`)" in grad and "torch.autograd.grad" in grad


def test_wire_carries_requires_grad_and_grad_of_a_leaf_only():
    leaf = torch.randn(3, 4, dtype=torch.float64).requires_grad_(True)
    leaf.grad = torch.randn(3, 4, dtype=torch.float64)
    back = wire.decode_value(wire.encode_value([leaf, leaf * 2, torch.randn(2)]))
    assert back[0].requires_grad and torch.equal(back[0].grad, leaf.grad) and torch.equal(back[0].detach(), leaf.detach())
    assert not back[1].requires_grad and back[1].grad is None  # a computed output stays a plain tensor
    assert not back[2].requires_grad and back[2].grad is None


@pytest.mark.parametrize("sent", [
    '{"__tensor__": "int64", "shape": [1], "data": "AQAAAAAAAAA=", "requires_grad": true}',
    '{"__tensor__": "float32", "shape": [1], "data": "AACAPw==", "grad": {"__tensor__": "float32", "shape": [2], '
    '"data": "AACAPwAAgD8="}}',
    '{"__tensor__": "float32", "shape": [1], "data": "AACAPw==", "grad": 3}',
])
def test_wire_refuses_a_gradient_that_does_not_fit(sent):
    with pytest.raises(wire.ProtocolError):
        wire.decode_value(sent)


@pytest.mark.parametrize("name,hint", [
    ("grad_requires_grad_on_callers_w_q", "switched on requires_grad of its input (argument 2)"),
    ("grad_backward_into_callers_w_q", "switched on requires_grad of its input (argument 2)"),
])
def test_query_gradient_norm_that_touches_the_callers_w_q_fails_with_the_hint(name, hint):
    """The exercise asks for a copy "without touching the caller's tensor": the right number is not enough."""
    mutant = MUTANTS[name]
    for level in ("visible", "hidden"):
        with pytest.raises(core.CheckFailed) as err:
            core.run("autograder.checks.multihead", mutant.exercise, mutant.obj, level=level, seed=0, quiet=True)
        assert hint in str(err.value), str(err.value)


def test_query_gradient_norm_that_leaves_only_a_gradient_fails_with_the_hint():
    import math

    def backward_then_reset(x, w_q, w_k, w_v, target, *, scaled=True):
        w_q.requires_grad_(True)
        scores = (x @ w_q) @ (x @ w_k).transpose(-2, -1) / (math.sqrt(w_q.shape[-1]) if scaled else 1.0)
        ((scores.softmax(-1) @ (x @ w_v) - target) ** 2).mean().backward()
        w_q.requires_grad_(False)  # the flag is put back, the gradient stays
        return w_q.grad.norm().item()

    with pytest.raises(core.CheckFailed) as err:
        core.run("autograder.checks.multihead", "query_gradient_norm", backward_then_reset, quiet=True)
    assert "left a gradient in .grad of its input (argument 2)" in str(err.value), str(err.value)
