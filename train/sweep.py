"""Sweeps: expand an experiment's grid, submit one submitit job per point, track them in MLflow.

`python -m train.sweep EXP [--launcher local|slurm] [--cluster PROFILE] [key=value ...] [--wait]`
(what `make sweep` runs). One MLflow parent run per sweep, one child run per point. Each job writes
`<run_dir>/status.json`, which `python -m train.sweep --status EXP` reads, whatever the scheduler.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from train.config import PROJECT_ROOT, ConfigError, build_config, load_experiment

SLURM_DIR = PROJECT_ROOT / "slurm"


def outputs_root() -> Path:
    return Path(os.environ.get("RLPOST_OUTPUTS", PROJECT_ROOT / "outputs"))


def expand_grid(grid: dict[str, list]) -> list[dict[str, object]]:
    """Cartesian product of `key: [values]`, in file order; an empty grid is one point."""
    keys = list(grid)
    for k in keys:
        if not isinstance(grid[k], (list, tuple)) or not grid[k]:
            raise ConfigError(f"sweep.grid.{k} must be a non-empty list")
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def point_slug(point: dict[str, object]) -> str:
    return "_".join(f"{k.split('.')[-1]}{v}" for k, v in point.items()) or "single"


def git_state() -> dict[str, str]:
    def run(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return {
        "rlpost.git_commit": run("rev-parse", "HEAD") or "unknown",
        "rlpost.git_dirty": str(bool(run("status", "--porcelain"))),
    }


def write_status(run_dir: Path, state: str, **extra: object) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / ".status.json.tmp"
    tmp.write_text(json.dumps({"state": state, "time": time.time(), **extra}))
    tmp.replace(run_dir / "status.json")


def run_point(cfg_yaml: str, slots_dir: str | None, max_parallel: int) -> dict[str, float]:
    """The submitted job: wait for a local slot (if limited), then train; status.json tracks it."""
    cfg = OmegaConf.create(cfg_yaml)
    run_dir = Path(cfg.run_dir)
    slot = None
    try:
        if slots_dir and max_parallel > 0:
            write_status(run_dir, "waiting")
            slot = _acquire_slot(Path(slots_dir), max_parallel)
        write_status(run_dir, "running", job_id=_job_id())
        from train.trainer import run

        result = run(cfg)
        write_status(run_dir, "done", job_id=_job_id(), metrics=result)
        return result
    except BaseException as exc:
        write_status(
            run_dir, "failed", job_id=_job_id(), error=traceback.format_exc()[-4000:], message=str(exc)[:500]
        )
        raise
    finally:
        if slot is not None:
            slot.close()


def _job_id() -> str:
    try:
        import submitit

        return str(submitit.JobEnvironment().job_id)
    except Exception:
        return ""


def _acquire_slot(slots_dir: Path, max_parallel: int):
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


def load_cluster_profile(name: str) -> dict:
    path = SLURM_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in SLURM_DIR.glob("*.yaml"))
        raise ConfigError(
            f"unknown cluster profile {name!r}: no {path} (known: {', '.join(known) or 'none'})"
        )
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def make_executor(launcher: str, folder: Path, cluster: str | None):
    import submitit

    if launcher == "local":
        executor = submitit.AutoExecutor(folder=folder, cluster="local")
        executor.update_parameters(timeout_min=7 * 24 * 60)
        return executor
    if launcher == "slurm":
        profile = load_cluster_profile(cluster or "local")
        if subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
            raise ConfigError(
                "Slurm is not reachable (sinfo failed): start it (make slurm-up) or use LAUNCHER=local"
            )
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
        executor.update_parameters(
            **{
                f"slurm_{k}"
                if k
                not in ("timeout_min", "nodes", "cpus_per_task", "tasks_per_node", "gpus_per_node", "mem_gb")
                else k: v
                for k, v in profile.items()
            }
        )
        return executor
    raise ConfigError(f"unknown launcher {launcher!r}: expected local or slurm")


def plan(experiment: str, overrides: list[str]) -> tuple[DictConfig, list[tuple[dict, DictConfig]]]:
    """Validate every point's config before anything is submitted."""
    exp = load_experiment(experiment)
    sweep = exp.get("sweep", {}) or {}
    grid = OmegaConf.to_container(sweep.get("grid", {}) or {}, resolve=True)
    points = []
    for point in expand_grid(grid):
        cfg = build_config(experiment, [*overrides, *(f"{k}={v}" for k, v in point.items())])
        points.append((point, cfg))
    return exp, points


