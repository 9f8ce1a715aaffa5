"""Sharded policy state with `torch.distributed.checkpoint` (DCP), and a streamed HF export.

    save_sharded(policy, folder)   # collective: every rank writes its own shards of model + optimizer
    load_sharded(policy, folder)   # collective: any world size, resharded on load
    export_hf(policy, folder, ...) # collective: the model alone as an HF folder, each rank writes its share

Why: gathering the full model AND the AdamW state onto rank 0 costs 16 bytes per parameter of one
host's memory (64 GB for a 4B model) and serialises the write; with DCP each rank writes 16/world bytes
per parameter in parallel, and the checkpoint's metadata lets a job of another world size read it back
(torch's DCP docs: "load-time resharding"). The model/optimizer state dicts come from
`torch.distributed.checkpoint.state_dict.get_state_dict` (FSDP2 DTensor shards, fully qualified names),
so the files do not depend on how the model was wrapped.

The HF export streams: each parameter is all-gathered alone (`DTensor.full_tensor()`), cast to the
export dtype, and kept by the one rank whose contiguous share (~1/world of the bytes) it falls in; every rank
writes its share in files of at most `shard_mb` at the same time, rank 0 names them and writes the index: the
whole model is never resident on one rank, and no rank waits for the whole model's write. Tied output
embeddings are written once, as HF expects.

These write into the folder they are given; infra/checkpoint/layout.py owns the step layout and
train/checkpoint.py makes a step appear whole (temporary name, manifest, fsync, rename).
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

from infra.checkpoint.adapter import write_adapter_folder
from train.policy.distributed import all_gather_objects, barrier, io_group
from train.policy.lora import hf_name, is_adapter

MODEL_KEY, OPTIM_KEY = "model", "optim"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _adapters_only(policy) -> bool:
    lora = getattr(policy, "lora", None)
    return lora is not None and lora.enabled


def _state(policy) -> dict:
    """Model (under LoRA: the adapters alone; the frozen base is the model.path files) and optimizer state."""
    model_sd, optim_sd = get_state_dict(
        policy.model, [policy.optimizer] if policy.optimizer is not None else [], options=StateDictOptions()
    )
    if _adapters_only(policy):
        model_sd = {k: v for k, v in model_sd.items() if is_adapter(k)}
    state = {MODEL_KEY: model_sd}
    if policy.optimizer is not None:
        state[OPTIM_KEY] = optim_sd
    return state


def save_sharded(policy, folder: str | Path) -> Path:
    """Write this rank's shards of the model and optimizer into `folder`. Collective; DCP's own coordination
    (plans, the metadata rank 0 writes) goes through the I/O group, as torchtitan's saves do."""
    folder = Path(folder)
    dcp.save(_state(policy), checkpoint_id=str(folder), process_group=io_group())
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
        options=StateDictOptions(strict=not _adapters_only(policy)),  # LoRA: the base is not in the shards
    )


def export_hf(
    policy,
    dest: str | Path,
    tokenizer=None,
    dtype: str = "float32",
    shard_mb: int = 2048,
    extra_files: tuple[Path, ...] = (),
) -> Path:
    """The model alone as an HF folder `dest` (config, safetensors files + index, tokenizer), streamed.

    `dtype`: float32 (the master weights) or bfloat16 (half the bytes; what a bf16 vLLM engine loads).
    Collective: every rank gathers each parameter in turn and keeps those of its own contiguous share (about
    1/world of the bytes), then every rank writes and fsyncs its share at once; rank 0 names the files, writes
    the index and config. The ranks wait for each other in the I/O group (gloo, an I/O-sized timeout), so a
    slow file system never holds a rank inside an NCCL collective (whose watchdog ends the job at 10 min).
    """
    folder = Path(dest)
    torch_dtype = getattr(torch, dtype)
    rank, world = _rank(), (dist.get_world_size() if dist.is_initialized() else 1)
    tied = bool(getattr(policy.config, "tie_word_embeddings", False))
    folder.mkdir(parents=True, exist_ok=True)  # every rank writes here (a shared file system across nodes)
    files, weight_map = _write_own_share(
        policy, folder, torch_dtype, _owners(policy, tied, world), rank, shard_mb
    )
    total = sum((folder / f).stat().st_size for f in files)
    group = io_group()
    parts = all_gather_objects((files, weight_map, total), group=group)  # every rank's share is on disk
    if rank == 0:
        _name_files(folder, parts)
        _write_config(policy, folder, torch_dtype, tokenizer, extra_files)
    barrier(group)
    return folder


