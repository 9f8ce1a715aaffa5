"""Policy -> rollout engine weight sync: the LoRA adapter alone where the engine takes adapters, else every
weight (merged with the adapters under LoRA), streamed one gathered tensor at a time.

Why: a rank-16 adapter of a 1.5B model is ~1% of its bytes; vLLM serves it beside the base weights it
already holds (`enable_lora`, one `LoRARequest` per generate), so each step moves only the adapter.
An engine without adapter support (`takes_adapters` false: the HF engine, vLLM started without
`lora_rank`) gets merged weights through `update_weights`, as full fine-tuning does, each parameter gathered
in the engine's dtype (under `policy.cpu_offload` on the GPU, not as fp32 on the host). The path taken and
the bytes moved are returned as figures (`rollout/weight_sync_adapter`, `perf/weight_sync_bytes`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from train.policy.segments import for_engine

ADAPTER, MERGED = "adapter", "merged"


def sync_mode(policy, engine) -> str:
    """`adapter` when the policy trains LoRA adapters and the engine takes them, else `merged`."""
    lora = getattr(policy, "lora", None)
    return (
        ADAPTER if lora is not None and lora.enabled and getattr(engine, "takes_adapters", False) else MERGED
    )


def sync_weights(policy, engine) -> dict[str, float]:
    """Load the policy's current weights into `engine` (collective: every rank gathers each tensor).
    Returns {rollout/weight_sync_adapter: 1 | 0, perf/weight_sync_bytes: bytes handed to the engine}.
    The CUDA allocator leaves expandable segments first: the engine wakes here (train/policy/segments.py)."""
    for_engine()
    if sync_mode(policy, engine) == ADAPTER:
        tensors = dict(policy.adapter_weights())
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        engine.load_adapter(tensors, policy.lora, policy.model_path)
        return {"rollout/weight_sync_adapter": 1.0, "perf/weight_sync_bytes": float(size)}
    dtype = getattr(engine, "weight_dtype", getattr(engine, "dtype", None))
    dtype = dtype if isinstance(dtype, torch.dtype) else None
    # gathered in the engine's dtype, one parameter at a time (Policy.full_weights: never the fp32 model)
    counted = _Counted(policy.full_weights(dtype), dtype)
    engine.update_weights(counted)
    return {"rollout/weight_sync_adapter": 0.0, "perf/weight_sync_bytes": float(counted.bytes)}


class _Counted:
    """The weight stream, counting the bytes the engine receives (in its dtype when it has one)."""

    def __init__(self, named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None) -> None:
        self.named, self.itemsize, self.bytes = named, (dtype.itemsize if dtype else None), 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.named:
            self.bytes += tensor.numel() * (self.itemsize or tensor.element_size())
            yield name, tensor


class AdapterFolders:
    """Where an engine's adapter versions are written (vLLM reads a LoRA adapter from a folder; it has no
    in-memory path): a private folder in /dev/shm (memory) when there is one, one sub-folder per version,
    the previous one deleted once the next is loaded."""

    def __init__(self) -> None:
        shm = Path("/dev/shm")
        self.root = Path(tempfile.mkdtemp(prefix="rlpost-lora-", dir=shm if shm.is_dir() else None))
        self.version = 0

    def write(self, tensors: dict[str, torch.Tensor], lora, base_model) -> tuple[int, Path]:
        from infra.checkpoint.adapter import write_adapter_folder

        self.version += 1
        folder = write_adapter_folder(self.root / f"v{self.version}", tensors, lora.peft_config(), base_model)
        return self.version, folder

    def drop(self, version: int) -> None:
        shutil.rmtree(self.root / f"v{version}", ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
