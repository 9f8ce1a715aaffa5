"""Writing and resuming checkpoints, in the layout infra/checkpoint_layout.py owns (this module asks it
for every name and path, and for the completeness check).

`hf/` is a plain HF model folder (config, safetensors, tokenizer) that vLLM, transformers and the
eval packages read directly (under `policy.lora`: the PEFT adapter folder, adapter_config.json +
adapter_model.safetensors naming its base model, unless `save_hf_merged=true`), streamed out one gathered parameter at a time, in `save_hf_dtype`
(float32: the master weights; bfloat16: half the bytes). `state/` is the policy's model and optimizer
state as `torch.distributed.checkpoint` shards: every rank writes its own slices (no rank ever holds the
whole model or AdamW state), and a job of any world size reads them back resharded. `critic/` (PPO with
a critic only) holds the value model's the same way. The trainer state (`TRAINER_STATE`) holds the rest
of what resuming needs (schedulers, RNG states of every rank, step, data position, MLflow run id). Steps written before
sharding (optimizer inside the trainer state, `LEGACY_CRITIC`) still resume.

Surviving kill -9 and power loss:
- a checkpoint is written under a temporary name (`.tmp-step_N-<id>`); its `META` file is written last and
  carries the manifest (`files`: every file the step needs, relative path -> size); every file and folder
  is fsynced, then the folder is renamed to `step_N` (and its parent fsynced), so readers never see half
  of one. Any layout (a DCP shard folder too) plugs in by writing its files into the temporary folder
  before `_commit`: the manifest lists whatever is there.
- completeness (`damage` / `is_complete`) and the newest complete step are infra/checkpoint_layout.py's: a
  file cut short (a full disk, a node lost mid-write) makes its step damaged; `resume_point` skips it.
- a save that fails (a full disk, a quota, a lost mount) removes its temporary folder and raises
  `CheckpointError` with one line saying what ran out; the run's older steps are untouched.
- a step folder is removed (replaced by a re-run of its step, or pruned by `keep_last`) by renaming it to
  `.trash-step_N-<id>` first, then deleting that (pruned steps in a background thread): a kill inside the
  deletion leaves no gutted step.
- the ranks wait for each other during a save in a gloo group with an I/O-sized timeout
  (`train.policy.distributed.io_group`), never in an NCCL collective whose watchdog ends the job after 10
  minutes; every rank writes its own DCP shards and its share of the HF export.
- stale temporary and trash folders are deleted at the start of the next save (and of a training run).
- `checkpoints/latest` names the newest one written (for people and other tools; readers scan the steps).
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import time
import uuid
from pathlib import Path

from infra.checkpoint_layout import (
    CHECKSUMS,
    CRITIC,
    LATEST,
    LEGACY_CRITIC,
    MANIFEST,
    META,
    STATE,
    TMP,
    TRAINER_STATE,
    TRASH,
    checkpoints_root,
    damage,
    ends_checksum,
    hf_dir,
    latest_checkpoint,
    list_checkpoints,
    manifest,
    step_folders,
    step_name,
    step_of,
)
from train.preempted import exceptions_in, preempted_in


class CheckpointError(RuntimeError):
    pass


def rng_state() -> dict:
    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


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


def _atomic_write(path: Path, text: str, fsync: bool = True) -> None:
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


def _commit(tmp: Path, final: Path, meta: dict, fsync: bool = True) -> None:
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


def save_checkpoint(run_dir: str | Path, step: int, *args, **kwargs) -> Path | None:
    """Collective: every rank calls it and writes its own shards; rank 0 writes the rest and commits.
    Returns the checkpoint path on rank 0 (arguments: `_write_checkpoint`).

    All ranks agree on the outcome: when any rank's write fails (a full disk, a quota, a lost mount),
    the temporary folder is removed and every rank raises one `CheckpointError` line saying what ran
    out; the run's older steps are untouched."""
    from train.policy.distributed import all_gather_objects, io_group

    try:
        path, failure = _write_checkpoint(run_dir, step, *args, **kwargs), None
    except BaseException as exc:  # DCP's CheckpointException is a BaseException; every rank must agree
        stop = preempted_in(exc)
        if stop is not None:  # abandoned past the preemption budget: the run ends preempted (KILLED)
            raise stop from None
        path, failure = None, _save_failure(exc, checkpoints_root(run_dir))
        if failure is None:
            raise
    # also the end-of-save barrier, in the I/O group (gloo, I/O timeout): never NCCL's 10-minute watchdog
    failures = [f for f in all_gather_objects(failure, group=io_group()) if f]
    if not failures:
        return path
    root = checkpoints_root(run_dir)
    written = 0
    if path is not None or _rank() == 0:
        for tmp in root.glob(f"{TMP}{step_name(step)}-*"):  # this run has one writer: the folder is ours
            written += sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file())
            shutil.rmtree(tmp, ignore_errors=True)
    raise CheckpointError(
        f"checkpoint step {step} not saved: {failures[0]} ({_space(root, written)}); its temporary folder "
        "was removed, the run's earlier checkpoints are intact"
    )


