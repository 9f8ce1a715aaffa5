"""Writing and reading a LoRA adapter folder (PEFT format): the checkpoint convention training writes under `policy.lora`
and the evals, model resolution and later stages read.

A folder is an adapter when it holds `adapter_config.json` (+ `adapter_model.safetensors`), which names
the base model it was trained on (`base_model_name_or_path`). Readers that need plain weights merge the
adapter onto that base (transformers + PEFT, the maintained library that wrote it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_MISMATCH = re.compile(r"size mismatch for (\S+): copying a param with shape torch\.Size\(\[([^\]]*)\]\).*?"
                       r"current model is torch\.Size\(\[([^\]]*)\]\)")  # fmt: skip


class AdapterFolderError(ValueError):
    """An adapter folder that cannot be read here (one line naming the folder and the fix)."""


def is_adapter_folder(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_config(folder: str | Path) -> dict:
    """An adapter folder's adapter_config.json, or AdapterFolderError saying why it cannot be read."""
    path = Path(folder) / ADAPTER_CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AdapterFolderError(f"{folder}: {ADAPTER_CONFIG} unreadable ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:  # cut short, not JSON, not UTF-8, nested too deep
        why = getattr(exc, "msg", None) or type(exc).__name__
        raise AdapterFolderError(
            f"{folder}: {ADAPTER_CONFIG} is not valid JSON ({why}); copy it again"
        ) from None
    if not isinstance(config, dict):
        raise AdapterFolderError(f"{folder}: {ADAPTER_CONFIG} holds a {type(config).__name__}, not an object")
    return config


def adapter_base(folder: str | Path) -> Path:
    """The base model an adapter folder was trained on (its config's base_model_name_or_path): an HF model
    folder here, else AdapterFolderError naming the folder and the fix."""
    base = adapter_config(folder).get("base_model_name_or_path")
    if not isinstance(base, str) or not base or "\0" in base or not Path(base).is_dir():
        raise AdapterFolderError(
            f"{folder}: the LoRA adapter's base model {base!r} is not a folder here; "
            "export the checkpoint with save_hf_merged=true to read it without its base"
        )
    if is_adapter_folder(base):
        raise AdapterFolderError(
            f"{folder}: its base model {base} is itself a LoRA adapter folder, not a model; point "
            "base_model_name_or_path at the model that adapter was trained on, or export it with save_hf_merged=true"
        )
    if not (Path(base) / "config.json").is_file():
        raise AdapterFolderError(
            f"{folder}: its base model {base} has no config.json: not an HF model folder"
        )
    return Path(base)


def check_weights(folder: str | Path) -> None:
    """The adapter's weights file is there and whole (its safetensors header read, its size checked against
    the offsets the header records), else AdapterFolderError naming what is wrong."""
    path = Path(folder) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise AdapterFolderError(
            f"{folder}: no {ADAPTER_WEIGHTS} beside {ADAPTER_CONFIG} (a copy cut short?); copy the whole folder"
        )
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if size < 8 or n > size - 8:
                raise ValueError("its header is cut short")
            header = json.loads(f.read(n))
        ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
        needed = 8 + n + max(ends, default=0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as exc:
        raise AdapterFolderError(f"{folder}: {ADAPTER_WEIGHTS} is not a safetensors file ({exc})") from None
    if size < needed:
        raise AdapterFolderError(
            f"{folder}: {ADAPTER_WEIGHTS} is cut short ({size:,} bytes, its header needs {needed:,}); copy it again"
        )


def write_adapter_folder(folder: str | Path, tensors: dict, peft_config, base_model: str | Path) -> Path:
    """An adapter folder PEFT and vLLM read: adapter_config.json (`peft_config`, naming `base_model`) +
    adapter_model.safetensors (`tensors`: PEFT's keys -> CPU tensors)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    peft_config.base_model_name_or_path = str(Path(base_model).resolve())
    peft_config.save_pretrained(str(folder))
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, folder / ADAPTER_WEIGHTS, metadata={"format": "pt"}
    )
    return folder


def merged_model_from_adapter(folder: str | Path, dtype=None):
    """The base model with an adapter folder merged in: for readers that need plain weights. Any folder
    that cannot be merged is one AdapterFolderError line naming the folder and what is wrong."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = adapter_base(folder)
    check_weights(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype or torch.float32)
    except Exception as exc:  # noqa: BLE001 - a damaged base: one line, not a library's traceback
        raise AdapterFolderError(
            f"{folder}: its base model {base} cannot be loaded: {_one_line(exc)}"
        ) from None
    try:
        return PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    except RuntimeError as exc:
        found = _MISMATCH.search(str(exc))
        if found is None:
            raise AdapterFolderError(f"{folder}: cannot be merged onto {base}: {_one_line(exc)}") from None
        name, theirs, ours = found.groups()
        raise AdapterFolderError(
            f"{folder}: trained on another base model than {base} ({name.removeprefix('base_model.model.')} is "
            f"[{theirs}] in the adapter, [{ours}] in that base); set base_model_name_or_path in "
            f"{ADAPTER_CONFIG} to the model it was trained on"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a config PEFT refuses (wrong types, unknown values): one line
        raise AdapterFolderError(f"{folder}: cannot be merged onto {base}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {text[:200]}"
