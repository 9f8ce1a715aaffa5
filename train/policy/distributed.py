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
        if torch.cuda.is_available():  # one GPU per rank: the rank's local index on its node
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if "RANK" in os.environ:  # torchrun / srun set these
            dist.init_process_group(backend)
        else:  # no env changes: child processes must not inherit this group's address
            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
            )
    return dist.get_rank(), dist.get_world_size()


def device() -> torch.device:
    """Where this rank computes: its GPU when there is one (set by init_distributed), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _comm_device() -> torch.device:
    """NCCL reduces only GPU tensors, gloo only CPU ones."""
    return device() if dist.get_backend() == "nccl" else torch.device("cpu")


def all_reduce_sum(value: float | int) -> float:
    """Sum a Python number over ranks (a no-op at world size 1)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    return float(t.item())


def all_reduce_max(value: int) -> int:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.int64, device=_comm_device())
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
