"""Sharded policy state with `torch.distributed.checkpoint` (DCP), and a streamed HF export.

    save_sharded(policy, folder)   # collective: every rank writes its own shards of model + optimizer
    load_sharded(policy, folder)   # collective: any world size, resharded on load
    export_hf(policy, folder, ...) # collective: the model alone as an HF folder, written by rank 0

Why: gathering the full model AND the AdamW state onto rank 0 costs 16 bytes per parameter of one
host's memory (64 GB for a 4B model) and serialises the write; with DCP each rank writes 16/world bytes
per parameter in parallel, and the checkpoint's metadata lets a job of another world size read it back
(torch's DCP docs: "load-time resharding"). The model/optimizer state dicts come from
`torch.distributed.checkpoint.state_dict.get_state_dict` (FSDP2 DTensor shards, fully qualified names),
so the files do not depend on how the model was wrapped.

The HF export streams: each parameter is all-gathered alone (`DTensor.full_tensor()`), cast to the
export dtype, and rank 0 appends it to the current safetensors shard, written out every `shard_mb`; the
whole model is never resident on one rank. Tied output embeddings are written once, as HF expects.

These write into the folder they are given; train/checkpoint.py owns the step layout and makes a step
appear whole (temporary name, manifest, fsync, rename).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from train.policy.distributed import barrier

MODEL_KEY, OPTIM_KEY = "model", "optim"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _state(policy) -> dict:
    model_sd, optim_sd = get_state_dict(
        policy.model, [policy.optimizer] if policy.optimizer is not None else [], options=StateDictOptions()
    )
    state = {MODEL_KEY: model_sd}
    if policy.optimizer is not None:
        state[OPTIM_KEY] = optim_sd
    return state


def save_sharded(policy, folder: str | Path) -> Path:
    """Write this rank's shards of the model and optimizer into `folder`. Collective."""
    folder = Path(folder)
    dcp.save(_state(policy), checkpoint_id=str(folder))
    return folder


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


def export_hf(
    policy,
    dest: str | Path,
    tokenizer=None,
    dtype: str = "float32",
    shard_mb: int = 2048,
    extra_files: tuple[Path, ...] = (),
) -> Path:
    """The model alone as an HF folder `dest` (config, safetensors shards + index, tokenizer), streamed.

    `dtype`: float32 (the master weights) or bfloat16 (half the bytes; what a bf16 vLLM engine loads).
    Collective: every rank gathers each parameter in turn; rank 0 writes.
    """
    folder = Path(dest)
    torch_dtype = getattr(torch, dtype)
    rank = _rank()
    tied = bool(getattr(policy.config, "tie_word_embeddings", False))
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    shard: dict[str, torch.Tensor] = {}
    shard_bytes, files, weight_map, total = 0, [], {}, 0
    for name, full in policy.full_weights():  # collective: each parameter gathered alone
        if rank != 0 or (tied and name == "lm_head.weight"):
            continue
        tensor = full.detach().to(device="cpu", dtype=torch_dtype)
        size = tensor.numel() * tensor.element_size()
        if shard and shard_bytes + size > shard_mb * 2**20:
            files.append(_write_shard(folder, shard, len(files), weight_map))
            shard, shard_bytes = {}, 0
        shard[name] = tensor.contiguous()
        shard_bytes += size
        total += size
    if rank == 0:
        files.append(_write_shard(folder, shard, len(files), weight_map))
        if len(files) == 1:  # one file: the plain name every loader looks for first
            os.replace(folder / files[0], folder / "model.safetensors")
        else:
            renamed = {f: f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i, f in enumerate(files)}
            for old, new in renamed.items():
                os.replace(folder / old, folder / new)
            index = {
                "metadata": {"total_size": total},
                "weight_map": {k: renamed[v] for k, v in sorted(weight_map.items())},
            }
            (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
        config = policy.config
        old_cache, old_dtype = config.use_cache, getattr(config, "dtype", None)
        config.use_cache, config.dtype = True, torch_dtype
        config.save_pretrained(folder)
        config.use_cache, config.dtype = old_cache, old_dtype
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        for extra in extra_files:
            if Path(extra).is_file():
                shutil.copy(extra, folder / Path(extra).name)
    barrier()
    return folder


def _write_shard(folder: Path, shard: dict[str, torch.Tensor], index: int, weight_map: dict) -> str:
    name = f"part-{index:05d}.safetensors"
    save_file(shard, folder / name, metadata={"format": "pt"})
    weight_map.update(dict.fromkeys(shard, name))
    return name
