"""An HF model built without its weights, sharded by FSDP2, then filled shard by shard from its safetensors.

Why: `from_pretrained` on every rank puts the whole fp32 model in each rank's host memory before FSDP2 shards
it (8 x 16 GB on one node for a 4B model). torchtitan and verl build on the meta device instead; here every
rank then reads from the safetensors files only the rows of each parameter it keeps (FSDP2 shards dim 0,
so a rank's rows are one contiguous byte range of the file), straight into its shard when the dtypes match,
else through a buffer of at most READ_CHUNK_BYTES: host memory per rank is its 1/world share of the model plus
that buffer, and rank 0 holds no more than the others (no broadcast of a full copy). Measured at 2 ranks on a
338 MB model (tests/test_meta_build.py): peak host growth while building 156 MB per rank, was 340 MB.

    model = build_on_meta(lambda: AutoModelForCausalLM.from_config(config, dtype=torch.float32))
    files = weight_files(folder)                    # HF name -> (file, dtype, shape, byte offset)
    fresh = fresh_parameters(model, files)          # what the files lack (a critic's value head): HF's init
    ... fully_shard(...) ...
    materialize(model, files, fresh, device, buffer_device)

Only parameters are on the meta device; buffers (rotary frequencies, not in the files) are computed for real by
the model's constructor and kept. Tied output embeddings are tied again after the build (`tie_weights`), so
the shared tensor is one parameter, loaded once, as `from_pretrained` leaves it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from infra.checkpoint.adapter import is_adapter_folder

# safetensors dtype names (the format's header, github.com/huggingface/safetensors) -> torch
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip


class WeightsError(ValueError):
    """The model folder's weights cannot fill the model (no safetensors, or trunk parameters missing)."""


@dataclass(frozen=True)
class StoredTensor:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the tensor's data in the file


def build_on_meta(factory: Callable[[], nn.Module]) -> nn.Module:
    """`factory()` (e.g. `AutoModelForCausalLM.from_config`) with its parameters on the meta device (no
    memory) and its buffers real, tied output embeddings tied."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = factory()
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # parameters registered under init_empty_weights come untied
    return model


def _header(path: Path) -> dict[str, StoredTensor]:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        out[name] = StoredTensor(
            path, DTYPES[info["dtype"]], tuple(info["shape"]), 8 + size + info["data_offsets"][0]
        )
    return out


def weight_files(folder: str | Path) -> dict[str, StoredTensor]:
    """Every tensor of an HF folder's safetensors (one file or an index), read from the headers only."""
    folder = Path(folder)
    if is_adapter_folder(folder):
        raise WeightsError(
            f"model.path={folder} is a LoRA adapter folder, not a model: train from its base model "
            "(adapter_config.json's base_model_name_or_path), or export merged weights with save_hf_merged=true"
        )
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise WeightsError(
            f"model.path={folder}: no *.safetensors there (the trainer reads each rank's shard from them):"
            " re-save it with save_pretrained(..., safe_serialization=True)"
        )
    out: dict[str, StoredTensor] = {}
    for name in files:
        out.update(_header(folder / name))
    return out


def _stored_name(model: nn.Module, name: str, files: dict[str, StoredTensor]) -> str | None:
    """The file's key of parameter `name`: the same, or without the base-model prefix (a base model's files);
    a PEFT-wrapped model's base parameters by their HF names (train/policy/lora.py), its adapters: None."""
    from train.policy.lora import hf_name

    if name in files:
        return name
    name = hf_name(name)
    if name is None:
        return None
    if name in files:
        return name
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    if prefix != "." and name.startswith(prefix) and name[len(prefix) :] in files:
        return name[len(prefix) :]
    return None


