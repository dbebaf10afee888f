"""The chapter registry: the one place that says what a chapter is and what each exercise is worth.

Everything else reads it — the release, the batch grader (which notebook is which
chapter, the points, the answers hidden in the sandbox and forbidden to the learner's
code), the notebook checks (the same forbidden answers), the gradebook, the drift,
mutant and reference tests, and the README's chapter table (checked by a test).

A chapter is:

* its id ``NN_name``: the source notebook ``autograder/source/NN_name/NN_name.ipynb``
  and its release ``course/NN_name/NN_name.ipynb``;
* its checks module (``autograder.checks.<name>``, whose ``CHECKS`` holds one
  :class:`autograder.checks.core.Check` per exercise);
* the library modules that hold its answers: hidden from the learner's code in the
  sandbox, and calling them from an exercise is delegation (a chapter may span several:
  chapter 4 = transformer, schedule, losses, decoding);
* its exercises in notebook order, each with its points and the library object it is
  checked against, written ``module:attribute``. The attribute is also the name the
  learner defines in the notebook; the notebook's cells are ``<name>_solution`` and
  ``<name>_tests``;
* the earlier chapters whose answers it imports (its notebook, or its answer modules):
  a student edition opens the chapter only once their answers are released
  (``autograder publish``), so those chapters are due before it opens.

To add a chapter, follow ``docs/adding_a_chapter.md``.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_DIR = PACKAGE_DIR / "source"
COURSE_DIR = PACKAGE_DIR.parent / "course"

# --- the conventions every chapter follows (read here, never spelled elsewhere) ---------------------------
CHAPTER_ID = re.compile(r"^\d\d_[a-z0-9_]+$")  # "01_attention_by_hand": a folder and its notebook's name
CHAPTER_GLOB = "[0-9][0-9]_*"  # the same, for Path.glob
SOLUTION_SUFFIX = "_solution"  # nbgrader grade id of an exercise's answer cell: <name>_solution
TESTS_SUFFIX = "_tests"  # nbgrader grade id of an exercise's graded test cell: <name>_tests
# The tag of every graded test cell: JupyterLab, nbclient and nbconvert go on past an error in a cell with it, so
# Run All does not stop at an unsolved exercise.
RUN_ALL_TAG = "raises-exception"


def is_test_cell(cell) -> bool:
    """Whether ``cell`` is a graded test cell (nbgrader: graded, not a solution)."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and not meta.get("solution")


def exercise_of_grade_id(grade_id: str) -> str:
    """The exercise a grade id belongs to: ``softmax_tests`` and ``softmax_solution`` -> ``softmax``."""
    return grade_id.removesuffix(TESTS_SUFFIX).removesuffix(SOLUTION_SUFFIX)


@dataclass(frozen=True)
class Exercise:
    name: str  # the exercise id: nbgrader grade ids <name>_solution / <name>_tests, the key in CHECKS
    points: int  # what it is worth, in nbgrader and in `autograder grade`
    reference: str  # "module:attribute" of the library object that answers it

    @property
    def module(self) -> str:
        return self.reference.split(":")[0]

    @property
    def target(self) -> str:
        """The name the learner defines in the notebook (the reference's attribute)."""
        return self.reference.split(":")[1]

    def load_reference(self) -> Any:
        return getattr(importlib.import_module(self.module), self.target)

    @property
    def tests_id(self) -> str:
        """The grade id of its graded test cell (nbgrader's grade cell, and the gradebook's)."""
        return self.name + TESTS_SUFFIX

    @property
    def solution_id(self) -> str:
        return self.name + SOLUTION_SUFFIX


@dataclass(frozen=True)
class Chapter:
    id: str  # "01_attention_by_hand": the folder and notebook name
    title: str  # "Attention by hand"
    checks: str  # the checks module, "autograder.checks.attention"
    answers: tuple[str, ...]  # library modules holding the answers, e.g. ("solutions.attention",)
    exercises: tuple[Exercise, ...]  # in notebook order
    # the earlier chapters whose answers this one imports directly ("01_attention_by_hand", ...);
    # tests/test_registry.py checks them against the notebook's and the answer modules' imports
    needs: tuple[str, ...] = ()

    @property
    def number(self) -> int:
        return int(self.id[:2])

    @property
    def points(self) -> int:
        return sum(ex.points for ex in self.exercises)

    @property
    def notebook(self) -> str:
        return f"{self.id}.ipynb"

    def source_path(self, source_dir: Path = SOURCE_DIR) -> Path:
        return Path(source_dir) / self.id / self.notebook

    def release_path(self, course_dir: Path = COURSE_DIR) -> Path:
        return Path(course_dir) / self.id / self.notebook

    def exercise(self, name: str) -> Exercise:
        for ex in self.exercises:
            if ex.name == name:
                return ex
        raise ValueError(f"chapter {self.id} has no exercise {name!r}; it has {[e.name for e in self.exercises]}")

    def load_checks(self) -> dict:
        """The checks module's ``CHECKS``: exercise name -> :class:`~autograder.checks.core.Check`."""
        return importlib.import_module(self.checks).CHECKS

    def answer_files(self) -> tuple[str, ...]:
        """The source files of the answer modules (found without importing them)."""
        files = []
        for module in self.answers:
            spec = importlib.util.find_spec(module)
            if spec is not None and spec.origin:
                files.append(str(Path(spec.origin).resolve()))
        return tuple(files)

    def checks_file(self) -> str | None:
        spec = importlib.util.find_spec(self.checks)
        return str(Path(spec.origin).resolve()) if spec is not None and spec.origin else None


