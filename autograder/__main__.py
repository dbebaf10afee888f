"""``python -m autograder {release,check,grade,plan,merge,feedback,workspace,publish,course}``.

Each command lives in its own module (``autograder/<command>.py``) that provides
``add_arguments(parser)`` and ``run(args) -> int`` (the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "release": ("release", "regenerate the student release course/ from autograder/source/ with nbgrader"),
    "check": ("selfcheck", "self-check: run a notebook's visible tests in a fresh kernel and print the score"),
    "grade": ("grade", "grade a folder of submissions in parallel, sandboxed, with the hidden tests"),
    "plan": ("plan", "freeze the work list of a batch into shards, to grade on many machines (grade --plan --shard)"),
    "merge": ("merge", "check that every shard of a plan finished and write the CSV and the gradebook"),
    "feedback": ("feedback", "write per-student HTML feedback from a grades.csv"),
    "workspace": ("workspace", "copy the course's new chapters into your work folder (work/); never overwrites your work"),
    "publish": ("publish", "write the student edition: the release without the answers not yet due or the hidden tests"),
    "course": ("course", "an nbgrader course directory on a hub: init (from the registry), collect, feedback"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    # Only the command asked for is imported (the first word that is not an option: this parser has no option
    # but --help): importing them all loaded PyTorch and nbgrader, seconds of start-up, for `feedback` too.
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    modules = {}
    try:
        for command, (module_name, summary) in COMMANDS.items():
            command_parser = sub.add_parser(command, help=summary, description=summary)
            if command == chosen:
                modules[command] = module = importlib.import_module(f"autograder.{module_name}")
                module.add_arguments(command_parser)
    except ModuleNotFoundError as err:
        if err.name and not err.name.startswith("autograder"):
            print(f"error: this Python ({sys.executable}) does not have the course installed (no module "
                  f"{err.name!r}); use the course's: .venv/bin/python -m autograder … (make install creates it)",
                  file=sys.stderr)
            return 1
        raise
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
