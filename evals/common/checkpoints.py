"""`--ckpt` resolution: a folder, an MLflow run id, a sweep name or `latest` -> checkpoints to evaluate.

- a checkpoint folder (`.../checkpoints/step_000010`, the infra/checkpoint/layout.py format, evaluated
  through its `hf/`), a run folder (its latest checkpoint, or `--step N`), or any HF model folder;
- an MLflow run id: its latest checkpoint (tag `rlpost.checkpoint_latest`) or `--step N`
  (tag `rlpost.checkpoint.<N>`); a sweep's parent run id means all its child runs;
- a sweep name (tag `rlpost.sweep`): the latest checkpoint (or `--step N`) of every training run of it;
- `latest`: the newest checkpoint any run in the store recorded.

Each result carries the MLflow run its metrics go to (None for a bare folder: the logger then uses an
eval-only run) and the step to log them at.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from infra.checkpoint import layout as ckpt
from infra.tracking import (
    CHECKPOINT_TAG,
    LATEST_CHECKPOINT_TAG,
    RUN_DIR_TAG,
    mlflow_client,
    store_exists,
    tag_filter,
    tracking_uri,
)

RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class CheckpointNotFound(ValueError):
    """A --ckpt that names no loadable checkpoint (one-line message naming it and the fix)."""


@dataclass(frozen=True)
class CheckpointRef:
    """One checkpoint to evaluate: `path` is an HF model folder; `step` None for a bare model folder."""

    path: Path
    run_id: str | None
    step: int | None
    name: str


def _client():
    return mlflow_client()


def _is_hf_folder(path: Path) -> bool:
    """An HF model folder, or a PEFT LoRA adapter folder (a `policy.lora` checkpoint's hf/: generation
    merges it onto its base, evals/common/generation.py)."""
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def step_folder_ref(folder: Path, run_id: str | None = None) -> CheckpointRef:
    """A `step_NNNNNN` folder in the layout of infra/checkpoint/layout.py."""
    why = ckpt.damage(folder)
    if why is not None:
        raise CheckpointNotFound(f"checkpoint {folder} is damaged or incomplete ({why}); pick another step")
    hf = ckpt.hf_dir(folder)
    if not _is_hf_folder(hf):
        raise CheckpointNotFound(
            f"checkpoint {folder} has no HF model or adapter folder ({hf}/config.json or adapter_config.json);"
            " it cannot be loaded"
        )
    step = ckpt.step_of(folder)
    run_dir = folder.parent.parent
    if run_id is None:
        run_id = _run_id_of_dir(run_dir)
    return CheckpointRef(hf.resolve(), run_id, step, f"{run_dir.name}-{ckpt.step_name(step)}")


def _run_id_of_dir(run_dir: Path) -> str | None:
    """The training run of a run folder: its `mlflow_run_id` file, else the run tagged with its path."""
    marker = run_dir / "mlflow_run_id"
    if marker.is_file():
        run_id = marker.read_text().strip()
        try:
            _client().get_run(run_id)
            return run_id
        except Exception:
            pass  # written by another store (another MLFLOW_TRACKING_URI): fall back to the tag search
    if not store_exists():
        return None  # looking a folder up must not create a store
    client = _client()
    exps = [e.experiment_id for e in client.search_experiments()]
    if not exps:
        return None
    where = str(run_dir.resolve())
    query = tag_filter(RUN_DIR_TAG, where)
    if query is None:  # both quote kinds in the path: compare in Python
        runs = client.search_runs(exps, f"tags.`{RUN_DIR_TAG}` != ''", max_results=10_000)
        runs = [r for r in runs if r.data.tags.get(RUN_DIR_TAG) == where]
    else:
        runs = client.search_runs(exps, query, max_results=1)
    return runs[0].info.run_id if runs else None


def _from_folder(path: Path, step: int | None) -> list[CheckpointRef]:
    path = path.resolve()
    step_folder = ckpt.checkpoint_of(path)
    if step_folder is not None:
        return [step_folder_ref(step_folder)]
    if ckpt.is_run_dir(path):
        found = dict(ckpt.list_checkpoints(path))
        if step is not None:
            if step not in found:
                raise CheckpointNotFound(
                    f"run folder {path} has no checkpoint for step {step} (has {sorted(found)})"
                )
            return [step_folder_ref(found[step])]
        latest = ckpt.latest_checkpoint(path, warn=_warn)
        if latest is None:
            raise CheckpointNotFound(f"run folder {path} has no complete checkpoint yet")
        return [step_folder_ref(latest)]
    if _is_hf_folder(path):
        return [CheckpointRef(path, None, None, path.name)]
    raise CheckpointNotFound(
        f"{path} is not a checkpoint: expected a step_N folder with hf/, a run folder, an HF model "
        "folder with config.json or a LoRA adapter folder with adapter_config.json"
    )


def _checkpoint_tags(tags: dict[str, str]) -> dict[int, Path]:
    out = {}
    for k, v in tags.items():
        if k.startswith(CHECKPOINT_TAG) and k[len(CHECKPOINT_TAG) :].isdigit():
            out[int(k[len(CHECKPOINT_TAG) :])] = Path(v)
    return out


def _from_run(run, step: int | None) -> CheckpointRef:
    run_id = run.info.run_id
    tags = run.data.tags
    by_step = {s: p for s, p in _checkpoint_tags(tags).items() if ckpt.is_complete(p)}
    if step is not None:
        recorded = _checkpoint_tags(tags).get(step)
        if step not in by_step and recorded is not None and recorded.is_dir():
            raise CheckpointNotFound(
                f"MLflow run {run_id}'s checkpoint {recorded} is damaged ({ckpt.damage(recorded)}); pick another step"
            )
        if step not in by_step:
            raise CheckpointNotFound(
                f"MLflow run {run_id} has no checkpoint on disk for step {step} (available: {sorted(by_step)})"
            )
        return step_folder_ref(by_step[step], run_id)
    newest = _newest_on_disk(run)
    if newest is None:
        raise CheckpointNotFound(f"MLflow run {run_id} recorded no complete checkpoint that exists on disk")
    return step_folder_ref(newest, run_id)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _newest_on_disk(run) -> Path | None:
    """The run's latest checkpoint when it is complete on disk, else (pruned, moved, damaged or gutted by
    a kill) the newest complete one it recorded; each newer damaged one is named in one line."""
    latest = run.data.tags.get(LATEST_CHECKPOINT_TAG)
    if latest and ckpt.is_complete(latest):
        return Path(latest)
    recorded = sorted(_checkpoint_tags(run.data.tags).items(), reverse=True)
    damaged = []
    for _, p in recorded:
        if not p.is_dir():
            continue  # pruned by keep_last, or moved: nothing to say
        why = ckpt.damage(p)
        if why is None:
            for bad, reason in damaged:
                _warn(
                    f"checkpoint {bad} of MLflow run {run.info.run_id} is damaged ({reason}); using {p.name}"
                )
            return p
        damaged.append((p, why))
    for bad, reason in damaged:
        _warn(f"checkpoint {bad} of MLflow run {run.info.run_id} is damaged ({reason}); no older one on disk")
    return None


def all_checkpoints_of_run(run) -> list[CheckpointRef]:
    """Every checkpoint an MLflow run recorded that is complete on disk, oldest first."""
    found = sorted((s, p) for s, p in _checkpoint_tags(run.data.tags).items() if ckpt.is_complete(p))
    return [step_folder_ref(p, run.info.run_id) for _, p in found]


def sweep_runs(sweep: str) -> list:
    """The training runs of a sweep (MLflow tag `rlpost.sweep`)."""
    return _sweep_runs(_client(), sweep)


def _all_experiments(client) -> list[str]:
    return [e.experiment_id for e in client.search_experiments()]


def _sweep_runs(client, sweep: str) -> list:
    exps = _all_experiments(client)
    query = tag_filter("rlpost.sweep", sweep)
    if not exps or query is None:
        return []
    runs = client.search_runs(exps, query, max_results=10_000)
    return [r for r in runs if r.data.tags.get("rlpost.kind") != "sweep"]


def _children(client, parent_id: str) -> list:
    exps = _all_experiments(client)
    return client.search_runs(exps, f"tags.`mlflow.parentRunId` = '{parent_id}'", max_results=10_000)


def resolve(spec: str, step: int | None = None) -> list[CheckpointRef]:
    """All checkpoints `--ckpt spec [--step N]` names; raises CheckpointNotFound with a one-line reason."""
    path = Path(spec).expanduser()
    if path.exists():
        return _from_folder(path, step)
    if not store_exists():  # resolving must not create a store (and its 10 s schema migration)
        missing = f"{tracking_uri()} (no such store yet; set MLFLOW_TRACKING_URI to the one training used)"
        if spec == "latest":
            raise CheckpointNotFound(f"--ckpt latest: no run in {missing}")
        if RUN_ID.match(spec):
            raise CheckpointNotFound(f"no MLflow run {spec} in {missing}")
        raise CheckpointNotFound(
            f"--ckpt {spec!r} is not a folder, an MLflow run id, a sweep name in {missing}, or 'latest'"
        )
    client = _client()
    if spec == "latest":
        return [_latest_in_store(client)]
    if RUN_ID.match(spec):
        try:
            run = client.get_run(spec)
        except Exception:
            raise CheckpointNotFound(f"no MLflow run {spec} in {tracking_uri()}") from None
        children = _children(client, spec)
        if children:
            return _refs_of_runs(children, step, f"sweep run {spec}")
        return [_from_run(run, step)]
    runs = _sweep_runs(client, spec)
    if runs:
        return _refs_of_runs(runs, step, f"sweep {spec}")
    raise CheckpointNotFound(
        f"--ckpt {spec!r} is not a folder, an MLflow run id, a sweep name in {tracking_uri()}, or 'latest'"
    )


def _refs_of_runs(runs: list, step: int | None, what: str) -> list[CheckpointRef]:
    refs = []
    for run in sorted(runs, key=lambda r: r.info.run_name or r.info.run_id):
        try:
            refs.append(_from_run(run, step))
        except CheckpointNotFound:
            continue  # a run that has not saved (that step) yet
    if not refs:
        at = f" at step {step}" if step is not None else ""
        raise CheckpointNotFound(f"{what}: none of its {len(runs)} runs has a checkpoint on disk{at}")
    return refs


def _latest_in_store(client) -> CheckpointRef:
    exps = _all_experiments(client)
    runs = (
        client.search_runs(exps, f"tags.`{LATEST_CHECKPOINT_TAG}` != ''", max_results=10_000) if exps else []
    )
    best: tuple[float, object, Path] | None = None
    for run in runs:
        path = _newest_on_disk(run)
        if path is not None:
            when = float(ckpt.read_meta(path).get("time", 0.0))
            if best is None or when > best[0]:
                best = (when, run, path)
    if best is None:
        raise CheckpointNotFound(
            f"--ckpt latest: no run in {tracking_uri()} has a complete checkpoint on disk"
        )
    return step_folder_ref(best[2], best[1].info.run_id)
