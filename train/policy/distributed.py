"""torch.distributed set-up for the trainer: gloo on CPU, NCCL on GPU; world size 1 needs no launcher."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> tuple[int, int]:
    """Join (or create) the default process group; returns (rank, world_size).

    Under torchrun the usual env vars are set. A plain `python -m train` run creates a group of one,
    so FSDP2 and the colocated vLLM engine (which joins this same group) work the same way at any size.
    """
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if "RANK" in os.environ:  # torchrun / srun set these
            dist.init_process_group(backend)
        else:  # no env changes: child processes must not inherit this group's address
            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
            )
    return dist.get_rank(), dist.get_world_size()


def all_reduce_sum(value: float | int) -> float:
    """Sum a Python number over ranks (a no-op at world size 1)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


def all_reduce_max(value: int) -> int:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_gather_objects(obj: object) -> list:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
