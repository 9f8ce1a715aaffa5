"""Where sweep jobs run: submitit executors for the local machine and Slurm, cluster profiles, and the
scheduler's view of a job (alive or not) that `python -m orchestration.sweep --status` combines with status.json.

Cluster profiles are `slurm/<name>.yaml` (see slurm/README.md for the keys).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import submitit
from omegaconf import OmegaConf

from infra.models import PROJECT_ROOT


class LauncherError(ValueError):
    """A launcher, cluster profile or Slurm controller that cannot take jobs: one line naming the fix."""


SLURM_DIR = Path(os.environ.get("RLPOST_SLURM_DIR", PROJECT_ROOT / "slurm"))
# profile key -> submitit SlurmExecutor parameter (same name unless mapped)
PROFILE_KEYS = {
    "partition": "partition",
    "nodes": "nodes",
    "tasks_per_node": "ntasks_per_node",
    "cpus_per_task": "cpus_per_task",
    "gpus_per_node": "gpus_per_node",
    "mem_gb": "mem",
    "timeout_min": "time",
    "account": "account",
    "qos": "qos",
    "constraint": "constraint",
    "exclusive": "exclusive",
    "nodelist": "nodelist",
    "exclude": "exclude",
    "signal_delay_s": "signal_delay_s",
    "setup": "setup",
    "additional_parameters": "additional_parameters",
}
EXECUTOR_KEYS = ("max_num_timeout", "description")  # not sbatch options
# squeue states of a job that may still run (anything else, or an unknown id, means it ended)
LIVE_SLURM_STATES = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
    "RESIZING", "SIGNALING", "STAGE_OUT", "SUSPENDED", "STOPPED", "RESV_DEL_HOLD",
}  # fmt: skip
LOCAL_TIMEOUT_MIN = 7 * 24 * 60


def load_cluster_profile(name: str) -> dict:
    """`slurm/<name>.yaml` as a dict; unknown names and unknown keys fail naming the file."""
    path = SLURM_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in SLURM_DIR.glob("*.yaml"))
        raise LauncherError(
            f"unknown cluster profile {name!r}: no {path} (known: {', '.join(known) or 'none'})"
        )
    try:
        profile = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
    except Exception as exc:
        raise LauncherError(f"cluster profile {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    unknown = sorted(set(profile) - set(PROFILE_KEYS) - set(EXECUTOR_KEYS))
    if unknown:
        raise LauncherError(
            f"cluster profile {path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(PROFILE_KEYS)}, "
            f"{', '.join(EXECUTOR_KEYS)})"
        )
    return profile


def slurm_parameters(profile: dict) -> dict:
    """Profile keys -> submitit SlurmExecutor parameters (None values are left to Slurm's defaults)."""
    params = {}
    for key, value in profile.items():
        if key in EXECUTOR_KEYS or value is None:
            continue
        if key == "mem_gb":
            value = f"{value}G"
        params[PROFILE_KEYS[key]] = value
    return params


def check_slurm_reachable(timeout_s: float | None = None) -> None:
    """Raise LauncherError unless the Slurm controller answers (nothing is submitted otherwise) within
    `timeout_s` (default 30 s, or $RLPOST_SLURM_PROBE_S)."""
    timeout_s = timeout_s or float(os.environ.get("RLPOST_SLURM_PROBE_S", 30))
    try:
        probe = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise LauncherError(
            "Slurm is not installed here (no sinfo): start the local one (slurm/local/start.sh) or use "
            "LAUNCHER=local"
        ) from None
    except subprocess.TimeoutExpired:
        raise LauncherError(
            f"Slurm is not reachable (sinfo timed out after {timeout_s:g} s): is slurmctld up?"
        ) from None
    if probe.returncode != 0:
        first = (probe.stderr.strip().splitlines() or ["no message"])[0]
        raise LauncherError(
            f"Slurm is not reachable (sinfo: {first}): start it (slurm/local/start.sh) or use LAUNCHER=local"
        )


def check_launcher(launcher: str, cluster: str | None = None) -> dict | None:
    """Refuse a bad launcher, cluster profile or unreachable Slurm (LauncherError) before anything is
    created; returns the Slurm profile (None for the local launcher)."""
    if launcher == "local":
        if cluster:
            raise LauncherError(
                f"--cluster {cluster} needs --launcher slurm (the local launcher has no profiles)"
            )
        return None
    if launcher == "slurm":
        profile = load_cluster_profile(cluster or "local")
        slurm_parameters(profile)
        check_slurm_reachable()
        return profile
    raise LauncherError(f"unknown launcher {launcher!r}: expected local or slurm")


def make_executor(launcher: str, folder: Path, cluster: str | None = None, checked: bool = False):
    """A submitit executor writing its scripts and logs to `folder` (which it creates). Validates
    everything first (`checked`: check_launcher already did)."""
    profile = load_cluster_profile(cluster or "local") if checked and launcher == "slurm" else None
    if not checked:
        profile = check_launcher(launcher, cluster)
    if launcher == "local":
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN)
        return executor
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=int(profile.get("max_num_timeout", 3)))
    executor.update_parameters(**slurm_parameters(profile))
    return executor


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, i.e. exited but not yet reaped, counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def slurm_states() -> dict[str, str] | None:
    """Job id -> squeue state of every job the controller still knows (None: Slurm not answering).

    Without accounting (the local Slurm has none) `sacct` fails, so this asks squeue, which keeps
    finished jobs for MinJobAge seconds; an id it no longer knows has ended."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-r", "--states=all", "-o", "%i %T"], capture_output=True, text=True, timeout=30
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    states = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def scheduler_view(launcher: str, job_ids: list[str]) -> dict[str, tuple[bool | None, str]]:
    """Job id -> (alive, scheduler state). alive is None when the scheduler cannot be asked."""
    if launcher == "local":  # a local job id is the pid of its submitit controller process
        return {j: (pid_alive(int(j)), "") if j.isdigit() else (None, "") for j in job_ids}
    states = slurm_states()
    if states is None:
        return {j: (None, "slurm not answering") for j in job_ids}
    return {
        j: (states.get(j, "GONE") in LIVE_SLURM_STATES, states.get(j, "ended (no longer in squeue)"))
        for j in job_ids
    }


def cancel_jobs(launcher: str, job_ids: list[str]) -> None:
    """Stop these jobs: `scancel` on Slurm; SIGINT to a local job's controller (it then kills its tasks)."""
    if not job_ids:
        return
    if launcher == "slurm":
        subprocess.run(["scancel", *job_ids], capture_output=True, timeout=60)
        return
    import signal

    for j in job_ids:
        if j.isdigit() and pid_alive(int(j)):
            os.kill(int(j), signal.SIGINT)
