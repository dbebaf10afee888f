"""Each trainer in one process and as ``torchrun --nproc_per_node 2``: time, held-out metric, losses, weights.

    python scripts/torchrun_vs_one.py [--row translate-stable] [--out DIR]

The same global batch, seed and steps both ways, dropout 0 (a dropout mask is random per process); on a CPU
the two processes use gloo, one thread each (``OMP_NUM_THREADS=1``). Prints one row per run: the wall time
of each run (the command, start to exit), the held-out metric each wrote to ``--metrics-json``, how many first
steps have losses that agree to a relative 1e-5 (as tests/test_train_ddp.py asks) and the largest relative
difference of a step's losses, and the largest absolute difference between the two saved models' weights:
outside the attention input projections' biases, and inside them (they hold the key bias, whose gradient is
rounding noise that Adam scales up to full steps). tests/test_train_ddp.py asserts the equality on shorter
runs.

Two translate rows. With the trainer's learning rate (``--lr-factor 2``) the runs agree to about 1e-7 for
some 80 steps, then drift apart over the next 30 and end with weights 1.0 apart: from there on this training
amplifies any rounding difference, one process's own too (on 2 threads against 1, ``--threads 2``, it parts
at step 64). A lower or later peak learning rate, pre-norm layers, a larger batch, no label smoothing or no
clipping only move that step (to between 24 and 163, measured against torchrun or against 2 threads); none kept
300 steps equal. The second row, half the learning rate for 120 steps, ends before it: equal throughout, and
already 93% exact match.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from solutions.checkpoint import load_checkpoint

# Each row: the trainer and its options, its defaults shortened to about a minute of training on one CPU core,
# dropout 0.
ROWS = {
    "translate": ("translate", ["--steps", "300", "--dropout", "0"]),
    "translate-stable": ("translate", ["--steps", "120", "--dropout", "0", "--lr-factor", "0.5"]),
    "vit": ("vit", ["--epochs", "10", "--dropout", "0", "--time-budget", "0"]),
    "gpt": ("gpt", ["--steps", "300", "--dropout", "0", "--samples", "0", "--time-budget", "1e9"]),
}
METRIC = {"translate": "exact_match", "vit": "accuracy", "gpt": "val_loss"}
LOSS_RTOL = 1e-5  # tests/test_train_ddp.py's


def run(command: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def largest_differences(one: Path, two: Path, task: str) -> tuple[float, float]:
    """(largest weight difference outside the attention input biases, largest inside them)."""
    a, b = load_checkpoint(one, kind=task).state_dict, load_checkpoint(two, kind=task).state_dict
    if a.keys() != b.keys():
        raise SystemExit(f"{task}: the two checkpoints hold different weights")
    key_bias = [name for name in a if name.endswith(("in_proj.bias", "kv_proj.bias"))]
    other = max((a[n] - b[n]).abs().max().item() for n in a if n not in key_bias)
    keys = max(((a[n] - b[n]).abs().max().item() for n in key_bias), default=0.0)
    return other, keys


def equal_losses(one: Path, two: Path) -> tuple[int, int, float]:
    """(how many first steps have losses that agree to LOSS_RTOL, the number of steps, the largest relative
    difference of a step's losses)."""
    a, b = ([float(x) for x in path.read_text().split()] for path in (one, two))
    if len(a) != len(b):
        raise SystemExit(f"{one} and {two} hold {len(a)} and {len(b)} steps")
    relative = [abs(x - y) / abs(x) for x, y in zip(a, b)]
    agree = next((step for step, r in enumerate(relative) if r > LOSS_RTOL), len(a))
    return agree, len(a), max(relative)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", action="append", choices=list(ROWS), help="only this row (repeatable)")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    root = args.out or Path(tempfile.mkdtemp(prefix="torchrun-vs-one-"))
    print(f"{'row':17s} {'one process':>12s} {'torchrun ×2':>12s}  {'metric':12s} {'one':>9s} {'two':>9s}  "
          f"{'losses equal':>13s} {'(largest)':>9s}  largest weight difference (attention input biases)")
    for name in args.row or list(ROWS):
        task, options = ROWS[name]
        common = [task, *options, "--quiet", "--seed", "0", "--device", "cpu"]
        outs = {n: root / name / n for n in ("one", "two")}
        t_one = run([sys.executable, "-m", "solutions.train", *common, "--out", str(outs["one"]),
                     "--metrics-json", str(outs["one"] / "metrics.json"), "--loss-log", str(outs["one"] / "loss")])
        t_two = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                     "-m", "solutions.train", *common, "--out", str(outs["two"]),
                     "--metrics-json", str(outs["two"] / "metrics.json"), "--loss-log", str(outs["two"] / "loss")])
        m_one, m_two = (json.loads((outs[n] / "metrics.json").read_text())[METRIC[task]] for n in ("one", "two"))
        agree, steps, largest = equal_losses(outs["one"] / "loss", outs["two"] / "loss")
        other, keys = largest_differences(outs["one"], outs["two"], task)
        print(f"{name:17s} {t_one:11.1f}s {t_two:11.1f}s  {METRIC[task]:12s} {m_one:9.4f} {m_two:9.4f}  "
              f"{f'{agree} of {steps}':>13s} {largest:9.1e}  {other:.2e} ({keys:.2e})", flush=True)
    print(f"runs kept in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
