"""The bug hunts of chapters 1–6 work as promised: predict → fix → re-run until ✓.

Each bug-hunt cell of a source notebook is run as it stands (it must print "✗ still buggy" and not the
answer), then with the fix its folded answer describes (it must print "✓ fixed"). The cells run in-process,
after the chapter's first cell, its helpers, and its solution and given cells, like a learner who has done
the exercises (plus, in SETUP, the cells that make what a chapter's hunts use: data, a short training run...).
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types

import nbformat
import pytest

from autograder import registry

# chapter id -> {a substring that identifies the bug cell: [(old, new), ...] the fix}
FIXES: dict[str, dict[str, list[tuple[str, str]]]] = {
    "01_attention_by_hand": {
        "s = q @ k.transpose(-2, -1) / q.shape[-1]": [("/ q.shape[-1]", "/ math.sqrt(q.shape[-1])")],
        "weights = e / e.sum(dim=-1, keepdim=True)": [("e = x.exp()", "e = (x - x.amax(dim=-1, keepdim=True)).exp()")],
        "def buggy_weights(": [("dim=-2", "dim=-1")],
        "m = torch.ones(seq_q, seq_k, dtype=torch.bool).tril()": [(".tril()", ".tril(diagonal=seq_k - seq_q)")],
        "def buggy_causal_attention(": [("masked_fill(mask,", "masked_fill(~mask,")],
        "def buggy_attention(": [(
            "    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)\n"
            "    if mask is not None:\n"
            "        w = w.masked_fill(~mask, 0.0)\n",
            "    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
            "    if mask is not None:\n"
            "        s = s.masked_fill(~mask, torch.finfo(s.dtype).min)\n"
            "    w = torch.softmax(s, dim=-1)\n")],
        "def buggy_attention_fill(": [(
            "    w = torch.softmax(s, dim=-1)\n",
            "    w = torch.softmax(s, dim=-1)\n    if mask is not None:\n        w = w * mask.any(dim=-1, keepdim=True)\n")],
    },
    "02_multi_head_attention": {
        "(d_head heads) -> batch heads seq d_head": [("(d_head heads) -> batch heads seq d_head",
                                                      "(heads d_head) -> batch heads seq d_head")],
        "back = heads.reshape(2, 5, 12)": [("heads.reshape(", "heads.transpose(1, 2).reshape(")],
        "def fast_attention_c(": [("    q = q / math.sqrt(q.shape[-1])\n", "")],
        "x, n_heads = torch.randn(1, 3, 100), 8": [(
            "    d_head = x.shape[-1] // n_heads\n",
            "    if x.shape[-1] % n_heads:\n        raise ValueError(f'd_model={x.shape[-1]} is not divisible by "
            "n_heads={n_heads}')\n    d_head = x.shape[-1] // n_heads\n")],
        "class TinyLM(": [("self.attn(x))", "self.attn(x, is_causal=True))")],
    },
    "03_positional_encodings": {
        "def buggy_encoding_1(": [("torch.cos(angle), torch.sin(angle)", "torch.sin(angle), torch.cos(angle)")],
        "def buggy_encoding_2(": [("10000 ** (i / d_model)", "10000 ** (2 * i / d_model)")],
        "def rope_attention(": [(
            "q, k, v = apply_rope(q, start_pos), apply_rope(k, start_pos), apply_rope(v, start_pos)",
            "q, k = apply_rope(q, start_pos), apply_rope(k, start_pos)")],
        "def rope_halves(": [("rotate_q, rotate_k = apply_rope, rope_halves", "rotate_q, rotate_k = apply_rope, apply_rope")],
        "second = chunk + table(torch.arange(chunk.shape[1]))": [
            ("table(torch.arange(chunk.shape[1]))", "table(torch.arange(start_pos, start_pos + chunk.shape[1]))")],
        "def positions_for(": [(
            "    return torch.arange(length).clamp(max=max_len - 1)",
            "    if length > max_len:\n        raise ValueError(f'{length} tokens go past max_len={max_len}')\n"
            "    return torch.arange(length)")],
        "buggy_bias = alibi_slopes(1)": [("buggy_bias = alibi_slopes(1)", "buggy_bias = -alibi_slopes(1)")],
    },
    "04_encoder_decoder": {
        "def translate_numbers_a(": [("model.train()  # as the training loop left it",
                                      "model.eval()  # as the training loop left it")],
        "def translate_numbers_b(": [("bos_id=EOS", "bos_id=BOS")],
        "def make_batch_c(": [("MAX_TARGET = 10", "MAX_TARGET = 12")],
    },
    "05_vision_transformer": {
        "def to_batch_a(": [("pixels.reshape(batch, channels, height, width).float() / 255",
                             "pixels.permute(0, 3, 1, 2).float() / 255")],
        "def logits_b(": [("model.train()  # the training loop's last state",
                           "model.eval()  # the training loop's last state")],
    },
    "06_kv_cache_inference": {
        "class BuggyCache1(": [("[:, :, : k.shape[-2]] = k", "[:, :, self.length : end] = k"),
                                ("[:, :, : v.shape[-2]] = v", "[:, :, self.length : end] = v")],
        "class BuggyGPT2(": [("start = 0  # where", "start = 0 if cache is None else len(cache)  # where")],
        "class BuggyAttention3(": [("is_causal=q.shape[-2] > 1)", "attn_mask=causal_mask(q.shape[-2], k.shape[-2]))")],
        "def buggy_sample4(": [("torch.softmax(logits, dim=-1) / temperature", "torch.softmax(logits / temperature, dim=-1)")],
    },
}

# chapter id -> ids of the cells, besides the solution and given cells, that make what its hunts use
SETUP: dict[str, tuple[str, ...]] = {
    "01_attention_by_hand": ("causal-lower-right-import",),  # PyTorch's mask, which the missing-diagonal hunt uses
    "04_encoder_decoder": ("ch4-004", "ch4-037", "ch4-039", "ch4-046"),  # the data, the (short) main run, translate
    "05_vision_transformer": ("ch5-04",),  # the test images
    "06_kv_cache_inference": ("c029", "c046", "c053"),  # EXAMPLE_LOGITS, the trained model, compare_with_recompute
}


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _without_markers(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if "### BEGIN SOLUTION" not in line
                     and "### END SOLUTION" not in line and not line.lstrip().startswith("%"))


def _context(nb, chapter: str) -> dict:
    """A namespace after the first cell, the helpers, and every solution and given cell."""
    module = types.ModuleType(f"__bug_hunt_{chapter}__")  # a dataclass looks its module up in sys.modules
    sys.modules[module.__name__] = module
    namespace: dict = module.__dict__
    namespace["display"] = lambda *objects, **options: None  # widgets of the SETUP cells
    code = [c for c in nb.cells if c.cell_type == "code"]
    setup = SETUP.get(chapter, ())
    for cell in code:
        meta = _meta(cell)
        if cell is code[0] or "def verdict(" in cell.source or meta.get("solution") or (
                meta.get("locked") and not meta.get("grade")) or cell.get("id") in setup:
            exec(compile(_without_markers(cell.source), "<cell>", "exec"), namespace)  # noqa: S102
    return namespace


def _answer_code(nb, hunt) -> list[str]:
    """The code spans (`...`, 12+ characters) of the first folded answer after the bug-hunt cell ``hunt``."""
    after = nb.cells[nb.cells.index(hunt) + 1 :]
    answer = next((c.source for c in after if c.cell_type == "markdown" and "<details>" in c.source), "")
    answer = answer[answer.index("<details>") :] if answer else ""
    spans = [code.strip("\"'") for code in re.findall(r"`([^`\n]+)`", answer)]
    return [code for code in spans if len(code) >= 12]


def _run(source: str, namespace: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "<bug hunt>", "exec"), dict(namespace))  # noqa: S102
    return out.getvalue()


CASES = [(chapter, marker) for chapter, fixes in FIXES.items() for marker in fixes]


@pytest.fixture(scope="module")
def contexts():
    return {}


@pytest.mark.parametrize("chapter,marker", CASES, ids=[f"{c}:{m.strip('(')}" for c, m in CASES])
def test_bug_hunt_cell_prints_symptom_then_check_after_fix(chapter, marker, contexts, monkeypatch):
    monkeypatch.setenv("TDD_QUICK", "1")  # short training runs (the missing-causal-mask hunt, SETUP)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(registry.get(chapter).source_path(), as_version=4)
    if chapter not in contexts:
        contexts[chapter] = _context(nb, chapter)
    cells = [c for c in nb.cells if c.cell_type == "code" and marker in c.source and "verdict(" in c.source]
    assert len(cells) == 1, f"{chapter}: {len(cells)} bug-hunt cells contain {marker!r}"
    source = cells[0].source
    before = _run(source, contexts[chapter])
    assert "✗ still buggy" in before and "✓" not in before, before
    printed = [code for code in _answer_code(nb, cells[0]) if code in before]
    assert printed == [], f"the still-buggy cell prints its folded answer's {printed}:\n{before}"
    fixed = source
    for old, new in FIXES[chapter][marker]:
        assert old in fixed, f"{chapter}: the fix of {marker!r} no longer applies: {old!r} is not in the cell"
        fixed = fixed.replace(old, new)
    after = _run(fixed, contexts[chapter])
    assert "✓ fixed" in after and "✗" not in after, after


@pytest.mark.parametrize("chapter", registry.ids())
def test_bug_hunts_every_verdict_cell_has_a_fix(chapter):
    assert chapter in FIXES, f"{chapter} is in the registry but its bug hunts have no fixes in FIXES (this file)"
    nb = nbformat.read(registry.get(chapter).source_path(), as_version=4)
    hunts = [c.source for c in nb.cells if c.cell_type == "code" and "verdict(" in c.source
             and "def verdict(" not in c.source]
    assert hunts, f"{chapter} has no bug hunt"
    for source in hunts:
        assert any(marker in source for marker in FIXES[chapter]), f"{chapter}: a bug hunt without a tested fix:\n{source}"
    answers = [c.source for c in nb.cells if c.cell_type == "markdown" and "<details>" in c.source]
    assert len(answers) >= len(hunts) + 2, f"{chapter}: every bug hunt and 2+ predict prompts need a folded answer"