def fresh_parameters(
    model: nn.Module,
    files: dict[str, StoredTensor],
    seed: int = 0,
    known: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Full values, identical on every rank, of the parameters the files lack (a value head on a causal LM's
    trunk), initialised by the model's own `_init_weights` as `from_pretrained` does; `known` values (LoRA
    adapters' own init) are taken as they are. A missing parameter of the trunk (`base_model_prefix`) is an
    error: the files belong to another architecture."""
    import copy

    known = known or {}
    missing = [
        n for n, _ in model.named_parameters() if n not in known and _stored_name(model, n, files) is None
    ]
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    trunk = [n for n in missing if n.startswith(prefix)]
    if trunk:
        raise WeightsError(
            f"the model's safetensors lack {len(trunk)} trunk parameter(s) ({', '.join(trunk[:3])} ...): "
            "model.path must be a folder of this architecture's weights"
        )
    fresh: dict[str, torch.Tensor] = dict(known)
    owners = {n.rsplit(".", 1)[0] if "." in n else "" for n in missing}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for owner in sorted(owners):
            module = copy.deepcopy(model.get_submodule(owner)).to_empty(device="cpu")
            model._init_weights(module)
            for leaf, value in module.named_parameters(recurse=False):
                name = f"{owner}.{leaf}" if owner else leaf
                if name in missing:
                    fresh[name] = value.detach().float()
    return fresh


def _local_rows(param: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(this rank's tensor of `param`, the global index of its first row along dim 0)."""
    if isinstance(param, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        local = param.to_local()
        _, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        return local, (offset[0] if offset else 0)
    return param.data, 0


READ_CHUNK_BYTES = 32 * 2**20  # the most a rank holds besides its shards while it loads


def _row_bytes(stored: StoredTensor) -> int:
    row = stored.dtype.itemsize
    for d in stored.shape[1:]:
        row *= d
    return row


def _read_into(f, offset: int, out: torch.Tensor) -> None:
    """Fill the contiguous CPU tensor `out` with the file's bytes at `offset` (no intermediate copy)."""
    f.seek(offset)
    view = memoryview(out.view(-1).view(torch.uint8).numpy())
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise WeightsError(f"{f.name}: truncated (wanted {len(view)} bytes at {offset})")
        got += n


def read_rows_into(stored: StoredTensor, start: int, out: torch.Tensor) -> None:
    """Rows [start, start + len(out)) along dim 0 of a stored tensor into `out` (this rank's shard): read
    straight into it when it is a contiguous host tensor of the stored dtype, else through a buffer of at
    most READ_CHUNK_BYTES at a time (another dtype, or a GPU shard)."""
    row = _row_bytes(stored)
    rows = out.shape[0] if out.dim() else 1
    with open(stored.file, "rb", buffering=0) as f:
        if out.device.type == "cpu" and out.dtype == stored.dtype and out.is_contiguous():
            _read_into(f, stored.offset + start * row, out)
            return
        step = max(1, READ_CHUNK_BYTES // max(row, 1))
        flat = out.view(rows, -1) if out.dim() else out.view(1, 1)
        for first in range(0, rows, step):
            n = min(step, rows - first)
            buf = torch.empty((n, flat.shape[1]), dtype=stored.dtype)
            _read_into(f, stored.offset + (start + first) * row, buf)
            flat[first : first + n].copy_(buf)


@torch.no_grad()
def materialize(
    model: nn.Module,
    files: dict[str, StoredTensor],
    fresh: dict[str, torch.Tensor],
    device: torch.device,
    buffer_device: torch.device | None = None,
) -> None:
    """Give the (FSDP2-sharded, meta) parameters storage on `device` and fill each rank's rows from the files
    (`fresh` for those they lack); buffers keep their constructor values, on `buffer_device` (default
    `device`; the GPU when parameters are offloaded to the host)."""
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    model.to_empty(device=device)
    buffer_device = buffer_device or device
    for name, saved in buffers.items():
        owner, leaf = name.rsplit(".", 1) if "." in name else ("", name)
        module = model.get_submodule(owner)
        module._buffers[leaf] = saved.to(buffer_device)
    for name, param in model.named_parameters():
        local, start = _local_rows(param)
        if local.numel() == 0:
            continue
        rows = local.shape[0] if local.dim() else 1
        key = _stored_name(model, name, files)
        if key is None:
            src = fresh[name][start : start + rows] if local.dim() else fresh[name]
        else:
            stored = files[key]
            if tuple(stored.shape) != tuple(param.shape):
                raise WeightsError(
                    f"{key}: stored shape {stored.shape} but the model's is {tuple(param.shape)}"
                )
            read_rows_into(stored, start if local.dim() else 0, local)
            continue
        local.copy_(src.to(local.dtype).reshape(local.shape))
