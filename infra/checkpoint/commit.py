"""Writing a step so that readers never see half of one, and deleting one so that no gutted step remains:
the write side of the layout infra/checkpoint/layout.py names (what goes into a step is the writer's:
train/checkpoint.py for training).

- a step is written under a temporary name (`.tmp-step_N-<id>`); `commit` writes its META file last with
  the manifest (every file, relative path -> size) and the checksums of each file's ends, fsyncs every
  file and folder, then renames it to `step_N` (and fsyncs the parent).
- a step is removed (replaced by a re-run of its step, or pruned by `keep_last`) by renaming it to
  `.trash-step_N-<id>` first, then deleting that (pruned steps in a background thread).
- stale temporary and trash folders are deleted at the start of the next save (and of a training run).
- `resume_point` is the newest complete step whose trainer state loads.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from infra.checkpoint.layout import (
    CHECKSUMS,
    LATEST,
    MANIFEST,
    META,
    TMP,
    TRAINER_STATE,
    TRASH,
    checkpoints_root,
    damage,
    ends_checksum,
    latest_checkpoint,
    list_checkpoints,
    manifest,
    step_folders,
    step_of,
)


class CheckpointError(RuntimeError):
    pass


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    """fsync every file, then every folder bottom-up (its entries), `folder` itself last. On a local file
    system this also flushes files other processes (other ranks) wrote."""
    for dirpath, _, filenames in os.walk(folder, topdown=False):
        for name in filenames:
            _fsync(Path(dirpath) / name)
        _fsync(Path(dirpath))


def atomic_write(path: Path, text: str, fsync: bool = True) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.write_text(text)
    if fsync:
        _fsync(tmp)
    os.replace(tmp, path)
    if fsync:
        _fsync(path.parent)


def _is_stale(name: str) -> bool:
    return name.startswith((TMP, TRASH, f".{LATEST}."))


def clean_stale(run_dir: str | Path) -> list[str]:
    """Delete what killed saves and deletions left (temporary and trash folders, a half-written
    `latest`); only the run's one writer calls it. Returns the names deleted."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    wait_for_pruning()
    gone = []
    for p in root.iterdir():
        if _is_stale(p.name):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            gone.append(p.name)
    return sorted(gone)


def _to_trash(checkpoint: Path) -> Path:
    """Rename a step folder out of the readers' sight (one atomic step); delete the result after."""
    trash = checkpoint.with_name(f"{TRASH}{checkpoint.name}-{uuid.uuid4().hex[:8]}")
    os.replace(checkpoint, trash)
    return trash


def remove_checkpoint(checkpoint: str | Path) -> None:
    """Delete a step folder so that a kill at any point leaves no gutted step: rename, then delete."""
    shutil.rmtree(_to_trash(Path(checkpoint)), ignore_errors=True)


_pruning: list = []  # the background deletion of pruned steps, at most one at a time


def prune(run_dir: str | Path, keep_last: int) -> list[Path]:
    """Keep the newest `keep_last` complete steps: the older ones are renamed to the trash now (atomic, instant:
    readers stop seeing them), their files deleted by a background thread (torchtitan's checkpoint manager
    purges the same way), so that a slow file system never keeps rank 0 from the next collective while the
    other ranks wait in it. A kill during the deletion leaves only trash, which the next save (or run)
    deletes. Returns the trash folders."""
    wait_for_pruning()
    trash = [_to_trash(old) for _, old in list_checkpoints(run_dir)[:-keep_last]]
    if trash:
        import threading

        def delete() -> None:
            for t in trash:
                shutil.rmtree(t, ignore_errors=True)

        thread = threading.Thread(target=delete, name="checkpoint-prune")  # not a daemon: exit waits for it
        thread.start()
        _pruning.append(thread)
    return trash


def wait_for_pruning() -> None:
    """Block until the background deletion of pruned steps (if any) is done."""
    while _pruning:
        _pruning.pop().join()


def commit(tmp: Path, final: Path, meta: dict, fsync: bool = True) -> None:
    """Make the temporary folder `tmp` (every file of the step written) the complete step `final`:
    the META file with the manifest last, everything fsynced, an older copy of the step moved to the
    trash, the rename, its parent fsynced, then the older copy deleted."""
    files = manifest(tmp)
    meta = {**meta, MANIFEST: files, CHECKSUMS: {rel: ends_checksum(tmp / rel) for rel in files}}
    (tmp / META).write_text(json.dumps(meta, indent=1))
    if fsync:
        _fsync_tree(tmp)
    old = _to_trash(final) if final.exists() else None  # a re-run of the same step after a resume
    os.replace(tmp, final)
    if fsync:
        _fsync(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def resume_point(run_dir: str | Path, warn=print) -> tuple[Path, dict] | None:
    """(checkpoint, trainer state) to resume a run from: the latest complete step whose trainer state
    loads, else the next older one (each skipped one, damaged or unloadable, named through `warn`); None
    when the run has no checkpoint. Raises CheckpointError when it has some but none is whole and loads."""
    latest = latest_checkpoint(run_dir, warn=warn)
    if latest is None:
        damaged = [f"{p.name} ({damage(p)})" for _, p in step_folders(checkpoints_root(run_dir))]
        if damaged:  # not a fresh run: starting over from step 0 would silently throw its work away
            raise CheckpointError(f"no checkpoint of {run_dir} can be resumed from: {'; '.join(damaged)}")
        return None
    newest = step_of(latest)
    older = [p for s, p in reversed(list_checkpoints(run_dir)) if s < newest]
    errors = []
    for candidate in [latest, *older]:
        try:
            return candidate, load_trainer_state(candidate)
        except CheckpointError as exc:
            errors.append(str(exc))
            warn(f"cannot resume from {candidate} ({exc}); trying an older checkpoint")
    raise CheckpointError(f"no checkpoint of {run_dir} can be resumed from: {'; '.join(errors)}")


def load_trainer_state(ckpt: str | Path) -> dict:
    path = Path(ckpt) / TRAINER_STATE
    if not path.is_file():
        raise CheckpointError(f"checkpoint {ckpt} has no {TRAINER_STATE}: it cannot be resumed from")
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or corrupt file
        raise CheckpointError(
            f"checkpoint {path} is unreadable ({exc}); delete it to resume from an older one"
        ) from exc
