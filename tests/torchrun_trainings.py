"""Run by torchrun in tests/test_train_ddp.py: several trainings in one set of processes.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/torchrun_trainings.py RUNS.json

RUNS.json holds a list of ``python -m solutions.train`` argument lists. Each process joins the process group
once and runs each training in turn with the command's own entry point, ``solutions.train.main``; the trainings
use that group and leave it open (:func:`solutions.distributed.start`). One launch instead of one per training
starts three interpreters in all instead of three per training. The first training that fails stops the program
with its exit status.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from solutions.train import main


def run_all(runs: list[list[str]]) -> int:
    dist.init_process_group("gloo")
    for argv in runs:
        status = main(argv)
        if status:
            return status  # no barrier: the other process may be gone
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(run_all(json.loads(Path(sys.argv[1]).read_text())))
