"""solutions.distributed: how a global batch is shared out, a world of one is the identity, and processes that
read different data are stopped with a clear error."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from solutions import distributed
from solutions.distributed import World


@pytest.mark.parametrize("size, accumulation, per", [(1, 1, 8), (2, 1, 3), (2, 3, 2), (4, 2, 1), (3, 4, 5)])
def test_world_micro_batches_cover_the_batch_once_in_equal_parts(size, accumulation, per):
    rows = size * accumulation * per
    taken = []
    for rank in range(size):
        pieces = World(rank=rank, size=size).micro_batches(rows, accumulation)
        assert len(pieces) == accumulation and all(p.stop - p.start == per for p in pieces)
        taken += [i for p in pieces for i in range(rows)[p]]
    assert taken == list(range(rows))  # every row once, rank 0 first: the batch's order is kept


@pytest.mark.parametrize("rows, size, accumulation, message", [
    (10, 4, 1, r"--batch-size 10 cannot be split into 4 process\(es\) x 1 accumulation step\(s\) = 4 equal "
               r"micro-batches; use a multiple of 4, e.g. 12 or 8"),
    (3, 2, 2, r"= 4 equal micro-batches; use a multiple of 4, e.g. 4$"),
])
def test_world_micro_batches_refuse_a_batch_that_does_not_split(rows, size, accumulation, message):
    with pytest.raises(ValueError, match=message):
        World(rank=0, size=size).micro_batches(rows, accumulation)


def test_world_of_one_is_the_identity():
    world, model = World(), nn.Linear(2, 2)
    assert world.is_main and world.sum(1.5, 2.0) == [1.5, 2.0] and world.broadcast({"a": 1}) == {"a": 1}
    assert world.wrap(model) is model and distributed.unwrap(model) is model
    assert isinstance(world.gradient_sync(model, sync=False), contextlib.nullcontext)
    world.check_same("data", torch.arange(3))  # nothing to compare with: no error


def test_start_without_torchrun_or_with_one_process_is_a_world_of_one(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.start(torch.device("cpu")) == World()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc_per_node 1: no process group to join
    assert distributed.start(torch.device("cpu")) == World() and not torch.distributed.is_initialized()


def test_reseed_keeps_rank_0_stream_and_gives_others_their_own():
    torch.manual_seed(5)
    distributed.reseed(World(rank=0, size=2), 5)
    rank0 = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(torch.rand(3), rank0)  # rank 0 = the single process
    distributed.reseed(World(rank=1, size=2), 5)
    rank1 = torch.rand(3)
    torch.manual_seed(6)
    assert torch.equal(torch.rand(3), rank1) and not torch.equal(rank0, rank1)


def _check_same_worker(rank: int, init_file: str, results) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        world = World(rank=rank, size=2)
        world.check_same("training text", torch.arange(10))  # the same: passes
        world.check_same("training text", torch.arange(10) + rank)  # rank 1 read other data
        results.put((rank, "no error"))
    except ValueError as err:
        results.put((rank, str(err)))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.subprocess
def test_world_check_same_stops_every_process_when_one_reads_other_data(tmp_path):
    context = mp.get_context("spawn")
    results = context.Queue()
    mp.start_processes(_check_same_worker, args=(str(tmp_path / "init"), results), nprocs=2, start_method="spawn")
    messages = dict(results.get(timeout=60) for _ in range(2))
    assert messages[0] == messages[1]  # both stop, with the same message
    assert messages[0].startswith("rank(s) [1] hold different training text than rank 0: every process must read "
                                  "the same --data")
