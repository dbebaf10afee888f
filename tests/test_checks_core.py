"""The helpers every checks module judges with (autograder/checks/core.py): each behaves as its callers rely on."""

from __future__ import annotations

import pytest
import torch

from autograder.checks import core


def test_rand_int_is_inclusive_and_draws_one_number_from_the_generator():
    gen = torch.Generator().manual_seed(0)
    drawn = {core.rand_int(gen, 2, 4) for _ in range(200)}
    assert drawn == {2, 3, 4}
    a, b = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    core.rand_int(a, 0, 10)
    torch.randint(0, 11, (1,), generator=b)  # the same draw as a one-element tensor: the seeds' cases do not move
    assert torch.equal(a.get_state(), b.get_state())


def test_same_takes_the_dtype_as_asked():
    x = torch.tensor([1.0, 2.0, float("nan")])
    assert core.same(x, x.clone())  # "equal": NaN matches NaN
    assert not core.same(x.double(), x)
    assert not core.same(x, x, dtype="cast")  # compared in the expected dtype, NaN is not equal
    ints = torch.tensor([1, 2, 3])
    assert core.same(ints, ints.float(), dtype="cast")
    assert not core.same(ints, ints.float(), dtype="kind")
    assert core.same(ints.double(), ints.float(), dtype="kind")
    assert not core.same([1.0, 2.0, 3.0], ints.float(), dtype="cast")
    assert not core.same(ints.float()[:2], ints.float(), dtype="cast")
    with pytest.raises(ValueError, match="dtype must be one of"):
        core.same(ints, ints, dtype="close")


def test_expect_names_the_first_known_mistake_the_output_is():
    expected = torch.arange(4.0)
    mistakes = [(expected.flip(0), "reversed"), (expected.flip(0), "also reversed"), (expected + 1, "shifted")]
    core.expect(expected.clone(), expected, "wrong", mistakes)  # the answer passes
    with pytest.raises(core.CheckFailed, match="^reversed$"):
        core.expect(expected.flip(0), expected, "wrong", mistakes)
    with pytest.raises(core.CheckFailed, match="^wrong"):
        core.expect(expected * 3, expected, "wrong", mistakes)


@pytest.mark.parametrize("word", [True, False])
def test_expect_value_error_needs_a_value_error_naming_the_argument(word):
    core.expect_value_error({"type": "ValueError", "message": "patch_size=3 does not divide 8"}, "8 by 3",
                            "patch_size", word=word)
    for error, said in ((None, "^8 by 3: your code returned a result; check for this first and raise a ValueError "
                               "naming patch_size$"),
                        ({"type": "TypeError", "message": "bad"}, "^8 by 3: the error must be a ValueError naming "
                                                                   "patch_size; your code raised TypeError: bad$"),
                        ({"type": "ValueError", "message": "bad size"}, "^8 by 3: your ValueError should name "
                                                                         "patch_size, so that the caller knows what "
                                                                         "to change; it said 'bad size'$")):
        with pytest.raises(core.CheckFailed, match=said):
            core.expect_value_error(error, "8 by 3", "patch_size", word=word)
    inside = {"type": "ValueError", "message": "patch_sizes must divide the image"}
    if word:
        with pytest.raises(core.CheckFailed, match="should name patch_size"):
            core.expect_value_error(inside, "8 by 3", "patch_size")
    else:
        core.expect_value_error(inside, "8 by 3", "patch_size", word=False)


def test_expect_value_error_takes_one_of_several_names_or_none():
    shapes = {"type": "ValueError", "message": "target of shape (2, 3) does not fit"}
    core.expect_value_error(shapes, "logits (2, 4, 5)", "logits", "target")
    with pytest.raises(core.CheckFailed, match="naming logits or target;"):
        core.expect_value_error({"type": "KeyError", "message": "0"}, "logits (2, 4, 5)", "logits", "target")
    with pytest.raises(core.CheckFailed, match="should name logits or target,"):
        core.expect_value_error({"type": "ValueError", "message": "bad"}, "logits (2, 4, 5)", "logits", "target")
    core.expect_value_error({"type": "ValueError", "message": "bad"}, "tgt is 1-D")  # no name asked: any ValueError
    with pytest.raises(core.CheckFailed, match="^tgt is 1-D: your code returned a result; check for this first and "
                                               "raise a ValueError$"):
        core.expect_value_error(None, "tgt is 1-D")
    with pytest.raises(core.CheckFailed, match="^tgt is 1-D: the error must be a ValueError; your code raised"):
        core.expect_value_error({"type": "IndexError", "message": "3"}, "tgt is 1-D")


