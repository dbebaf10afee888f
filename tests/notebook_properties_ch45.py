"""What an executed chapter 4 or 5 notebook must show: plain functions for the session's shared notebook runs.

``untouched_release_problems(chapter_id, nb)`` takes the executed untouched release (``course/NN_name``), and
``solved_source_problems(chapter_id, nb)`` the executed source notebook (answers in, ``TDD_QUICK=1`` or not); each
returns the problems found, [] when the notebook behaves. tests/test_notebook_properties_ch45.py tests them on
notebooks made up for the purpose.
"""

from __future__ import annotations

from autograder.registry import is_test_cell

WAITING = "(appears once "  # what a widget shows until the exercise it needs passes
OLD_NOTICE = "(this cell uses your"  # the notice every demo cell used to print
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

# Lines the solved chapter prints, computed by its own run (quick or full: no figure that only one of them
# prints, e.g. the beam sweep's last width), one per measured section.
SOLVED_LINES = {
    "04_encoder_decoder": (
        "✓ teacher_forcing: all", "✓ DecoderLayer: all", "✓ noam_scheduler: all", "✓ label_smoothed_cross_entropy: all",
        "✓ greedy_search: all", "✓ beam_search_over: all", "held-out exact match:", "signature nrefs:1",
        "beam 2: ['b']", "beam 1 → ", "Without warm-up the final loss changed by",
        "With ε = 0.1 the held-out perplexity is", "token accuracy: teacher-forced", "✗ still buggy",
    ),
    "05_vision_transformer": (
        "✓ patchify: all", "✓ patch_embedding_from_conv: all", "✓ add_cls_and_positions: all",
        "✓ VisionTransformer: all", "✓ vit_parameter_count: all", "✓ interpolate_position_embeddings: all",
        "✓ attention_rollout: all", "[ 2., 18.,  3., 19.,  6., 22.,  7., 23.]", "With std 1 the positions start",
        "largest logit difference, ours vs torchvision", "equal: True", "The shifts changed the ViT's accuracy by",
        "of which n² terms", "[CLS]:", "positions interpolated on the 2-D grid", "similarity of grid neighbours",
        "✗ still buggy",
    ),
}
# Lines an untouched release prints anyway: cells that need no exercise.
# (The widgets print their waiting line inside the widget's own output area, which the browser test reads.)
UNTOUCHED_LINES = {
    "04_encoder_decoder": ("training pairs", "EncoderLayer vs nn.TransformerEncoderLayer"),
    "05_vision_transformer": ("ViT-B/16", "GMACs", "✗ still buggy"),
}


def _text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append(output.get("text", ""))
        elif output.get("output_type") in ("execute_result", "display_data"):
            parts.append(str(output.get("data", {}).get("text/plain", "")))
        elif output.get("output_type") == "error":
            parts.append(f"{output.get('ename')}: {output.get('evalue')}")
    return "".join(parts)


def _errors(cell) -> list[dict]:
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def _widgets(nb) -> int:
    return sum(WIDGET_MIME in o.get("data", {}) for cell in nb.cells for o in cell.get("outputs", [])
               if o.get("output_type") in ("execute_result", "display_data"))


def _raised(cell, error: dict) -> str:
    return f"cell {cell.get('id')} raised {error.get('ename')}: {error.get('evalue')}"[:300]


def _missing(nb, code: list, lines: tuple[str, ...]) -> list[str]:
    """The expected lines that no code cell prints, and a missing widget."""
    everything = "".join(_text(c) for c in code)
    problems = [f"nothing prints {line!r}" for line in lines if line not in everything]
    return problems + (["no widget is displayed"] if _widgets(nb) < 1 else [])


def untouched_release_problems(chapter_id: str, nb) -> list[str]:
    """An executed untouched release: only its graded test cells raise, each saying "not done yet"; no cell prints the
    old per-cell notice; a widget is displayed (what it waits for shows inside it: the browser test reads that); the cells that need no exercise print
    what they always print."""
    problems = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        errors, text = _errors(cell), _text(cell)
        if errors and not is_test_cell(cell):
            problems.append(_raised(cell, errors[0]))
        if is_test_cell(cell) and (not errors or "not done yet" not in text):
            problems.append(f"test cell {cell.get('id')} does not say 'not done yet'")
        if OLD_NOTICE in text:
            problems.append(f"cell {cell.get('id')} prints the per-cell notice {OLD_NOTICE!r}")
    return problems + _missing(nb, code, UNTOUCHED_LINES[chapter_id])


def solved_source_problems(chapter_id: str, nb) -> list[str]:
    """An executed source notebook (answers in): no cell raises, every test cell passes, each measured section prints
    its line, and the widgets are displayed."""
    problems = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        errors = _errors(cell)
        if errors:
            problems.append(_raised(cell, errors[0]))
        if OLD_NOTICE in _text(cell) or WAITING in _text(cell):
            problems.append(f"cell {cell.get('id')} still waits for an exercise: {_text(cell)[:120]!r}")
    return problems + _missing(nb, code, SOLVED_LINES[chapter_id])