CHAPTERS: tuple[Chapter, ...] = (
    Chapter(
        id="01_attention_by_hand",
        title="Attention by hand",
        checks="autograder.checks.attention",
        answers=("solutions.attention",),
        exercises=(
            Exercise("attention_scores", 2, "solutions.attention:attention_scores"),
            Exercise("softmax", 2, "solutions.attention:softmax"),
            Exercise("causal_mask", 2, "solutions.attention:causal_mask"),
            Exercise("padding_mask", 1, "solutions.attention:padding_mask"),
            Exercise("scaled_dot_product_attention", 3, "solutions.attention:scaled_dot_product_attention"),
            Exercise("tiled_attention", 3, "solutions.attention:tiled_attention"),
        ),
    ),
    Chapter(
        id="02_multi_head_attention",
        title="Multi-head attention",
        checks="autograder.checks.multihead",
        answers=("solutions.multihead",),
        needs=("01_attention_by_hand",),
        exercises=(
            Exercise("split_heads", 1, "solutions.multihead:split_heads"),
            Exercise("merge_heads", 1, "solutions.multihead:merge_heads"),
            Exercise("MultiHeadAttention", 3, "solutions.multihead:MultiHeadAttention"),
            Exercise("attention_parameter_count", 1, "solutions.multihead:attention_parameter_count"),
            Exercise("repeat_kv_heads", 2, "solutions.multihead:repeat_kv_heads"),
            Exercise("query_gradient_norm", 3, "solutions.multihead:query_gradient_norm"),
        ),
    ),
    Chapter(
        id="03_positional_encodings",
        title="Positional encodings",
        checks="autograder.checks.positional",
        answers=("solutions.positional",),
        needs=("01_attention_by_hand", "02_multi_head_attention"),
        exercises=(
            Exercise("sinusoidal_encoding", 2, "solutions.positional:sinusoidal_encoding"),
            Exercise("LearnedPositionalEmbedding", 2, "solutions.positional:LearnedPositionalEmbedding"),
            Exercise("apply_rope", 3, "solutions.positional:apply_rope"),
            Exercise("apply_rope_complex", 3, "solutions.positional:apply_rope_complex"),
            Exercise("alibi_slopes", 2, "solutions.positional:alibi_slopes"),
            Exercise("alibi_bias", 2, "solutions.positional:alibi_bias"),
        ),
    ),
    Chapter(
        id="04_encoder_decoder",
        title="The encoder-decoder",
        checks="autograder.checks.encoder_decoder",
        answers=("solutions.transformer", "solutions.schedule", "solutions.losses", "solutions.decoding"),
        needs=("01_attention_by_hand", "02_multi_head_attention", "03_positional_encodings"),
        exercises=(
            Exercise("teacher_forcing", 1, "solutions.transformer:teacher_forcing"),
            Exercise("DecoderLayer", 3, "solutions.transformer:DecoderLayer"),
            Exercise("noam_scheduler", 1, "solutions.schedule:noam_scheduler"),
            Exercise("label_smoothed_cross_entropy", 2, "solutions.losses:label_smoothed_cross_entropy"),
            Exercise("greedy_search", 1, "solutions.decoding:greedy_search"),
            Exercise("beam_search_over", 3, "solutions.decoding:beam_search_over"),
        ),
    ),
    Chapter(
        id="05_vision_transformer",
        title="The Vision Transformer",
        checks="autograder.checks.vit",
        answers=("solutions.vit",),
        needs=("02_multi_head_attention",),
        exercises=(
            Exercise("patchify", 2, "solutions.vit:patchify"),
            Exercise("patch_embedding_from_conv", 1, "solutions.vit:patch_embedding_from_conv"),
            Exercise("add_cls_and_positions", 1, "solutions.vit:add_cls_and_positions"),
            Exercise("VisionTransformer", 2, "solutions.vit:VisionTransformer"),
            Exercise("vit_parameter_count", 2, "solutions.vit:vit_parameter_count"),
            Exercise("interpolate_position_embeddings", 3, "solutions.vit:interpolate_position_embeddings"),
            Exercise("attention_rollout", 3, "solutions.vit:attention_rollout"),
        ),
    ),
    Chapter(
        id="06_kv_cache_inference",
        title="KV-cache inference",
        checks="autograder.checks.kv_cache",
        answers=("solutions.gpt",),
        needs=("01_attention_by_hand", "03_positional_encodings", "04_encoder_decoder"),
        exercises=(
            Exercise("kv_cache_bytes", 1, "solutions.gpt:kv_cache_bytes"),
            Exercise("decode_tokens_per_second", 2, "solutions.gpt:decode_tokens_per_second"),
            Exercise("PagedKVCache", 3, "solutions.gpt:PagedKVCache"),
            Exercise("generate_batch", 2, "solutions.gpt:generate_batch"),
            Exercise("speculative_generate", 3, "solutions.gpt:speculative_generate"),
        ),
    ),
)


