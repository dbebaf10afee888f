"""``torchrun --nproc_per_node 2 -m solutions.train {translate,vit,gpt}``: the same training as one process.

Each trainer trains a small model for a few steps twice, with the same global batch and seed: once in this
process (a world of one, one thread), once as 2 CPU processes under torchrun (gloo, one thread each), translate
and gpt with 2 accumulation steps on top (4 micro-batches per step). Dropout is 0: a dropout mask is random per
process, so with dropout the two runs agree in distribution, not number for number.

Then a run without end, whose rank 1 is killed in the middle of training: torchrun must stop at once, naming it.

All the torchrun runs share one launch (tests/torchrun_trainings.py: each process joins the group once and calls
the command's entry point, ``solutions.train.main``, for each run in turn): starting interpreters was most of
this file's time (on a busy 2-core machine, 4 s of CPU to import torch and about as much again for
torch._dynamo, which PyTorch's optimizers import on first use), and a launch per run started twelve of them
instead of three. The command itself under torchrun, from its own start to its own end, is run by
tests/test_deploy.py (the Slurm script).

Tolerances, float32: the loss of every step within a relative 1e-5 (the sums run in another order), every
weight within 1e-5, except the entries the model's output does not depend on: the key projection's bias (the
softmax over keys ignores a term that is the same for every key) has a gradient that is rounding noise, which
Adam scales up to full-size steps, so it differs between any two runs; the test finds those entries as the
ones that change no logit when swapped. The held-out metric is the same.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import torch

from solutions.checkpoint import load_checkpoint
from solutions.generate import load_gpt
from solutions.train import train
from solutions.trainers.vit import build_model as build_vit
from solutions.translate import load_translator

pytestmark = [pytest.mark.train, pytest.mark.subprocess]

LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5
LOGIT_ATOL = 1e-5

# Each trainer's options, small enough for seconds of training; the torchrun run adds --accumulation-steps.
CASES = {
    "translate": (["--steps", "12", "--batch-size", "16", "--d-model", "32", "--d-ff", "64", "--n-layers", "1",
                   "--dropout", "0", "--warmup", "50"], 2),
    "vit": (["--epochs", "1", "--warmup-epochs", "0.2", "--batch-size", "64", "--d-model", "32", "--d-mlp", "64",
             "--n-layers", "1", "--time-budget", "0"], 1),
    "gpt": (["--steps", "12", "--batch-size", "16", "--block-size", "32", "--d-model", "32", "--n-layers", "1",
             "--warmup", "4", "--eval-chars", "4000", "--samples", "0", "--time-budget", "1e9"], 2),
}


TRAININGS = Path(__file__).with_name("torchrun_trainings.py")


def torchrun_trainings_command(runs: Path) -> list[str]:
    """``torchrun --standalone --nproc_per_node 2 tests/torchrun_trainings.py RUNS`` with this interpreter (a free
    port)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(TRAININGS),
            str(runs)]


def child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def common_argv(task: str, pairs: Path) -> list[str]:
    """The options both runs of ``task`` share."""
    options, _ = CASES[task]
    return [task, *options, "--quiet", "--seed", "3", "--device", "cpu",
            *(["--data", str(pairs)] if task == "translate" else [])]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    """Digit words → digits ("three one four" → "314"), 300 lines: BPE on rank 0, broadcast to the other."""
    words = "zero one two three four five six seven eight nine".split()
    path = tmp_path_factory.mktemp("data") / "digits.tsv"
    gen = torch.Generator().manual_seed(0)
    lines = []
    for _ in range(300):
        digits = torch.randint(0, 10, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist()
        lines.append(" ".join(words[d] for d in digits) + "\t" + "".join(map(str, digits)))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@dataclass
class Launch:
    """What the launch of the module left: the runs' files, and how it ended after rank 1 was killed."""

    root: Path  # DIR/<task>: each short run's checkpoint, DIR/<task>.loss its losses, DIR/<task>.json its metrics
    killed_out: Path  # the --out of the run whose rank 1 was killed
    stderr: str  # torchrun's and the processes' (rank 0's progress bar of the last run included)
    returncode: int
    seconds_to_stop: float  # from the kill to torchrun's exit
    rank0_running: bool  # rank 0 still alive after torchrun exited


@pytest.fixture(scope="module")
def torchrun_trainings(tmp_path_factory, pairs) -> Launch:
    """One torchrun launch of 2 processes: each trainer's short run, then a gpt run of 100,000 steps; after 20 of
    those, rank 1 is killed (SIGKILL) and the launch is waited for."""
    root = tmp_path_factory.mktemp("torchrun")
    runs = [[*common_argv(task, pairs), "--accumulation-steps", str(accumulation), "--out", str(root / task),
             "--loss-log", str(root / f"{task}.loss"), "--metrics-json", str(root / f"{task}.json")]
            for task, (_, accumulation) in CASES.items()]
    endless = root / "killed"
    runs.append(["gpt", "--steps", "100000", "--time-budget", "1e9", "--batch-size", "8", "--block-size", "16",
                 "--d-model", "16", "--n-layers", "1", "--samples", "0", "--device", "cpu",
                 "--out", str(endless), "--metrics-json", str(endless / "m.json")])
    (root / "runs.json").write_text(json.dumps(runs))
    launcher = subprocess.Popen(torchrun_trainings_command(root / "runs.json"), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=child_env())
    chunks: list[bytes] = []  # rank 0's progress bar ends its updates with \r, not \n: read bytes as they come
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(launcher.stderr.fileno(), 65536), b"")),
                              daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            done = [int(n) for n in re.findall(rb"\| *(\d+)/100000", b"".join(chunks[-20:]))]
            if done and max(done) >= 20:  # in the middle of the last run's training: 20 steps done
                break
            assert launcher.poll() is None, b"".join(chunks).decode(errors="replace")[-3000:]
            time.sleep(0.1)
        workers = {int(p.environ()["RANK"]): p for p in psutil.Process(launcher.pid).children(recursive=True)
                   if "RANK" in p.environ()}
        assert sorted(workers) == [0, 1], b"".join(chunks).decode(errors="replace")[-3000:]
        killed = time.monotonic()
        workers[1].send_signal(signal.SIGKILL)
        launcher.wait(timeout=60)
        stopped = time.monotonic() - killed
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait()
        reader.join(timeout=10)
    return Launch(root, endless, b"".join(chunks).decode(errors="replace"), launcher.returncode, stopped,
                  workers[0].is_running())


