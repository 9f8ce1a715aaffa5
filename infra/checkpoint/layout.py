"""The checkpoint layout: `<run_dir>/checkpoints/step_000010/{hf/, state/, trainer_state.pt, meta.json}`.

This module names that layout and reads it (infra/checkpoint/commit.py writes it): every other module
(training's writer in train/checkpoint.py, loops, pipeline, model resolution, evals, watchers) asks it for
a step's folder, its HF folder, completeness, the latest or the list, and never spells `hf`, `meta.json`
or the step folder's name itself. It imports neither torch nor train.

`hf/` is a plain HF model folder (config, safetensors, tokenizer) that vLLM, transformers and the eval
packages read directly. `state/` holds the policy's `torch.distributed.checkpoint` shards, `critic/` (PPO
with a critic only) the value model's, `trainer_state.pt` the rest of what resuming needs. `meta.json` is
written last and carries the manifest (`files`: relative path -> size) and the checksums of each file's
ends (`crc32_ends`).

- `damage` / `is_complete` is the one completeness check: meta.json readable, every manifest file present
  with exactly its recorded size, and the cheap checksum meta.json records (CRC-32 of each file's first
  and last 64 KiB: whole small files, the ends of big shards) matching; a step of the older writer (no
  manifest) needs `hf/config.json`, `hf/model.safetensors` and `trainer_state.pt`.
- `latest_checkpoint` and the evals' resolution use the newest complete step, naming each newer damaged
  one in one line (`warn`).
- a step being written is `.tmp-step_N-<id>`, one being deleted `.trash-step_N-<id>` (readers never list
  either); `checkpoints/latest` names the newest one written (for people and other tools).
"""

from __future__ import annotations

import json
import math
import os
import stat
import zlib
from collections.abc import Callable
from pathlib import Path

# no torch here: the layout helpers serve planners and watchers that never load a model.

LATEST = "latest"
PREFIX = "step_"
HF = "hf"  # the plain HF model folder of a checkpoint
META = "meta.json"  # written last, with the manifest of the files the step needs
TRAINER_STATE = "trainer_state.pt"
MANIFEST = "files"  # meta.json key: {relative path: size in bytes} of every file of the step
CHECKSUMS = "crc32_ends"  # meta.json key: {relative path: CRC-32 of its first and last END_BYTES}
END_BYTES = 64 * 1024
TMP = ".tmp-"  # a checkpoint being written: .tmp-step_000010-<id>
TRASH = ".trash-"  # a checkpoint being deleted: .trash-step_000010-<id>
LEGACY_FILES = (f"{HF}/config.json", f"{HF}/model.safetensors", TRAINER_STATE)  # steps without a manifest
STATE = "state"  # DCP shards of the policy's model and optimizer (every rank writes its own)
CRITIC = "critic"  # PPO with a critic: DCP shards of the value model and its optimizer
LEGACY_CRITIC = "critic.pt"  # the same, full, as written before sharding


def checkpoints_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_name(step: int) -> str:
    return f"{PREFIX}{step:06d}"


def step_dir(run_dir: str | Path, step: int) -> Path:
    """The folder checkpoint `step` of a run has (or will have) once complete."""
    return checkpoints_root(run_dir) / step_name(step)


def hf_dir(checkpoint: str | Path) -> Path:
    """The HF model folder inside a checkpoint (step) folder."""
    return Path(checkpoint) / HF


def damage(checkpoint: str | Path) -> str | None:
    """Why a step folder is not a complete checkpoint (None: it is): meta.json unreadable, or a file of
    its manifest missing, of another size than recorded, or with other bytes at its ends than the
    checksum recorded; a step written before manifests existed needs LEGACY_FILES, not empty."""
    p = Path(checkpoint)
    try:
        meta = read_meta(p)
    except (OSError, ValueError) as exc:
        return f"{META} unreadable ({getattr(exc, 'strerror', None) or exc})"
    except RecursionError:
        return f"{META} unreadable (nested too deep)"
    why = _meta_problem(meta)
    if why is not None:
        return why
    files = meta.get(MANIFEST)
    sums = meta.get(CHECKSUMS) or {}
    if files is None:
        files = dict.fromkeys(LEGACY_FILES, None)
    for rel, size in files.items():
        try:
            st = (p / rel).stat()
        except OSError:
            return f"{rel} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{rel} is not a file"
        if size is None and st.st_size == 0:
            return f"{rel} is empty"
        if size is not None and st.st_size != size:
            return f"{rel} is {st.st_size:,} bytes, {META} records {size:,}"
        if rel in sums:
            try:
                if ends_checksum(p / rel) != sums[rel]:
                    return f"{rel} has other bytes than when it was saved (checksum of its ends differs)"
            except OSError as exc:
                return f"{rel} is unreadable ({exc.strerror or exc})"
    return None


