"""Wall time and peak memory of every chapter notebook on ONE core, against the budget.

    python scripts/measure_notebooks.py [--chapter 01_attention_by_hand] [--release-only | --source-only] [--save DIR]

Runs each source notebook (autograder/source/NN_name/NN_name.ipynb) and each
student release (course/NN_name/NN_name.ipynb, stubs left in: its test cells
fail with NotImplementedError, the run goes on) in a fresh kernel pinned to CPU 0
with OMP_NUM_THREADS=1 (torch then uses one thread), like Binder's single core.
Peak RSS is the kernel process's VmHWM from /proc, read just before shutdown.
Budget (COURSE.md): <= 3 minutes and <= 1.5 GB each. Exit status 1 if any is over.
``--save DIR`` writes each executed notebook to DIR/NN_name-source.ipynb (or -release): the figures a full
run printed (accuracies, BLEU, tokens/s) can be read there.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from autograder.kernel_client import SlicedKernelManager

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "autograder" / "source"
COURSE = ROOT / "course"
BUDGET_SECONDS = 180.0
BUDGET_BYTES = 1.5 * 2**30


def peak_rss(pid: int) -> int:
    """VmHWM of a live process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def measure(path: Path, *, allow_errors: bool, save: Path | None = None) -> tuple[float, int, int]:
    """(seconds, peak RSS bytes, number of cells that raised) for one notebook; the executed notebook is
    written to ``save`` when given."""
    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg")
    with tempfile.TemporaryDirectory() as cwd:
        client = NotebookClient(nb, kernel_manager_class=SlicedKernelManager, timeout=600, kernel_name="python3", allow_errors=allow_errors,
                                resources={"metadata": {"path": cwd}})
        start = time.perf_counter()
        with client.setup_kernel(env=env):
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
            seconds = time.perf_counter() - start
            rss = peak_rss(client.km.provisioner.process.pid)
    errors = sum(o.get("output_type") == "error" for c in nb.cells for o in c.get("outputs", []))
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, save)
    return seconds, rss, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapter", action="append", help="only this chapter (repeatable); default: all")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--source-only", action="store_true", help="only the source notebooks")
    which.add_argument("--release-only", action="store_true", help="only the student releases")
    parser.add_argument("--save", type=Path, metavar="DIR", help="write each executed notebook to DIR")
    args = parser.parse_args(argv)

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # the kernel inherits it
    chapters = args.chapter or sorted(p.name for p in SOURCE.iterdir() if (p / f"{p.name}.ipynb").is_file())
    runs = []
    for name in chapters:
        if not args.release_only:
            runs.append(("source", SOURCE / name / f"{name}.ipynb", False))
        if not args.source_only:
            runs.append(("release", COURSE / name / f"{name}.ipynb", True))

    print(f"{'notebook':45s} {'kind':8s} {'wall':>8s} {'peak RSS':>10s} {'errors':>6s}  budget")
    over = 0
    for kind, path, allow_errors in runs:
        if not path.is_file():
            print(f"{path.parent.name:45s} {kind:8s} missing: {path}")
            over += 1
            continue
        save = args.save / f"{path.parent.name}-{kind}.ipynb" if args.save else None
        seconds, rss, errors = measure(path, allow_errors=allow_errors, save=save)
        ok = seconds <= BUDGET_SECONDS and rss <= BUDGET_BYTES and (allow_errors or errors == 0)
        over += not ok
        print(f"{path.parent.name:45s} {kind:8s} {seconds:7.1f}s {rss / 2**20:8.0f} MB {errors:6d}  "
              f"{'ok' if ok else 'OVER'}", flush=True)
    print(f"budget: <= {BUDGET_SECONDS:.0f} s and <= {BUDGET_BYTES / 2**30:.1f} GB per notebook, on one core")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
