"""Reading a LoRA adapter folder (PEFT format): the checkpoint convention training writes under `policy.lora`
and the evals, model resolution and later stages read.

A folder is an adapter when it holds `adapter_config.json` (+ `adapter_model.safetensors`), which names
the base model it was trained on (`base_model_name_or_path`). Readers that need plain weights merge the
adapter onto that base (transformers + PEFT, the maintained library that wrote it).
"""

from __future__ import annotations

import json
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


class AdapterFolderError(ValueError):
    """An adapter folder that cannot be read here (one line naming the folder and the fix)."""


def is_adapter_folder(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(folder: str | Path) -> Path:
    """The base model an adapter folder was trained on (its config's base_model_name_or_path)."""
    config = json.loads((Path(folder) / ADAPTER_CONFIG).read_text())
    base = config.get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise AdapterFolderError(
            f"{folder}: the LoRA adapter's base model {base!r} is not a folder here; "
            "export the checkpoint with save_hf_merged=true to read it without its base"
        )
    return Path(base)


def merged_model_from_adapter(folder: str | Path, dtype=None):
    """The base model with an adapter folder merged in: for readers that need plain weights."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(adapter_base(folder)), dtype=dtype or torch.float32)
    return PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