def test_expect_value_error_marks_what_the_learners_code_wrote():
    """A hidden case's reason cuts the learner's exception out (core.hidden_reason): the helper says which text it is."""
    for error in ({"type": "MyError", "message": "x is (4, 7)"}, {"type": "ValueError", "message": "x is (4, 7)"}):
        with pytest.raises(core.CheckFailed) as err:
            core.expect_value_error(error, "seq_len is negative", "seq_len")
        assert err.value.learners and all(text in str(err.value) for text in err.value.learners)
        reason = core.hidden_reason("bad sizes", str(err.value), err.value.learners)
        assert "(4, 7)" not in reason and "x is" not in reason, reason
    with pytest.raises(core.CheckFailed) as err:
        core.expect_value_error(None, "seq_len is negative", "seq_len")
    assert err.value.learners == ()


def test_stacked_is_one_tensor_and_unstacked_gives_the_tensors_back():
    tensors = {"a": torch.randn(2, 3), "b": torch.randn(2, 3, dtype=torch.float64)}
    table = core.stacked(tensors, torch.float64)
    assert [type(v) for v in table.values()] == [list, torch.Tensor] and table["values"].shape == (2, 2, 3)
    back = core.unstacked(table)
    assert list(back) == ["a", "b"] and all(torch.equal(back[k], tensors[k].double()) for k in tensors)


def test_end_aligned_causal_mask_is_pytorchs_causal_lower_right():
    from torch.nn.attention.bias import causal_lower_right

    for seq_q in range(1, 7):
        for seq_k in range(1, 7):
            assert torch.equal(core.end_aligned_causal_mask(seq_q, seq_k),
                               causal_lower_right(seq_q, seq_k)._materialize()), (seq_q, seq_k)


WATCHED_IMPORTS = """
import sys
import torch
from autograder.checks import guard
from autograder.checks import positional as checks
from autograder.checks import attention, multihead, encoder_decoder, kv_cache  # chapter 5's imports torchvision
real, imported = guard.watched, []
def spy(function, args, *rest, **kw):
    before = set(sys.modules)
    try:
        return real(function, args, *rest, **kw)
    finally:
        imported.extend(sorted(set(sys.modules) - before))
guard.watched = spy
def apply_rope_complex(*args, **kwargs):
    raise NotImplementedError
try:
    checks.run("apply_rope_complex", apply_rope_complex)
except Exception:
    pass
print(",".join(imported))
print("torch._dynamo" in sys.modules)
"""


@pytest.mark.subprocess
def test_a_kernels_first_check_imports_nothing_of_pytorch_under_the_watch():
    """The guard's profile hook runs on every Python call: a module imported under it runs its whole body
    through the hook (``torch._dynamo``, which PyTorch imports on the first call of a function it wraps, made
    the first check of a kernel take 7 s idle, 30 s busy). In a fresh interpreter, as in a kernel, the first
    check of a chapter imports no PyTorch module (nor sympy, which ``torch._dynamo`` pulls in) while it watches,
    and the kernel never imports ``torch._dynamo`` at all (2 s idle, 6 s busy, in every kernel that checks), nor
    does importing the checks of chapters 1–4 and 6 (chapter 5's import torchvision, which imports it)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", WATCHED_IMPORTS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    watched, dynamo = done.stdout.rstrip("\n").split("\n")
    imported = [name for name in watched.split(",") if name]
    assert dynamo == "False", "the first check imported torch._dynamo"
    assert [name for name in imported if name.split(".")[0] in ("torch", "sympy")] == [], imported
    assert len(imported) < 20, imported