def notebook_problems(chapter: Chapter, nb) -> list[str]:
    """How a (source or release) notebook's nbgrader cells disagree with ``chapter``; [] when they agree.

    Every exercise needs a ``<name>_solution`` cell and a graded ``<name>_tests`` cell worth
    its points, in the registry's order, and no other graded cell. Every graded test cell is tagged
    ``raises-exception``, so that Run All (JupyterLab, nbclient) goes on past an unsolved exercise also
    where the notebooks are released with plain nbgrader (JupyterHub).
    """
    problems, tests_order = [], []
    grade_ids = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        grade_id = meta.get("grade_id", "")
        if is_test_cell(cell):
            tests_order.append(exercise_of_grade_id(grade_id))
            grade_ids[grade_id] = meta.get("points")
            if cell.cell_type == "code" and RUN_ALL_TAG not in cell.get("metadata", {}).get("tags", []):
                problems.append(f"{grade_id} is not tagged {RUN_ALL_TAG} (Run All would stop there)")
        elif meta.get("solution"):
            grade_ids[grade_id] = None
    for ex in chapter.exercises:
        if ex.solution_id not in grade_ids:
            problems.append(f"no solution cell {ex.solution_id}")
        if ex.tests_id not in grade_ids:
            problems.append(f"no graded test cell {ex.tests_id}")
        elif grade_ids[ex.tests_id] != ex.points:
            problems.append(f"{ex.tests_id} is worth {grade_ids[ex.tests_id]} points in the notebook "
                            f"and {ex.points} in the registry")
    names = [ex.name for ex in chapter.exercises]
    extra = [t for t in tests_order if t not in names]
    if extra:
        problems.append(f"graded cells not in the registry: {', '.join(extra)}")
    if not extra and tests_order != names and sorted(tests_order) == sorted(names):
        problems.append(f"exercises in the order {tests_order}, registry order {names}")
    return problems


def hidden_while_graded(chapter: Chapter) -> list[Path]:
    """The files the learner's code must not read while ``chapter`` is graded: its answer modules and those of
    every later chapter (not yet due: a student edition withholds them), and the checks modules of every chapter
    (their hidden cases). What the learner's code reads can reach the ``reason`` column, and so the learner's
    feedback. Earlier chapters' answer modules stay readable: a notebook imports what earlier chapters built."""
    paths = []
    for other in CHAPTERS:
        if other.number >= chapter.number:
            paths += [Path(f) for f in other.answer_files()]
        checks = other.checks_file()
        if checks:
            paths.append(Path(checks))
    return paths


def get(chapter_id: str) -> Chapter:
    """The chapter with this id; ValueError listing the ids otherwise."""
    for chapter in CHAPTERS:
        if chapter.id == chapter_id:
            return chapter
    raise ValueError(f"no chapter {chapter_id!r}; the chapters are {', '.join(c.id for c in CHAPTERS)}")


def ids() -> list[str]:
    return [c.id for c in CHAPTERS]


def chapter_of_checks(checks_module: str) -> Chapter:
    for chapter in CHAPTERS:
        if chapter.checks == checks_module:
            return chapter
    raise ValueError(f"no chapter uses the checks module {checks_module!r}; add it to autograder/registry.py")


def prerequisites(chapter_id: str) -> tuple[str, ...]:
    """Every chapter whose answers ``chapter_id`` needs, directly or through another one, in course order."""
    found, todo = set(), list(get(chapter_id).needs)
    while todo:
        needed = todo.pop()
        if needed not in found:
            found.add(needed)
            todo += get(needed).needs
    return tuple(c.id for c in CHAPTERS if c.id in found)


def dependents(chapter_id: str) -> tuple[str, ...]:
    """Every chapter that needs the answers of ``chapter_id`` (directly or not): it cannot open before
    ``chapter_id`` is due."""
    return tuple(c.id for c in CHAPTERS if chapter_id in prerequisites(c.id))


def answer_modules() -> dict[str, str]:
    """Every answer module -> the id of the chapter it belongs to (each belongs to exactly one)."""
    return {module: c.id for c in CHAPTERS for module in c.answers}
