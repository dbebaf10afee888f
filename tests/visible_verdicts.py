"""Print, as JSON, every chapter's visible verdicts on the reference answers and on the planted bugs.

    python tests/visible_verdicts.py ORIGINAL EXERCISES_JSON

Run with the repository to test first on ``PYTHONPATH`` (this repository, or a student edition):
the reference answers and the mutants are loaded from ``ORIGINAL`` (this repository), then every
``solutions`` module is forgotten, so the checks import whatever ``solutions`` the path gives: in a
student edition, the withheld stubs (the checks replay their recorded reference results). Used by
tests/test_publish.py to compare the edition's verdicts with this repository's.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def _load_originals(original: Path, exercises: list[list[str]]) -> tuple[dict, dict]:
    sys.path[:0] = [str(original), str(original / "tests")]
    try:
        answers = {}
        for checks, name, reference in exercises:
            module, target = reference.split(":")
            answers[(checks, name)] = getattr(importlib.import_module(module), target)
        found = {}
        for path in sorted((original / "tests" / "mutants").glob("*_mutants.py")):
            found[path.stem] = list(importlib.import_module(f"mutants.{path.stem}").MUTANTS)
    finally:
        del sys.path[:2]
    for name in [m for m in sys.modules if m.split(".")[0] in ("solutions", "autograder")]:
        del sys.modules[name]  # from here on, the repository under test's own modules
    return answers, found


def main() -> None:
    original, exercises = Path(sys.argv[1]), json.loads(sys.argv[2])
    answers, mutants = _load_originals(original, exercises)
    import torch

    from autograder.checks import core

    torch.set_num_threads(1)
    verdicts, replayed = {}, {}
    for (checks, name), obj in answers.items():
        module = importlib.import_module(checks)
        replayed[checks] = any(isinstance(v, core.Withheld) for v in vars(module).values())
        check = module.CHECKS[name]
        # as test_mutants' reference test: only the PyTorch rule applies to the library's own answer
        verdict = core.judge_check(check, core.local_probe(obj, check.forbidden), core.notebook_seeds("visible", 0))
        verdicts[f"reference {checks}:{name}"] = [verdict.passed, verdict.reason]
    for stem, found in mutants.items():
        checks = "autograder.checks." + stem.removesuffix("_mutants")
        for mutant in found:
            try:
                core.run(checks, mutant.exercise, mutant.obj, level="visible", seed=0, quiet=True)
                verdicts[f"mutant {checks}:{mutant.name}"] = [True, ""]
            except core.CheckFailed as err:
                verdicts[f"mutant {checks}:{mutant.name}"] = [False, str(err)]
    print(json.dumps({"verdicts": verdicts, "replayed": replayed,
                      "solutions": str(Path(importlib.import_module("solutions").__file__).parent)}))


if __name__ == "__main__":
    main()
