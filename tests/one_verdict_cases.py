"""The one-verdict submissions: chapter releases with the source's answers, some exercises replaced by a delegating
answer (it calls the PyTorch function or the library code the exercise asks for) or by one that changes its inputs
in place. Graded three ways (the notebook's own test cells, ``nbgrader autograde``, ``autograder grade``) by the
session's shared runs (conftest.py); ``tests/test_one_verdict.py`` compares them.
"""

from __future__ import annotations

import nbformat
from redteam import build as redteam
from support import SOURCE

from autograder import registry

CH1, CH2, CH3 = (c.id for c in registry.CHAPTERS[:3])

IN_PLACE_SCORES = '''
def attention_scores(q, k):
    """q @ kᵀ / √d_k, scaling q in place to save memory: the caller's q changes too."""
    q.mul_(1.0 / math.sqrt(q.shape[-1]))
    return einsum(q, k, "... seq_q d_head, ... seq_k d_head -> ... seq_q seq_k")
'''
DELEGATING_SOFTMAX = '''
def softmax(x, dim=-1):
    return torch.log_softmax(x, dim).exp()
'''
DELEGATING_SDPA = '''
def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = getattr(torch, "soft" + "max")(scores, dim=-1)
    if mask is not None:
        weights = weights * mask.any(dim=-1, keepdim=True)
    return weights @ v, weights
'''
DELEGATING_MHA = '''
_Honest = MultiHeadAttention


class MultiHeadAttention(_Honest):
    def forward(self, x, context=None, mask=None, *, is_causal=False):
        theirs = nn.MultiheadAttention(self.d_model, self.n_heads, batch_first=True)
        kv = x if context is None else context
        return theirs(x, kv, kv, need_weights=False)[0]
'''
IN_PLACE_ROPE = '''
def apply_rope(x, start_pos=0, base=10000.0):
    """Rotates the pairs of x in place (and returns it): the caller's queries and keys change."""
    if x.dim() != 4:
        raise ValueError(f"x must be (batch, heads, seq, d_head); got shape {tuple(x.shape)}")
    if x.shape[-1] % 2:
        raise ValueError(f"d_head={x.shape[-1]} must be even")
    if not isinstance(start_pos, int) or start_pos < 0:
        raise ValueError(f"start_pos must be a non-negative int; got {start_pos!r}")
    angle = rope_angles(x.shape[-2], x.shape[-1], start_pos, base)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., 0::2].clone(), x[..., 1::2].clone()
    x[..., 0::2] = even * cos - odd * sin
    x[..., 1::2] = even * sin + odd * cos
    return x
'''
DELEGATING_ROPE_COMPLEX = '''
def apply_rope_complex(x, start_pos=0, base=10000.0):
    return apply_rope(x.clone(), start_pos, base)  # the cos/sin rotation of exercise 3
'''

# student -> (chapter, {exercise: replacement solution cell}); the other exercises keep the honest solution
SUBMISSIONS = {
    "ov_honest": (CH1, {}),
    "ov_mixed1": (CH1, {"attention_scores": IN_PLACE_SCORES, "softmax": DELEGATING_SOFTMAX,
                        "scaled_dot_product_attention": DELEGATING_SDPA}),
    "ov_mixed2": (CH2, {"MultiHeadAttention": None}),  # None: the delegating subclass is appended to the honest class
    "ov_mixed3": (CH3, {"apply_rope": IN_PLACE_ROPE, "apply_rope_complex": DELEGATING_ROPE_COMPLEX}),
}


def expected_points(student: str) -> dict[str, float]:
    chapter, changed = SUBMISSIONS[student]
    return {ex.name: 0.0 if ex.name in changed else float(ex.points) for ex in registry.get(chapter).exercises}


def submission(student: str) -> nbformat.NotebookNode:
    chapter, changed = SUBMISSIONS[student]
    nb = redteam.solved(chapter, SOURCE)
    for exercise, code in changed.items():
        if code is None:
            redteam.set_cell(nb, f"{exercise}_solution", DELEGATING_MHA, append=True)
        else:
            redteam.set_cell(nb, f"{exercise}_solution", code)
    return nb


def of_chapter(chapter: str) -> list[str]:
    return [student for student, (ch, _) in SUBMISSIONS.items() if ch == chapter]


# A submission that is, byte for byte, a notebook another corpus of the same session run already holds is not
# run again: its verdict is read from that notebook's run (tests/test_one_verdict.py checks the two are equal).
# ``ov_honest`` is chapter 1 with every answer: nbgrader's ``filled`` student and the red-team's ``honest``.
SAME_AS = {"ov_honest": {"nbgrader": "filled", "grade": "honest"}}


def run_by(student: str, way: str) -> str:
    """The student whose run ``way`` ("nbgrader" or "grade") reads for ``student``'s submission."""
    return SAME_AS.get(student, {}).get(way, student)