def submit(
    experiment: str, launcher: str = "local", cluster: str | None = None, overrides: list[str] | None = None
) -> dict:
    exp, points = plan(experiment, overrides or [])
    sweep_id = f"{experiment}-{time.strftime('%Y%m%d-%H%M%S')}"
    sweep_dir = outputs_root() / experiment / "sweeps" / sweep_id
    executor = make_executor(launcher, sweep_dir / "logs", cluster)
    executor.update_parameters(name=sweep_id)
    from train.tracking import Tracker

    tags = {"rlpost.sweep": sweep_id, "rlpost.experiment": experiment, "rlpost.kind": "sweep", **git_state()}
    parent = Tracker()
    parent_id = parent.start(experiment, sweep_id, tags=tags)
    parent.log_params(
        {
            "sweep.launcher": launcher,
            "sweep.cluster": cluster or "",
            "sweep.points": len(points),
            "sweep.overrides": " ".join(overrides or []),
        }
    )
    max_parallel = int((exp.get("sweep", {}) or {}).get("max_parallel", 0) or 0) if launcher == "local" else 0
    jobs = []
    for point, cfg in points:
        slug = point_slug(point)
        cfg.run_name = f"{experiment}-{slug}"
        cfg.run_dir = str(sweep_dir / "runs" / slug)
        cfg.parent_run_id = parent_id
        cfg.tags = {**tags, "rlpost.kind": "train", "rlpost.grid_point": json.dumps(point)}
        write_status(Path(cfg.run_dir), "submitted")
        with _detached_stdio():
            job = executor.submit(run_point, OmegaConf.to_yaml(cfg), str(sweep_dir / "slots"), max_parallel)
        jobs.append(
            {"point": point, "run_dir": cfg.run_dir, "job_id": str(job.job_id), "run_name": cfg.run_name}
        )
    info = {
        "sweep_id": sweep_id,
        "experiment": experiment,
        "launcher": launcher,
        "mlflow_parent_run": parent_id,
        "logs": str(sweep_dir / "logs"),
        "jobs": jobs,
        "overrides": overrides or [],
    }
    (sweep_dir / "sweep.json").write_text(json.dumps(info, indent=1))
    return info


@contextlib.contextmanager
def _detached_stdio():
    """Local jobs' controllers inherit fds 1 and 2: point them at /dev/null while submitting, so
    `make sweep | tail` returns instead of waiting for the jobs (their logs go to the logs folder)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def latest_sweep(experiment: str) -> Path | None:
    root = outputs_root() / experiment / "sweeps"
    found = sorted(root.glob("*/sweep.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def status_rows(sweep_json: Path) -> list[dict]:
    info = json.loads(sweep_json.read_text())
    rows = []
    for job in info["jobs"]:
        path = Path(job["run_dir"]) / "status.json"
        st = json.loads(path.read_text()) if path.is_file() else {"state": "unknown"}
        rows.append({**job, **st})
    return rows


def print_status(experiment: str) -> int:
    path = latest_sweep(experiment)
    if path is None:
        print(f"no sweep of {experiment!r} under outputs/{experiment}/sweeps", file=sys.stderr)
        return 1
    rows = status_rows(path)
    print(f"sweep {path.parent.name}")
    for r in rows:
        print(f"  {r['job_id']:>12}  {r['state']:<10} {json.dumps(r['point'])}  {r['run_dir']}")
        if r["state"] == "failed":
            for line in r.get("error", "").strip().splitlines()[-5:]:
                print(f"      | {line}")
    return 0


def wait(info: dict, poll_s: float = 10.0) -> int:
    sweep_json = Path(info["logs"]).parent / "sweep.json"
    while True:
        rows = status_rows(sweep_json)
        counts = {
            s: sum(r["state"] == s for r in rows)
            for s in ("submitted", "waiting", "running", "done", "failed")
        }
        print(time.strftime("%H:%M:%S"), " ".join(f"{k}={v}" for k, v in counts.items()), flush=True)
        if counts["done"] + counts["failed"] == len(rows):
            return 1 if counts["failed"] else 0
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("overrides", nargs="*", help="key=value overrides applied to every point")
    parser.add_argument("--launcher", default="local", choices=["local", "slurm"])
    parser.add_argument("--cluster", default=None, help="slurm/<profile>.yaml")
    parser.add_argument("--wait", action="store_true", help="wait, printing job states, until all finish")
    parser.add_argument("--status", action="store_true", help="print the state of the latest sweep and exit")
    args = parser.parse_args(argv)
    if args.status:
        return print_status(args.experiment)
    try:
        info = submit(args.experiment, args.launcher, args.cluster, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"sweep {info['sweep_id']}: {len(info['jobs'])} job(s) via {info['launcher']}")
    for job in info["jobs"]:
        print(f"  job {job['job_id']}  {json.dumps(job['point'])}  -> {job['run_dir']}")
    print(f"MLflow parent run {info['mlflow_parent_run']} (make ui); logs in {info['logs']}")
    print(f"status: make sweep-status EXP={args.experiment}")
    if args.wait:
        return wait(info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
