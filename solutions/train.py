"""Train a small model end to end on the embedded data (or yours).

    python -m solutions.train translate --out runs/translate
    python -m solutions.train vit --metrics-json vit.json
    python -m solutions.train gpt --data my_text.txt --device cuda
    torchrun --standalone --nproc_per_node 2 -m solutions.train gpt --out runs/gpt   # data-parallel

Each task lives in ``solutions/trainers/<task>.py`` and provides the same names:
``KIND`` (its name in checkpoints), ``add_arguments(parser)`` (its own options),
``build_model(config)`` (the model from a config dict, as saved in the checkpoint),
``evaluate(...)`` (held-out metrics) and ``run(args) -> dict`` (trains, prints the
held-out metric, saves a checkpoint under ``args.out`` in the format of
:mod:`solutions.checkpoint`, writes the loss of every step to ``args.loss_log``,
returns the final held-out metrics).

Under ``torchrun`` the same command trains data-parallel (:mod:`solutions.distributed`):
``args.world`` says which process this is; every process trains on its shard of
each global batch of ``--batch-size`` rows, and rank 0 alone evaluates, prints and
writes (the other processes return empty metrics). The metrics and the checkpoint
record ``world_size``.

``main`` is the console entry point (``tdd-train`` and ``python -m solutions.train``):
exit status 0 on success, 2 with one ``error: …`` line on bad input.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import sys
from pathlib import Path

import torch

from solutions import distributed

TASKS = {
    "translate": "English number words → German number words (or your --data pairs) with an encoder-decoder",
    "vit": "8×8 handwritten digits (or your --data images) with a Vision Transformer (and a CNN baseline)",
    "gpt": "a character-level decoder-only model on the embedded text (or your --data text), with KV-cache sampling",
}


def resolve_device(name: str) -> torch.device:
    """``auto`` = CUDA when present, else CPU; ``cuda`` without a GPU is an error, not a fallback."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but no CUDA device is available; use --device cpu or auto")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m solutions.train",
        description="Train a small Transformer end to end on the embedded data set, with no download.",
    )
    tasks = parser.add_subparsers(dest="task", required=True, metavar="{" + ",".join(TASKS) + "}")
    for task, summary in TASKS.items():
        sub = tasks.add_parser(task, help=summary, description=summary)
        sub.add_argument("--out", type=Path, default=None,
                         help="save the run in this directory: model.pt (config, weights, tokenizers or class names, "
                              "metrics; see solutions/checkpoint.py); nothing is saved when omitted")
        sub.add_argument("--metrics-json", type=Path, default=None,
                         help="write the final held-out metrics to this JSON file")
        sub.add_argument("--data", type=Path, default=None,
                         help="your own data instead of the embedded data set (a file, or a folder of images for "
                              "vit; the format is at the end of the task's --help)")
        sub.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                         help="where to train (default: auto = CUDA if available, else CPU)")
        sub.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
        sub.add_argument("--quiet", action="store_true", help="no progress bar")
        sub.add_argument("--accumulation-steps", type=int, default=1,
                         help="split each batch into this many micro-batches whose gradients add up before the "
                              "step: the same training in less memory; --batch-size = micro-batch x processes "
                              "x accumulation steps (default: 1)")
        sub.add_argument("--loss-log", type=Path, default=None,
                         help="write the training loss of every optimizer step (over the whole batch) to this "
                              "file, one number per line")
        importlib.import_module(f"solutions.trainers.{task}").add_arguments(sub)
    return parser


def train(argv: list[str] | None = None) -> dict:
    """Parse ``argv``, train, write ``--metrics-json``; returns the metrics (empty on a rank other than 0 under
    torchrun). Bad input raises ValueError."""
    args = build_parser().parse_args(argv)
    if args.accumulation_steps < 1:
        raise ValueError(f"--accumulation-steps must be at least 1; got {args.accumulation_steps}")
    args.world = distributed.start(resolve_device(args.device))
    completed = False
    try:
        args.device = args.world.device
        args.quiet = args.quiet or not args.world.is_main
        seed_everything(args.seed)
        trainer = importlib.import_module(f"solutions.trainers.{args.task}")
        metrics = trainer.run(args)
        if args.metrics_json is not None and args.world.is_main:
            args.metrics_json.parent.mkdir(parents=True, exist_ok=True)
            args.metrics_json.write_text(json.dumps(metrics, indent=2) + "\n")
        completed = True
        return metrics
    finally:
        distributed.finish(args.world, completed=completed)


def rank_prefix() -> str:
    """"rank R: " in a process started by torchrun with several processes, so that each error says whose it is."""
    if distributed.launched_by_torchrun() and os.environ["WORLD_SIZE"] != "1":
        return f"rank {os.environ['RANK']}: "
    return ""


def lost_another_process(err: RuntimeError) -> bool:
    """An error of the communication between the processes of a torchrun training (a peer died, a timeout), not a
    bug: gloo raises a plain RuntimeError from its transport, NCCL and the store a DistError."""
    return isinstance(err, torch.distributed.DistError) or "gloo/transport" in str(err)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: 0 on success; 2 and one ``error: …`` line (no traceback) on bad data or options; 1 and
    one line when another process of a torchrun training failed (torchrun then names it)."""
    try:
        train(argv)
    except (ValueError, OSError) as err:  # bad data, options or paths: say what is wrong
        print(f"error: {rank_prefix()}{err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if not lost_another_process(err):
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: {rank_prefix()}another training process failed or cannot be reached ({first}); torchrun's "
              "summary names the process that failed first and why", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
