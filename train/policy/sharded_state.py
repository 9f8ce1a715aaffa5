"""Sharded checkpoints of the policy with `torch.distributed.checkpoint` (DCP), and a streamed HF export.

    save_sharded(policy, dest)   # collective: every rank writes its own shards of model + optimizer
    load_sharded(policy, src)    # collective: any world size, resharded on load
    export_hf(policy, dest, ...) # collective: the model alone as an HF folder, written by rank 0

Why: gathering the full model AND the AdamW state onto rank 0 costs 16 bytes per parameter of one
host's memory (64 GB for a 4B model) and serialises the write; with DCP each rank writes 16/world bytes
per parameter in parallel, and the checkpoint's metadata lets a job of another world size read it back
(torch's DCP docs: "load-time resharding"). The model/optimizer state dicts come from
`torch.distributed.checkpoint.state_dict.get_state_dict` (FSDP2 DTensor shards, fully qualified names),
so the files do not depend on how the model was wrapped.

The HF export streams: each parameter is all-gathered alone (`DTensor.full_tensor()`), cast to the
export dtype, and rank 0 appends it to the current safetensors shard, written out every `shard_mb`; the
whole model is never resident on one rank. Tied output embeddings are written once, as HF expects.

Both writers use a temporary name renamed when complete, so a reader never sees half a checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from train.policy.distributed import all_gather_objects, barrier

MODEL_KEY, OPTIM_KEY = "model", "optim"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _tmp_name(dest: Path) -> Path:
    """One temporary sibling name, the same on every rank (rank 0 draws it)."""
    token = all_gather_objects(uuid.uuid4().hex[:8])[0]
    return dest.parent / f".tmp-{dest.name}-{token}"


def _publish(tmp: Path, dest: Path) -> None:
    """Rank 0 renames the finished temporary folder (after every rank wrote its part)."""
    barrier()
    if _rank() == 0:
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    barrier()


def _state(policy) -> dict:
    model_sd, optim_sd = get_state_dict(
        policy.model, [policy.optimizer] if policy.optimizer is not None else [], options=StateDictOptions()
    )
    state = {MODEL_KEY: model_sd}
    if policy.optimizer is not None:
        state[OPTIM_KEY] = optim_sd
    return state


def save_sharded(policy, dest: str | Path) -> Path:
    """Write this rank's shards of the model and optimizer to `dest` (a folder). Collective."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(dest)
    dcp.save(_state(policy), checkpoint_id=str(tmp))
    if _rank() == 0:
        (tmp / "world_size.json").write_text(json.dumps({"saved_world_size": policy.world_size}))
    _publish(tmp, dest)
    return dest


def load_sharded(policy, src: str | Path) -> None:
    """Load a `save_sharded` folder into `policy` (built from the same architecture, any world size)."""
    src = Path(src)
    if not (src / ".metadata").is_file():
        raise FileNotFoundError(f"{src} is not a sharded checkpoint (no .metadata file from save_sharded)")
    state = _state(policy)  # this world's shard layout: DCP reads each rank's slices into it
    dcp.load(state, checkpoint_id=str(src))
    set_state_dict(
        policy.model,
        [policy.optimizer] if policy.optimizer is not None else [],
        model_state_dict=state[MODEL_KEY],
        optim_state_dict=state.get(OPTIM_KEY, {}),
    )


def full_parameters(policy, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor on CPU) one parameter at a time; collective; tied tensors once."""
    seen: set[int] = set()
    for name, param in policy.model.named_parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        full = param.full_tensor() if isinstance(param, DTensor) else param
        full = full.detach()
        if dtype is not None:
            full = full.to(dtype)
        yield name, full.cpu()


def export_hf(
    policy,
    dest: str | Path,
    tokenizer=None,
    dtype: str = "float32",
    shard_mb: int = 2048,
    extra_files: tuple[Path, ...] = (),
) -> Path:
    """The model alone as an HF folder (config, safetensors shards + index, tokenizer), streamed.

    `dtype`: float32 (the master weights) or bfloat16 (half the bytes; what a bf16 vLLM engine loads).
    Collective: every rank gathers each parameter in turn; rank 0 writes.
    """
    dest = Path(dest)
    torch_dtype = getattr(torch, dtype)
    tmp = _tmp_name(dest)
    rank = _rank()
    tied = bool(getattr(policy.config, "tie_word_embeddings", False))
    if rank == 0:
        tmp.mkdir(parents=True)
    shard: dict[str, torch.Tensor] = {}
    shard_bytes, files, weight_map, total = 0, [], {}, 0
    for name, tensor in full_parameters(policy, torch_dtype):
        if rank != 0 or (tied and name == "lm_head.weight"):
            continue
        size = tensor.numel() * tensor.element_size()
        if shard and shard_bytes + size > shard_mb * 2**20:
            files.append(_write_shard(tmp, shard, len(files), weight_map))
            shard, shard_bytes = {}, 0
        shard[name] = tensor.contiguous()
        shard_bytes += size
        total += size
    if rank == 0:
        files.append(_write_shard(tmp, shard, len(files), weight_map))
        if len(files) == 1:  # one file: the plain name every loader looks for first
            os.replace(tmp / files[0], tmp / "model.safetensors")
        else:
            renamed = {f: f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i, f in enumerate(files)}
            for old, new in renamed.items():
                os.replace(tmp / old, tmp / new)
            index = {
                "metadata": {"total_size": total},
                "weight_map": {k: renamed[v] for k, v in sorted(weight_map.items())},
            }
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
        config = policy.config
        old_cache, old_dtype = config.use_cache, getattr(config, "dtype", None)
        config.use_cache, config.dtype = True, torch_dtype
        config.save_pretrained(tmp)
        config.use_cache, config.dtype = old_cache, old_dtype
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for extra in extra_files:
            if Path(extra).is_file():
                shutil.copy(extra, tmp / Path(extra).name)
    _publish(tmp, dest)
    return dest


def _write_shard(folder: Path, shard: dict[str, torch.Tensor], index: int, weight_map: dict) -> str:
    name = f"part-{index:05d}.safetensors"
    save_file(shard, folder / name, metadata={"format": "pt"})
    weight_map.update(dict.fromkeys(shard, name))
    return name
