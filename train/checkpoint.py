"""Checkpoints: `<run_dir>/checkpoints/step_000010/{hf/, trainer_state.pt, meta.json}`.

`hf/` is a plain HF model folder (config, safetensors, tokenizer) that vLLM, transformers and the
eval packages read directly. `trainer_state.pt` holds what resuming needs (optimizer, scheduler, RNG
states of every rank, step, data position, MLflow run id). A checkpoint is written under a temporary
name and renamed when complete, so readers never see half of one; `checkpoints/latest` names the newest.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from train.policy.distributed import all_gather_objects, barrier

LATEST = "latest"
PREFIX = "step_"


class CheckpointError(RuntimeError):
    pass


def checkpoints_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_name(step: int) -> str:
    return f"{PREFIX}{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first (temporary folders are not listed)."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(PREFIX) and (p / "meta.json").is_file():
            found.append((int(p.name[len(PREFIX) :]), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    root = checkpoints_root(run_dir)
    pointer = root / LATEST
    if pointer.is_file():
        target = root / pointer.read_text().strip()
        if (target / "meta.json").is_file():
            return target
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    policy,
    tokenizer,
    trainer_state: dict,
    keep_last: int | None = None,
    source_model: str | Path | None = None,
) -> Path | None:
    """Collective: every rank calls it. Rank 0 writes; returns the checkpoint path on rank 0."""
    model_state = policy.full_state_dict()
    optim_state = policy.optimizer_state()
    rngs = all_gather_objects(rng_state())
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    final = checkpoints_root(run_dir) / step_name(step)
    if rank == 0:
        root = checkpoints_root(run_dir)
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".tmp-{step_name(step)}-{uuid.uuid4().hex[:8]}"
        hf = tmp / "hf"
        hf.mkdir(parents=True)
        config = policy.config
        tied = bool(getattr(config, "tie_word_embeddings", False))
        tensors = {
            k: v.detach().contiguous() for k, v in model_state.items() if not (tied and k == "lm_head.weight")
        }
        save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
        config.use_cache = True
        config.save_pretrained(hf)
        config.use_cache = False
        tokenizer.save_pretrained(hf)
        if source_model is not None and (Path(source_model) / "generation_config.json").is_file():
            shutil.copy(Path(source_model) / "generation_config.json", hf / "generation_config.json")
        torch.save(
            {
                "optimizer": optim_state,
                "scheduler": policy.scheduler.state_dict(),
                "rng": rngs,
                **trainer_state,
            },
            tmp / "trainer_state.pt",
        )
        meta = {"step": step, "time": time.time(), "world_size": len(rngs)}
        meta.update({k: v for k, v in trainer_state.items() if isinstance(v, (int, float, str))})
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if final.exists():  # a re-run of the same step after a resume replaces the old copy
            shutil.rmtree(final)
        os.replace(tmp, final)
        _atomic_write(root / LATEST, final.name)
        if keep_last:
            for _, old in list_checkpoints(run_dir)[:-keep_last]:
                shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final if rank == 0 else None


def load_trainer_state(ckpt: str | Path) -> dict:
    path = Path(ckpt) / "trainer_state.pt"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {ckpt} has no trainer_state.pt: it cannot be resumed from")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or corrupt file
        raise CheckpointError(
            f"checkpoint {path} is unreadable ({exc}); delete it to resume from an older one"
        ) from exc
