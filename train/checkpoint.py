"""What a training step puts into a checkpoint and takes back out: the policy's (and critic's) DCP shards,
the HF export (or the PEFT adapter folder under LoRA), the schedulers, every rank's RNG state and the rest
of the trainer state. The format itself (names, manifest, commit, completeness, pruning, resuming) is
infra/checkpoint/'s, the one owner: this module asks it for every name and path and commits through it.

- the ranks wait for each other during a save in a gloo group with an I/O-sized timeout
  (`train.policy.distributed.io_group`), never in an NCCL collective whose watchdog ends the job after 10
  minutes; every rank writes its own DCP shards and its share of the HF export.
- a save that fails (a full disk, a quota, a lost mount) removes its temporary folder and raises
  `CheckpointError` with one line saying what ran out; the run's older steps are untouched.
"""

from __future__ import annotations

import errno
import random
import shutil
import time
import uuid
from pathlib import Path

from infra.checkpoint.commit import (  # noqa: F401  (the writer's and the loop's names, one import away)
    CheckpointError,
    atomic_write,
    clean_stale,
    commit,
    load_trainer_state,
    prune,
    remove_checkpoint,
    resume_point,
    wait_for_pruning,
)
from infra.checkpoint.layout import (  # noqa: F401
    CRITIC,
    LATEST,
    LEGACY_CRITIC,
    STATE,
    TMP,
    TRAINER_STATE,
    checkpoints_root,
    hf_dir,
    latest_checkpoint,
    list_checkpoints,
    read_meta,
    step_dir,
    step_name,
)
from train.preemption import exceptions_in, preempted_in


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
        commit(tmp, final, meta, fsync=fsync)
        atomic_write(root / LATEST, final.name, fsync=fsync)
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
