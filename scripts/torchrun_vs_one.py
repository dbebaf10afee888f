"""Each trainer in one process and as ``torchrun --nproc_per_node 2``: time, held-out metric, largest weight difference.

    python scripts/torchrun_vs_one.py [--task translate] [--out DIR]

The same global batch, seed and steps both ways, dropout 0 (a dropout mask is random per process); on a CPU
the two processes use gloo, one thread each (``OMP_NUM_THREADS=1``). Prints one row per trainer: the wall time
of each run (the command, start to exit), the held-out metric each wrote to ``--metrics-json`` and the largest
absolute difference between the two saved models' weights: outside the attention input projections' biases,
and inside them (they hold the key bias, whose gradient is rounding noise that Adam scales up to full steps).
tests/test_train_ddp.py asserts the equality on shorter runs.
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

# Each trainer's options: its defaults shortened to about a minute of training on one CPU core, dropout 0.
OPTIONS = {
    "translate": ["--steps", "300", "--dropout", "0"],
    "vit": ["--epochs", "10", "--dropout", "0", "--time-budget", "0"],
    "gpt": ["--steps", "300", "--dropout", "0", "--samples", "0", "--time-budget", "1e9"],
}
METRIC = {"translate": "exact_match", "vit": "accuracy", "gpt": "val_loss"}


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
    key_bias = [name for name in a if name.endswith("in_proj.bias") or name.endswith("kv_proj.bias")]
    other = max((a[n] - b[n]).abs().max().item() for n in a if n not in key_bias)
    keys = max(((a[n] - b[n]).abs().max().item() for n in key_bias), default=0.0)
    return other, keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", action="append", choices=list(OPTIONS), help="only this trainer (repeatable)")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    root = args.out or Path(tempfile.mkdtemp(prefix="torchrun-vs-one-"))
    print(f"{'trainer':10s} {'one process':>12s} {'torchrun ×2':>12s}  {'metric':12s} {'one':>9s} {'two':>9s}  "
          "largest weight difference (attention input biases)")
    for task in args.task or list(OPTIONS):
        common = [task, *OPTIONS[task], "--quiet", "--seed", "0", "--device", "cpu"]
        outs = {n: root / task / n for n in ("one", "two")}
        t_one = run([sys.executable, "-m", "solutions.train", *common, "--out", str(outs["one"]),
                     "--metrics-json", str(outs["one"] / "metrics.json")])
        t_two = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                     "-m", "solutions.train", *common, "--out", str(outs["two"]),
                     "--metrics-json", str(outs["two"] / "metrics.json")])
        m_one, m_two = (json.loads((outs[n] / "metrics.json").read_text())[METRIC[task]] for n in ("one", "two"))
        other, keys = largest_differences(outs["one"], outs["two"], task)
        print(f"{task:10s} {t_one:11.1f}s {t_two:11.1f}s  {METRIC[task]:12s} {m_one:9.4f} {m_two:9.4f}  "
              f"{other:.2e} ({keys:.2e})", flush=True)
    print(f"runs kept in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