def _rank() -> int:
    import torch

    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _save_failure(exc: BaseException, root: Path) -> str | None:
    """One line for a save that failed on an OS error (the first one in the exception's chain, DCP's
    per-rank failures included), e.g. "no space left on device writing .../state/__0_0.distcp", or on a
    full file system (torch's C++ writers report a full disk as "file write failed" or "unexpected pos",
    without the errno); None for any other failure (a bug: the caller re-raises it)."""
    for e in exceptions_in(exc):
        if isinstance(e, OSError):
            what = (e.strerror or str(e)).lower() if e.errno != errno.ENOSPC else "no space left on device"
            where = e.filename or ""
            return f"{what} writing {where}".strip() if where else what
    try:
        usage = shutil.disk_usage(root)
    except OSError:
        return None
    if usage.free < max(2**20, usage.total // 100):
        return f"no space left on device: the file system of {root} is full"
    return None


def _space(path: Path, written: int) -> str:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return f"{written / 2**20:,.1f} MiB written before it failed"
    return (f"{written / 2**20:,.1f} MiB written before it failed; the file system holds "
            f"{usage.total / 2**20:,.1f} MiB, {usage.free / 2**20:,.1f} MiB free now")  # fmt: skip


def _write_checkpoint(
    run_dir: str | Path,
    step: int,
    policy,
    tokenizer,
    trainer_state: dict,
    keep_last: int | None = None,
    source_model: str | Path | None = None,
    critic=None,
    fsync: bool = True,
    hf_dtype: str = "float32",
    hf_merged: bool = False,
) -> Path | None:
    """The writes of `save_checkpoint` (which ends with the ranks' agreement, the final barrier).

    `critic` (a `train.policy.critic.Critic`, or None) is saved beside the policy (`restore_critic`).
    `fsync=False` only to measure what the fsyncs cost (a power loss may then leave a bad step).
    Under LoRA (`policy.lora.enabled`) `hf/` is the PEFT adapter folder, or with `hf_merged` the base
    model with the adapters merged in; `state/` holds the adapters and their optimizer state."""
    import torch

    from train.policy.distributed import all_gather_objects, barrier, io_group
    from train.policy.sharded_state import export_adapter, export_hf, save_sharded

    started = time.monotonic()
    group = io_group()  # the ranks wait for rank 0's file work here (gloo, I/O timeout), never in NCCL
    rngs = all_gather_objects(rng_state(), group=group)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    root = checkpoints_root(run_dir)
    final = root / step_name(step)
    tmp = root / f"{TMP}{step_name(step)}-{all_gather_objects(uuid.uuid4().hex[:8], group=group)[0]}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        clean_stale(run_dir)
        tmp.mkdir()
    barrier(group)
    save_sharded(policy, tmp / STATE)
    if critic is not None:
        save_sharded(critic, tmp / CRITIC)
    generation_config = Path(source_model) / "generation_config.json" if source_model is not None else None
    extras = (generation_config,) if generation_config is not None else ()
    lora = getattr(policy, "lora", None)
    if lora is not None and lora.enabled and not hf_merged:
        export_adapter(policy, hf_dir(tmp), tokenizer, extra_files=extras)
    else:
        export_hf(policy, hf_dir(tmp), tokenizer, dtype=hf_dtype, extra_files=extras)
    if rank == 0:
        schedulers = {"scheduler": policy.scheduler.state_dict()}
        if critic is not None:
            schedulers["critic_scheduler"] = critic.scheduler.state_dict()
        torch.save({**schedulers, "rng": rngs, **trainer_state}, tmp / TRAINER_STATE)
        meta = {"step": step, "time": time.time(), "world_size": len(rngs), "hf_dtype": hf_dtype,
                "save_s": round(time.monotonic() - started, 3)}  # fmt: skip
        meta.update({k: v for k, v in trainer_state.items() if isinstance(v, (int, float, str))})
        _commit(tmp, final, meta, fsync=fsync)
        _atomic_write(root / LATEST, final.name, fsync=fsync)
        if keep_last is not None and keep_last >= 1:  # never the one just written (keep_last <= 0)
            prune(run_dir, keep_last)
    return final if rank == 0 else None


def restore_policy(checkpoint: str | Path, policy, trainer_state: dict, rank: int = 0) -> None:
    """Resume `policy` (built from the checkpoint's architecture, at any world size) from `checkpoint`:
    model and optimizer from the shards (the fp32 master weights, whatever dtype `hf/` was exported in),
    the schedule from the trainer state. Collective."""
    from train.policy.sharded_state import load_sharded

    state_dir = Path(checkpoint) / STATE
    if state_dir.is_dir():
        load_sharded(policy, state_dir)
        policy.scheduler.load_state_dict(trainer_state["scheduler"])
    else:  # a step written before sharding: full optimizer state in the trainer state, weights in hf/
        policy.load_optimizer_state(
            trainer_state["optimizer"] if rank == 0 else {}, trainer_state["scheduler"]
        )


def restore_critic(checkpoint: str | Path, critic, trainer_state: dict, rank: int = 0) -> None:
    """Resume the value model saved with `checkpoint` (CheckpointError if it has none: the run was not
    PPO with a critic). Collective."""
    from train.policy.sharded_state import load_sharded

    p = Path(checkpoint)
    if (p / CRITIC).is_dir():
        load_sharded(critic, p / CRITIC)
        critic.scheduler.load_state_dict(trainer_state["critic_scheduler"])
        return
    if not (p / LEGACY_CRITIC).is_file():
        raise CheckpointError(f"checkpoint {p} has no {CRITIC}/: it was not saved by a run with a critic")
    import torch

    saved = torch.load(p / LEGACY_CRITIC, map_location="cpu", weights_only=False)
    critic.load_model_state(saved["model"] if rank == 0 else {})
    critic.load_optimizer_state(saved["optimizer"] if rank == 0 else {}, saved["scheduler"])


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
