"""Data parallelism for the trainers: one training spread over several processes by ``torchrun``.

    torchrun --standalone --nproc_per_node 2 -m solutions.train vit        # 2 processes on this machine
    torchrun --nnodes 2 --nproc_per_node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m solutions.train gpt

Every process draws the same global batch (the same seeded generator), takes its
own rows of it, ``batch_size / (processes · accumulation_steps)`` per
micro-batch, and ``DistributedDataParallel`` averages the gradients: each
optimizer step is the step one process takes on the whole batch, up to the order
of floating-point sums. The loss of a micro-batch is weighted by its share of the
global batch (its rows, or its tokens when the loss is a mean over tokens), so
that the weighted losses of all micro-batches of all processes add up to the loss
of the global batch. Rank 0 alone evaluates, prints and writes; the others only
train.

Without ``torchrun``, or with one process, nothing here communicates and every
function is the identity: ``python -m solutions.train`` is a world of one.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# How long a process waits for the others in one collective before it gives up with an error.
TIMEOUT = datetime.timedelta(minutes=10)


@dataclass(frozen=True)
class World:
    """The processes of one training run, as seen by one of them."""

    rank: int = 0  # this process among all of them; 0 evaluates, prints and writes
    size: int = 1  # how many processes train together (torchrun's WORLD_SIZE)
    local_rank: int = 0  # this process among those of its machine: which GPU it uses
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where this process trains
    owns_group: bool = False  # start() joined the process group, so finish() leaves it (not when the caller had)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def micro_batches(self, rows: int, accumulation_steps: int = 1) -> list[slice]:
        """This process's rows of a global batch of ``rows`` rows: ``accumulation_steps`` equal slices.

        Process r takes the r-th ``rows / size`` rows, so the processes together cover the batch once.
        """
        parts = self.size * accumulation_steps
        if rows % parts:
            below, above = rows // parts * parts, (rows // parts + 1) * parts
            raise ValueError(
                f"--batch-size {rows} cannot be split into {self.size} process(es) x {accumulation_steps} "
                f"accumulation step(s) = {parts} equal micro-batches; use a multiple of {parts}, e.g. "
                f"{above}" + (f" or {below}" if below else "")
            )
        per = rows // parts
        first = self.rank * accumulation_steps
        return [slice((first + i) * per, (first + i + 1) * per) for i in range(accumulation_steps)]

    def sum(self, *values: float) -> list[float]:
        """Each value summed over the processes (float64); the values themselves in a world of one."""
        if self.size == 1:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` in ``DistributedDataParallel`` (which starts every process from rank 0's weights);
        ``model`` itself in a world of one."""
        if self.size == 1:
            return model
        if self.device.type == "cuda":  # BatchNorm statistics over the global batch; PyTorch has no CPU version
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def gradient_sync(self, model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
        """Around a backward pass: average the gradients over the processes only when ``sync`` (the last
        micro-batch of a step); the earlier micro-batches only accumulate locally."""
        if isinstance(model, DistributedDataParallel) and not sync:
            return model.no_sync()
        return contextlib.nullcontext()

    def broadcast(self, value: object) -> object:
        """Rank 0's ``value`` (any picklable object), on every process."""
        if self.size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def check_same(self, what: str, *tensors: torch.Tensor) -> None:
        """Raise ValueError on every process when the processes do not hold the same ``tensors``: the shards of
        a batch are taken by position, so each process must read the same data in the same order."""
        if self.size == 1:
            return
        digest = hashlib.sha256()
        for tensor in tensors:
            digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        digests: list[str] = [""] * self.size
        dist.all_gather_object(digests, digest.hexdigest()[:16])
        differ = [rank for rank, d in enumerate(digests) if d != digests[0]]
        if differ:
            raise ValueError(
                f"rank(s) {differ} hold different {what} than rank 0: every process must read the same --data "
                "(the same file on every node) with the same --seed and options"
            )


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a ``DistributedDataParallel``: what is evaluated and saved (no ``module.`` prefix)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def launched_by_torchrun() -> bool:
    """True in a process started by ``torchrun`` (it sets RANK, LOCAL_RANK and WORLD_SIZE)."""
    return all(name in os.environ for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))


def start(device: torch.device) -> World:
    """Join the other processes when launched by ``torchrun`` with more than one, else a world of one.

    ``device`` is where to train (from ``--device``); on CUDA each process takes the GPU of its local rank.
    The backend follows the device: NCCL on CUDA, gloo on CPU. A program that trains several times under one
    torchrun joins the group itself, once, before the first training (``dist.init_process_group``): each
    training then uses that group and leaves it open. Joining again after leaving is not safe: the new group's
    rendezvous keys have the old one's names in the launcher's store (PyTorch restarts its group count), and
    the second of three trainings in one program was seen to hang in ``init_process_group``.
    """
    if not launched_by_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return World(device=device)
    rank, size, local_rank = (int(os.environ[name]) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"local rank {local_rank} needs a GPU of its own, but this machine has "
                             f"{torch.cuda.device_count()}: lower torchrun's --nproc_per_node")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    joined = not dist.is_initialized()
    if joined:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=TIMEOUT,
                                **({"device_id": device} if device.type == "cuda" else {}))
    return World(rank=rank, size=size, local_rank=local_rank, device=device, owns_group=joined)


def finish(world: World, *, completed: bool = True) -> None:
    """Leave the process group if :func:`start` joined it (nothing to do in a world of one).

    After a run that ``completed``, every process first waits for the others (rank 0 evaluates and writes
    alone): a process that tore its gloo group down and exited while its peer still held the connection was
    seen to abort ("terminate called without an active exception", SIGABRT) on a busy machine. After an
    error there is no wait: the other processes may be gone.
    """
    if world.size > 1 and dist.is_initialized():
        if completed:
            dist.barrier()
        if world.owns_group:
            dist.destroy_process_group()


def reseed(world: World, seed: int) -> None:
    """After the model is built from ``seed`` (the same on every process): a different random stream per
    process for dropout, rank 0 keeping the single process's, so that no two shards share dropout masks."""
    if world.rank > 0:
        torch.manual_seed(seed + world.rank)
