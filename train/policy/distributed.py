"""torch.distributed set-up for the trainer: gloo on CPU, NCCL (+ gloo for host tensors) on GPU; world size 1
needs no launcher. A run that expects CUDA but cannot use it is refused in one line, never moved to the CPU."""

from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CudaUnavailableError(ValueError):
    """CUDA was expected (a CUDA build of torch, GPUs given by Slurm, or RLPOST_DEVICE=cuda) but is not usable."""


def process_group_backend(device_type: str) -> str:
    """The default process group's backend for ranks computing on `device_type`.

    On a GPU, NCCL for device tensors AND gloo for host tensors (`cuda:nccl,cpu:gloo`, verl's and
    torchtune's choice): with `policy.cpu_offload` the parameter shards, gradients and optimizer live on the
    host, so `clip_grad_norm_`'s DTensor reduction and `full_tensor()` in the HF export are CPU collectives,
    which an NCCL-only group refuses ("No backend type associated with device type cpu").
    """
    return "cuda:nccl,cpu:gloo" if device_type == "cuda" else "gloo"


def cuda_expected(env: dict[str, str], torch_cuda: str | None) -> str | None:
    """Why this process should see a GPU (None when it need not): `RLPOST_DEVICE=cuda` asked for it, Slurm
    gave the job GPUs, or torch is a CUDA build (the `gpu` extra). `RLPOST_DEVICE=cpu`, or GPUs hidden on
    purpose (`CUDA_VISIBLE_DEVICES` empty or -1), means the CPU is intended."""
    asked = env.get("RLPOST_DEVICE", "").strip().lower()
    if asked == "cpu" or env.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return None
    if asked == "cuda":
        return "RLPOST_DEVICE=cuda"
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS"):
        if env.get(key, "").strip() not in ("", "0"):
            return f"Slurm gave this job GPUs ({key}={env[key]})"
    if torch_cuda:
        return f"torch {torch.__version__} is a CUDA {torch_cuda} build (the gpu extra)"
    return None


def require_usable_cuda(env: dict[str, str] | None = None) -> None:
    """Refuse, in one line, a run that expects CUDA where `torch.cuda.is_available()` is false (e.g. torch
    2.14's CUDA 13 wheels on a node whose driver is older), instead of training on the CPU with gloo."""
    why = cuda_expected(dict(os.environ) if env is None else env, torch.version.cuda)
    if why is not None and not torch.cuda.is_available():
        raise CudaUnavailableError(
            f"CUDA expected ({why}) but torch.cuda.is_available() is False: the node has no visible GPU or "
            f"its NVIDIA driver is older than torch's CUDA {torch.version.cuda or '?'} needs (nvidia-smi shows "
            "it); run on a GPU node with a current driver, or set RLPOST_DEVICE=cpu to train on the CPU"
        )


DIST_TIMEOUT_S = 7200.0  # the run config's dist_timeout_s default (train/config.py): see init_distributed


def init_distributed(timeout_s: float = DIST_TIMEOUT_S) -> tuple[int, int]:
    """Join (or create) the default process group; returns (rank, world_size).

    Under torchrun the usual env vars are set. A plain `python -m train` run creates a group of one,
    so FSDP2 and the colocated vLLM engine (which joins this same group) work the same way at any size.

    `timeout_s` (the run's `dist_timeout_s`) bounds every collective of the group, NCCL and gloo: a rank
    that finished generating waits in the first collective after generation (`Policy.micro_batches`'
    `all_reduce_max`) for as long as the slowest rank still generates, so it must exceed the longest
    generation skew. torch's default (10 min for NCCL) ends the job at the paper shapes, whose steps
    take ~20 min (`python -m train.plan`); verl raises `nccl_timeout` for such runs, torchtitan has
    `comm.train_timeout_seconds`. The default, 2 h, is the checkpoint waits' (IO_TIMEOUT_S).
    """
    if not dist.is_initialized():
        require_usable_cuda()
        backend = process_group_backend("cuda" if torch.cuda.is_available() else "cpu")
        if torch.cuda.is_available():  # one GPU per rank: the rank's local index on its node
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        timeout = datetime.timedelta(seconds=float(timeout_s))
        if "RANK" in os.environ:  # torchrun / srun set these
            dist.init_process_group(backend, timeout=timeout)
        else:  # no env changes: child processes must not inherit this group's address
            dist.init_process_group(
                backend,
                init_method=f"tcp://127.0.0.1:{_free_port()}",
                rank=0,
                world_size=1,
                timeout=timeout,
            )
    return dist.get_rank(), dist.get_world_size()


def device() -> torch.device:
    """Where this rank computes: its GPU when there is one (set by init_distributed), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _comm_device() -> torch.device:
    """Where a small reduction runs: the rank's GPU (NCCL) when it has one, else the CPU (gloo)."""
    return device()


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


def all_gather_objects(obj: object, group: dist.ProcessGroup | None = None) -> list:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=group)
    return out


def barrier(group: dist.ProcessGroup | None = None) -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier(group=group)


IO_TIMEOUT_S = float(os.environ.get("RLPOST_IO_TIMEOUT_S", 2 * 3600))
_io_group: dist.ProcessGroup | None = None


def io_group() -> dist.ProcessGroup | None:
    """A gloo group over all ranks with a timeout sized for file I/O (RLPOST_IO_TIMEOUT_S, default 2 h), for
    the waits of a checkpoint: the ranks that finished writing wait there for the slowest writer and for rank
    0's commit, never in an NCCL collective, whose watchdog ends the job after 10 minutes (torchtitan saves
    through a gloo group the same way). None (the default group) at world size 1. Collective on first use:
    every rank must reach it in the same order (save_checkpoint is called by all)."""
    global _io_group
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    if _io_group is None:
        _io_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=IO_TIMEOUT_S))
    return _io_group
