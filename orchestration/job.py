"""The job a sweep submits for one grid point, and the `status.json` it keeps in its run folder.

`TrainPoint` is a submitit `Checkpointable`: on preemption or time-out (Slurm sends USR2) the training
first finishes its step and writes a checkpoint (train/preemption.py), then submitit's hook calls
`checkpoint` and requeues the job, and the next attempt resumes from that checkpoint in the same MLflow
run. On SIGTERM (scancel, `scontrol requeue`, preemption without USR2) the same checkpoint is written
and the job exits; status.json says `preempted` until Slurm's requeue (if any) runs it again. Sweeps always train with `resume=true`, so a job that was requeued by Slurm
(`scontrol requeue`, node failure) or resubmitted after a kill (`python -m orchestration.sweep EXP --resume`)
continues the same way. `status.json` is what `--status` reads, whatever the scheduler.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import time
import traceback
from pathlib import Path

import submitit
from omegaconf import OmegaConf

from infra.redact import redact
from infra.tracking import RUN_ID_FILE, recorded_run_id
from orchestration.preempt import hand_to_scheduler
from train.preemption import Preempted

STATUS_FILE = "status.json"


def write_status(run_dir: Path, state: str, **extra: object) -> None:
    """Atomically replace `<run_dir>/status.json` (readers never see half a file)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{STATUS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(redact({"state": state, "time": time.time(), **extra})))
    tmp.replace(run_dir / STATUS_FILE)


def read_status(run_dir: Path) -> dict:
    path = Path(run_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"state": "unknown"}


def job_log(logs: str | Path, job_id: str) -> Path:
    """The stderr file submitit writes for task 0 of job `job_id` (the task that keeps status.json): where a
    job that died before it could write status.json said why."""
    return submitit.core.utils.JobPaths(Path(logs), job_id, task_id=0).stderr


# a raised exception's last traceback line: `ModuleNotFoundError: No module named 'x'`, `torch.OutOfMemoryError`
_RAISED = re.compile(r"^([A-Za-z_]\w*\.)*[A-Za-z_]\w*(Error|Exception|Exit|Interrupt)\b")
_ERROR = re.compile(r"\berror\b", re.IGNORECASE)  # `slurmstepd: error: ...`, `error: ...`