def _write_own_share(
    policy, folder: Path, torch_dtype: torch.dtype, owner: dict[str, int], rank: int, shard_mb: int
) -> tuple[list[str], dict[str, str]]:
    """Gather every parameter (collective) and write the ones this rank owns in files of at most `shard_mb`:
    the file names and {parameter: file}."""
    shard: dict[str, torch.Tensor] = {}
    shard_bytes, files, weight_map = 0, [], {}
    for name, full in policy.full_weights(torch_dtype):  # collective: each parameter gathered alone, in dtype
        if owner.get(name) != rank:
            continue
        tensor = full.detach().to(device="cpu", dtype=torch_dtype).contiguous()
        size = tensor.numel() * tensor.element_size()
        if shard and shard_bytes + size > shard_mb * 2**20:
            files.append(_write_shard(folder, shard, f"{rank:05d}-{len(files):05d}", weight_map))
            shard, shard_bytes = {}, 0
        shard[name] = tensor
        shard_bytes += size
    if shard:
        files.append(_write_shard(folder, shard, f"{rank:05d}-{len(files):05d}", weight_map))
    return files, weight_map


def _name_files(folder: Path, parts: list) -> None:
    """Rank 0: every rank's files renamed as HF names them (one file: model.safetensors), with the index."""
    files = [f for part in parts for f in part[0]]
    weight_map = {k: v for part in parts for k, v in part[1].items()}
    if len(files) == 1:  # one file: the plain name every loader looks for first
        os.replace(folder / files[0], folder / "model.safetensors")
        return
    renamed = {f: f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i, f in enumerate(files)}
    for old, new in renamed.items():
        os.replace(folder / old, folder / new)
    index = {
        "metadata": {"total_size": sum(part[2] for part in parts)},
        "weight_map": {k: renamed[v] for k, v in sorted(weight_map.items())},
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def _write_config(
    policy, folder: Path, torch_dtype: torch.dtype, tokenizer, extra_files: tuple[Path, ...]
) -> None:
    """Rank 0: the model config (use_cache on, the export's dtype), the tokenizer and the extra files."""
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


def export_adapter(policy, dest: str | Path, tokenizer=None, extra_files: tuple[Path, ...] = ()) -> Path:
    """Under LoRA: the adapters alone as a PEFT adapter folder `dest` (adapter_config.json naming the base
    model, adapter_model.safetensors in fp32, the tokenizer), which `PeftModel.from_pretrained` and vLLM's
    `--lora-modules` read. Collective (each adapter tensor is gathered on every rank); rank 0 writes."""
    folder = Path(dest)
    tensors = {k: v.detach().to("cpu", torch.float32) for k, v in policy.adapter_weights()}
    if _rank() == 0:
        write_adapter_folder(folder, tensors, policy.lora.peft_config(), policy.model_path)
        for f in folder.iterdir():
            _fsync_file(f)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        for extra in extra_files:
            if Path(extra).is_file():
                shutil.copy(extra, folder / Path(extra).name)
    barrier(io_group())
    return folder


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _owners(policy, tied: bool, world: int) -> dict[str, int]:
    """Which rank writes each exported parameter: contiguous runs in `full_weights` order, cut where the
    running size crosses k/world of the total (every rank computes the same from the global shapes)."""
    sizes = [
        (hf_name(name), p.numel())
        for name, p in policy.model.named_parameters()  # deduplicated as full_weights does (HF names)
        if hf_name(name) is not None and not (tied and hf_name(name) == "lm_head.weight")
    ]
    total, done, owner = sum(n for _, n in sizes) or 1, 0, {}
    for name, n in sizes:
        owner[name] = min(world - 1, done * world // total)
        done += n
    return owner


def _write_shard(folder: Path, shard: dict[str, torch.Tensor], tag: str, weight_map: dict) -> str:
    """One safetensors file of this rank's share, fsynced by its writer (on a network file system another
    node's fsync would not flush it)."""
    name = f"part-{tag}.safetensors"
    save_file(shard, folder / name, metadata={"format": "pt"})
    fd = os.open(folder / name, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    weight_map.update(dict.fromkeys(shard, name))
    return name