@pytest.fixture
def one_thread():
    """The one-process run on one thread, as each torchrun process (OMP_NUM_THREADS=1): the same kernels, and
    no second thread to wait for on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def logits(task: str, model: torch.nn.Module, vocab: int) -> torch.Tensor:
    """The model's output on fixed inputs (every token and pixel value in range)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if task == "vit":
            return model(torch.rand(8, 1, 8, 8, generator=gen))
        if task == "gpt":
            return model(torch.randint(0, vocab, (4, 16), generator=gen))
        return model(torch.randint(4, vocab, (4, 7), generator=gen), torch.randint(4, vocab, (4, 5), generator=gen))


def load(task: str, out: Path) -> tuple[torch.nn.Module, object]:
    """The saved model, rebuilt by the reader each trainer's users call (translate, generate, load_checkpoint)."""
    checkpoint = load_checkpoint(out, kind=task)
    if task == "translate":
        return load_translator(out).model, checkpoint
    if task == "gpt":
        return load_gpt(out)[0], checkpoint
    model = build_vit(checkpoint.config)
    model.load_state_dict(checkpoint.state_dict)
    return model.eval(), checkpoint


def assert_same_model(task: str, one: Path, two: Path) -> float:
    """Same weights within WEIGHT_ATOL except where the output does not depend on them; returns the largest
    difference of the others."""
    model_one, saved_one = load(task, one)
    model_two, saved_two = load(task, two)
    assert saved_one.config == saved_two.config and saved_one.vocab == saved_two.vocab
    weights_one, weights_two = saved_one.state_dict, saved_two.state_dict
    assert weights_one.keys() == weights_two.keys()
    far = {name: (weights_one[name] - weights_two[name]).abs() > WEIGHT_ATOL for name in weights_one}
    # Swap the far entries only: the output must not move (they are the ones it does not depend on).
    swapped = {name: torch.where(far[name], weights_two[name], weights_one[name]) for name in weights_one}
    probe = load(task, one)[0]
    probe.load_state_dict(swapped)
    config = saved_one.config
    vocab = {"vit": 0, "gpt": config.get("vocab"), "translate": min(config.get("src_vocab", 0), config.get("tgt_vocab", 0))}[task]
    reference = logits(task, model_one, vocab)
    torch.testing.assert_close(logits(task, probe, vocab), reference, rtol=0, atol=LOGIT_ATOL)
    torch.testing.assert_close(logits(task, model_two, vocab), reference, rtol=0, atol=LOGIT_ATOL)
    close = [(weights_one[n] - weights_two[n]).abs().masked_fill(far[n], 0).max().item() for n in weights_one]
    assert sum(int(f.sum()) for f in far.values()) <= sum(w.numel() for w in weights_one.values()) // 20
    return max(close)


@pytest.mark.parametrize("task", list(CASES))
def test_train_torchrun_two_processes_equal_one_process(task, tmp_path, pairs, torchrun_trainings, one_thread):
    _, accumulation = CASES[task]
    one = train([*common_argv(task, pairs), "--out", str(tmp_path / "one"), "--loss-log", str(tmp_path / "one.loss")])
    root = torchrun_trainings.root
    assert (root / f"{task}.json").exists(), torchrun_trainings.stderr[-3000:]

    losses_one = [float(x) for x in (tmp_path / "one.loss").read_text().split()]
    losses_two = [float(x) for x in (root / f"{task}.loss").read_text().split()]
    assert len(losses_one) == len(losses_two) >= 12
    torch.testing.assert_close(torch.tensor(losses_two), torch.tensor(losses_one), rtol=LOSS_RTOL, atol=0)
    assert losses_one[-1] < losses_one[0]  # it trained

    largest = assert_same_model(task, tmp_path / "one", root / task)
    assert largest <= WEIGHT_ATOL
    two = load_checkpoint(root / task, kind=task).metrics
    assert (one["world_size"], two["world_size"], two["accumulation_steps"]) == (1, 2, accumulation)
    metric = {"translate": "exact_match", "vit": "accuracy", "gpt": "val_loss"}[task]
    assert two[metric] == pytest.approx(one[metric], abs=1e-5)
    # Rank 0 alone wrote and printed: one metrics file, one checkpoint, nothing from rank 1.
    assert json.loads((root / f"{task}.json").read_text()) == two
    assert sorted(p.name for p in (root / task).iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())


def test_train_torchrun_a_killed_process_fails_the_run_cleanly(torchrun_trainings):
    """Rank 1 killed in the middle of training: torchrun stops rank 0 and exits non-zero at once, naming rank 1 as
    the root cause; nothing is written; no process is left behind."""
    launch = torchrun_trainings
    assert launch.returncode != 0 and launch.seconds_to_stop < 30, launch.stderr[-3000:]
    root = launch.stderr.split("Root Cause")[1]
    assert "rank      : 1" in root and "SIGKILL" in root, launch.stderr[-3000:]
    assert not launch.rank0_running
    assert not launch.killed_out.exists()