def last_error(log: Path, tail_bytes: int = 1 << 16) -> str | None:
    """Why a job ended, from the end of its log: the last unindented line that is a raised exception or an
    error report (`slurmstepd: error: *** JOB 7 ... CANCELLED DUE TO TIME LIMIT ***`), else the last
    non-blank line; None when the log is missing or empty."""
    try:
        with open(log, "rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - tail_bytes, 0))
            lines = [ln.rstrip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    said = [ln for ln in lines if not ln[0].isspace() and (_RAISED.match(ln) or _ERROR.search(ln))]
    found = (said or lines or [None])[-1]
    return found[:300] if found else None


def job_env() -> dict[str, object]:
    """Scheduler job id, attempt and this process' pid/host (for liveness checks)."""
    info: dict[str, object] = {"pid": os.getpid(), "host": socket.gethostname()}
    try:
        env = submitit.JobEnvironment()
        info["job_id"] = str(env.job_id)
    except RuntimeError:  # not inside a submitit job (direct call)
        info["job_id"] = ""
    info["restart"] = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    return info


class TrainPoint(submitit.helpers.Checkpointable):
    """Train one grid point: wait for a local slot (if limited), train, keep status.json current.

    Called with the point's full config as YAML (it carries `resume: true`, `run_dir`, the parent
    MLflow run and the tags), so every attempt of the job is the same call.
    """

    def __init__(self) -> None:
        self.preempted = False

    def __call__(
        self, cfg_yaml: str, slots_dir: str | None = None, max_parallel: int = 0
    ) -> dict[str, float]:
        cfg = OmegaConf.create(cfg_yaml)
        run_dir = Path(cfg.run_dir)
        env = job_env()
        if _num_tasks() > 1 and cfg.get("world_size", 1) > 1:
            # one FSDP world over the job's nodes (one task per node): every node starts its ranks with
            # torchrun; task 0 also keeps status.json and the MLflow state
            if _task_id() != 0:
                from orchestration.ranks import launch_ranks

                try:
                    code = launch_ranks(cfg)
                except Preempted:  # task 0 reports it and (USR2) requeues the job
                    return {}
                if code:
                    raise RuntimeError(f"training ranks on this node exited with status {code}")
                return {}
        elif _num_tasks() > 1:  # a multi-node job: Ray head on task 0, the other tasks join it
            from orchestration.ray_cluster import ray_job

            return ray_job(lambda: self._train(cfg, run_dir, env, slots_dir, max_parallel), run_dir)
        return self._train(cfg, run_dir, env, slots_dir, max_parallel)

    def _train(self, cfg, run_dir: Path, env: dict, slots_dir: str | None, max_parallel: int):
        slot = None
        try:
            if slots_dir and max_parallel > 0:
                write_status(run_dir, "waiting", **env)
                slot = acquire_slot(Path(slots_dir), max_parallel)
            env["running_at"] = time.time()
            cfg.tags = {
                **cfg.tags,
                "rlpost.job_id": str(env["job_id"]),
                "rlpost.job_restart": str(env["restart"]),
            }
            write_status(run_dir, "running", **env)
            if not cfg.get("pipeline"):
                from train.config import merge_layers, train_schema

                # onto the current schema: a point submitted before a new config key was added (a
                # resumed old sweep) gets that key's default instead of failing on a missing key
                cfg = merge_layers(OmegaConf.structured(train_schema()), [cfg])
            result = _run_point(cfg, run_dir)
            write_status(run_dir, "done", **env, metrics=result)
            return result
        except Preempted as stop:  # checkpointed (or abandoned) and the MLflow run marked KILLED
            write_status(run_dir, "preempted", **env, **stop.as_dict())
            print(f"[sweep] {stop.describe()}", flush=True)
            try:
                hand_to_scheduler(stop)  # USR2: submitit's hook requeues the job and exits
            except SystemExit:
                if self.preempted:
                    write_status(run_dir, "requeued", **env, **stop.as_dict())
                    mark_mlflow_run(run_dir, "SCHEDULED", note=f"requeued after {stop.describe()}")
                raise
            raise SystemExit(128 + stop.signum) from None
        except BaseException as exc:
            if self.preempted:  # submitit's requeue exits through here: not a failure
                write_status(run_dir, "requeued", **env)
                mark_mlflow_run(
                    run_dir, "SCHEDULED", note="preempted: requeued, resumes from its latest checkpoint"
                )
                raise
            error = traceback.format_exc()[-4000:]
            # MLflow first: once status.json says failed, `--wait` returns and readers expect the run there.
            record_failure(cfg, run_dir, exc)
            write_status(run_dir, "failed", **env, error=error, message=str(exc)[:500])
            raise
        finally:
            if slot is not None:
                slot.close()

    def checkpoint(self, cfg_yaml: str, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        """Preempted / timed out: requeue the same call; the trainer's checkpoints carry the state."""
        self.preempted = True
        return submitit.helpers.DelayedSubmission(TrainPoint(), cfg_yaml, *args, **kwargs)


def _run_point(cfg, run_dir: Path) -> dict:
    """Train the point here (a pipeline's stages, or one GRPO run; its ranks under torchrun when
    world_size > 1) and return its last metrics."""
    if cfg.get("pipeline"):
        from orchestration.pipeline import run_point

        return run_point(cfg)
    if cfg.get("world_size", 1) > 1 and "RANK" not in os.environ:
        from orchestration.ranks import launch_ranks
        from train.progress import read_progress

        code = launch_ranks(cfg)  # the ranks train; their last metrics are in progress.json
        if code:
            raise RuntimeError(f"training ranks exited with status {code} (see the job log)")
        return read_progress(run_dir).get("metrics", {})
    from train.stages.grpo import run

    return run(cfg)


def _task_id() -> int:
    try:
        return int(submitit.JobEnvironment().global_rank)
    except RuntimeError:
        return 0


def _num_tasks() -> int:
    try:
        return int(submitit.JobEnvironment().num_tasks)
    except RuntimeError:
        return 1


def acquire_slot(slots_dir: Path, max_parallel: int):
    """Block until one of `max_parallel` lock files is free; the open file holds the slot."""
    slots_dir.mkdir(parents=True, exist_ok=True)
    while True:
        for k in range(max_parallel):
            f = open(slots_dir / f"slot{k}.lock", "w")  # noqa: SIM115 - held for the job's lifetime
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return f
            except BlockingIOError:
                f.close()
        time.sleep(2.0)


def mark_mlflow_run(run_dir: Path, status: str, note: str = "") -> None:
    """Set the point's MLflow run status (FAILED/KILLED/SCHEDULED) with a note; no-op without a run."""
    run_id = recorded_run_id(run_dir)
    if run_id is None:
        return
    from infra.tracking import Tracker

    tracker = Tracker()
    tracker.run_id = run_id
    if note:
        tracker.set_tags({"rlpost.status_note": note})
    if status in ("SCHEDULED", "RUNNING"):  # the trainer's error tag of an interrupted attempt is stale
        with contextlib.suppress(Exception):
            tracker.client.delete_tag(run_id, "rlpost.error")
    tracker.client.update_run(run_id, status=status)


def record_failure(cfg, run_dir: Path, exc: BaseException) -> None:
    """A job that failed is FAILED in MLflow with its error, even if it died before the trainer made
    its run (bad model path, import error): then a child run is created just to carry the error."""
    error = "".join(traceback.format_exception_only(exc)).strip()
    try:
        from infra.tracking import Tracker

        tracker = Tracker(enabled=bool(cfg.track))
        run_id = recorded_run_id(run_dir)
        if run_id is None:
            run_id = tracker.start(
                cfg.experiment, cfg.run_name, tags=dict(cfg.tags), parent_run_id=cfg.parent_run_id
            )
            if run_id:
                (run_dir / RUN_ID_FILE).write_text(run_id)
        else:
            tracker.run_id = run_id
        tracker.finish("FAILED", error=error)
    except Exception as track_exc:  # the tracking store itself may be the problem: keep the job's error
        print(f"[sweep] could not mark the MLflow run FAILED: {track_exc}", flush=True)