def _number(value, kind=int) -> bool:
    return (
        isinstance(value, kind)
        and not isinstance(value, bool)
        and (kind is not float or math.isfinite(value))
    )


def _meta_problem(meta) -> str | None:
    """Why a parsed meta.json cannot describe a step (a field of the wrong type, a manifest naming a
    file outside the step), or None."""
    if not isinstance(meta, dict):
        return f"{META} holds {type(meta).__name__}, not an object"
    if "step" in meta and not (_number(meta["step"]) and meta["step"] >= 0):
        return f"{META}'s step is {str(meta['step'])[:40]!r}, not a step number"
    if "time" in meta and not (
        (_number(meta["time"]) and abs(meta["time"]) < 2**63) or _number(meta["time"], float)
    ):
        return f"{META}'s time is {str(meta['time'])[:40]!r}, not a time"
    files, sums = meta.get(MANIFEST), meta.get(CHECKSUMS)
    for name, value in ((MANIFEST, files), (CHECKSUMS, sums)):
        if value is not None and not isinstance(value, dict):
            return f"{META}'s {name} is {type(value).__name__}, not a mapping of files"
    for rel, size in (files or {}).items():
        parts = Path(rel).parts
        if not rel or Path(rel).is_absolute() or ".." in parts:
            return f"{META}'s {MANIFEST} names {rel[:60]!r}, not a file inside the step"
        if not (_number(size) and size >= 0):
            return f"{META}'s {MANIFEST} records {str(size)[:40]!r} bytes for {rel[:60]}"
    bad = next((rel for rel, crc in (sums or {}).items() if not isinstance(crc, str)), None)
    if bad is not None:
        return f"{META}'s {CHECKSUMS} entry for {bad[:60]!r} is not a checksum"
    return None


def is_complete(checkpoint: str | Path) -> bool:
    """Every file the step needs is there, whole (see `damage`). A folder gutted by a kill inside a
    deletion, or a file cut short, is not complete."""
    return damage(checkpoint) is None


def ends_checksum(path: str | Path) -> str:
    """CRC-32 of a file's first and last END_BYTES (the whole file when smaller): reads at most 128 KiB,
    so checking every step of a run stays cheap, and catches a tail lost or zero-filled by a crash."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        crc = zlib.crc32(f.read(END_BYTES))
        if size > END_BYTES:
            f.seek(max(END_BYTES, size - END_BYTES))
            crc = zlib.crc32(f.read(END_BYTES), crc)
    return f"{crc:08x}"


def manifest(folder: str | Path) -> dict[str, int]:
    """Every file under a checkpoint folder being written but meta.json: relative path -> size."""
    root = Path(folder)
    return {
        p.relative_to(root).as_posix(): p.stat().st_size
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).as_posix() != META
    }


def is_step_dir(path: str | Path) -> bool:
    """A step folder by name or by content (complete or not)."""
    p = Path(path)
    return p.name.startswith(PREFIX) or is_complete(p)


def is_run_dir(path: str | Path) -> bool:
    return checkpoints_root(path).is_dir()


def read_meta(checkpoint: str | Path) -> dict:
    return json.loads((Path(checkpoint) / META).read_text())


def step_of(checkpoint: str | Path) -> int:
    """The step of a complete checkpoint (its meta.json; the folder name for older ones)."""
    p = Path(checkpoint)
    return int(read_meta(p).get("step", p.name[len(PREFIX) :]))


def checkpoint_of(path: str | Path) -> Path | None:
    """The step folder a path designates: the step folder itself or its HF folder; None otherwise."""
    p = Path(path)
    if is_step_dir(p):
        return p
    if p.name == HF and is_step_dir(p.parent):  # a damaged step's hf/ is that step, not a bare model
        return p.parent
    return None


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first (temporary folders are not listed)."""
    return [(s, p) for s, p in step_folders(checkpoints_root(run_dir)) if is_complete(p)]


def latest_checkpoint(run_dir: str | Path, warn: Callable[[str], None] | None = None) -> Path | None:
    """The newest complete step of a run (None: none). Each newer step folder that is damaged (a file
    cut short or missing: see `damage`) is skipped and, with `warn`, named in one line."""
    damaged = []
    for _, p in reversed(step_folders(checkpoints_root(run_dir))):
        why = damage(p)
        if why is None:
            for bad, reason in damaged if warn is not None else ():
                warn(f"checkpoint {bad} is damaged ({reason}); using {p.name} instead")
            return p
        damaged.append((p, why))
    for bad, reason in damaged if warn is not None else ():
        warn(f"checkpoint {bad} is damaged ({reason}); no older complete checkpoint")
    return None


def step_folders(root: Path) -> list[tuple[int, Path]]:
    """Every `step_N` folder (complete or not), oldest first."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit():
            found.append((int(p.name[len(PREFIX) :]), p))
    return sorted(found)
