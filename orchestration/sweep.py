"""Sweeps: expand an experiment's grid, submit one submitit job per point, track them in MLflow.

`python -m orchestration.sweep EXP [--launcher local|slurm] [--cluster PROFILE] [key=value ...] [--wait]`
(what `make sweep` runs); `--status` shows each point's state (a job that died without a word, e.g.
SIGKILL or OOM, shows as `dead`); `--resume` resubmits the failed and dead points, which continue
from their latest checkpoint in the same MLflow run. One MLflow parent run per sweep, one child run
per point. The job itself (checkpoint hook, requeue, status.json) is orchestration/job.py; schedulers
and cluster profiles are infra/executors.py.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from infra.executors import (  # noqa: F401
    LauncherError,
    check_launcher,
    load_cluster_profile,
    make_executor,
    scheduler_view,
)
from infra.redact import redact, redacted_yaml
from infra.tracking import recorded_run_id
from orchestration.job import TrainPoint, job_log, last_error, mark_mlflow_run, read_status, write_status
from train.config import PROJECT_ROOT, ConfigError, build_config, load_experiment, parse_value
from train.progress import read_progress

POINT_CONFIG = "sweep_point.yaml"  # the point's full config, what every (re)submission runs
# keys the sweep sets for every point itself: an override of them would be silently replaced -> refused
SWEEP_PLACED = {
    "output_dir": "each point runs in <outputs>/<experiment>/sweeps/<id>/runs/<point>; set RLPOST_OUTPUTS=DIR "
    "to put a sweep's folders under DIR",
    "run_dir": "each point runs in <outputs>/<experiment>/sweeps/<id>/runs/<point>; set RLPOST_OUTPUTS=DIR "
    "to put a sweep's folders under DIR",
    "run_name": "the sweep names each point's run <experiment>-<point>",
    "resume": "every sweep job resumes from its latest checkpoint (make sweep-resume resubmits failed points)",
    "parent_run_id": "the sweep's own MLflow run is every point's parent",
    "tags": "the sweep tags every point's run (rlpost.sweep, rlpost.grid_point, ...)",
}
ACTIVE = ("submitted", "waiting", "running", "preempted", "requeued")  # preempted: until Slurm runs it again
ENDED = ("done", "failed", "dead")


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


def parse_grid_overrides(items: list[str]) -> dict[str, list]:
    """`key=v1,v2` strings (values parsed as YAML) -> {key: [v1, v2]}; e.g. ["seed=1,2"] -> {"seed": [1, 2]}."""
    out: dict[str, list] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key.strip() or not values.strip():
            raise ConfigError(f"bad grid override {item!r}: expected key=value[,value...], e.g. seed=1,2")
        out[key.strip()] = [parse_value(v.strip(), f"bad grid override {item!r}") for v in values.split(",")]
    return out


def plan(
    experiment: str, overrides: list[str], grid_overrides: dict[str, list] | None = None
) -> tuple[DictConfig, list[tuple[dict, DictConfig]]]:
    """Validate every point's config before anything is submitted. `grid_overrides` replace (or add)
    grid keys: `make sweep EXP=x GRID="seed=1"` runs one seed of every other grid value."""
    exp = load_experiment(experiment)
    grid = sweep_grid(exp, experiment)
    refuse_grid_keys_in(overrides, grid, grid_overrides or {}, experiment)
    grid.update(grid_overrides or {})
    points = []
    staged = bool(exp.get("stages"))
    last_stage = list(exp.stages)[-1] if staged else None
    refuse_placed_keys([*(o.partition("=")[0] for o in overrides), *grid], last_stage)
    for point in expand_grid(grid):
        point_overrides = [*overrides, *(f"{k}={v}" for k, v in point.items())]
        if staged:  # sft -> grpo etc.: the job runs the pipeline; earlier stages are shared across points
            from orchestration.pipeline import point_config

            cfg = point_config(experiment, point_overrides)
        else:
            cfg = build_config(experiment, point_overrides)
        points.append((point, cfg))
    return exp, points


def sweep_grid(exp: DictConfig, experiment: str) -> dict[str, list]:
    """The experiment's `sweep.grid` as {key: [values]}, or ConfigError naming what in its `sweep:` section is
    wrong (the file itself and its sections' kinds are checked by load_experiment)."""
    sweep = exp.get("sweep") or {}
    try:
        grid = OmegaConf.to_container(sweep.get("grid") or OmegaConf.create(), resolve=True)
        max_parallel = sweep.get("max_parallel", 0)
    except Exception as exc:  # noqa: BLE001 - an interpolation that does not resolve, a grid that is a list
        raise ConfigError(
            f"experiment {experiment}: sweep.grid cannot be read ({str(exc).splitlines()[0][:120]})"
        ) from None
    if not isinstance(grid, dict):
        raise ConfigError(
            f"experiment {experiment}: sweep.grid is {str(grid)[:40]!r}, not a mapping of key: [values]"
        )
    for key, values in grid.items():
        if isinstance(values, list) and any(isinstance(v, (list, dict)) for v in values):
            raise ConfigError(
                f"experiment {experiment}: sweep.grid.{key} holds a list or mapping; its values must be plain values"
            )
    if max_parallel is not None and not (
        isinstance(max_parallel, int) and not isinstance(max_parallel, bool) and max_parallel >= 0
    ):
        raise ConfigError(
            f"experiment {experiment}: sweep.max_parallel is {str(max_parallel)[:40]!r}, not a count >= 0"
        )
    expand_grid(grid)  # each key a non-empty list
    return grid


def _bare_key(override: str) -> str:
    """`+key=v`, `++key=v`, `~key` -> key."""
    return override.partition("=")[0].strip().lstrip("+~")


def refuse_grid_keys_in(overrides: list[str], grid: dict, grid_overrides: dict, experiment: str) -> None:
    """ConfigError when an override sets a key the grid also sets: each point's grid value would replace
    it in silence (`make sweep EXP=darling_math OVERRIDES="seed=2"` ran seeds 1 and 2)."""
    keys = {_bare_key(k): k for k in [*grid, *grid_overrides]}
    for override in overrides:
        key, value = _bare_key(override), override.partition("=")[2].strip()
        if key in keys:
            values = grid_overrides.get(keys[key], grid.get(keys[key]))
            given = "a --grid key" if keys[key] in grid_overrides else f"a grid key of {experiment}"
            raise ConfigError(
                f"{override.strip()}: {key} is also {given} (sweep.grid.{key}: {values}), whose values would "
                f'replace it; to run only that value give it as GRID="{key}={value}" (--grid {key}={value}), '
                "not as an override"
            )


def refuse_placed_keys(keys: list[str], last_stage: str | None = None) -> None:
    """ConfigError naming the first key the sweep sets itself (SWEEP_PLACED) and what to do instead; for a
    staged experiment the keys of its last stage (the earlier stages' output_dir is honoured)."""
    for raw in keys:
        key = raw.strip()
        if last_stage is not None:
            if not key.startswith(f"{last_stage}."):
                continue
            key = key[len(last_stage) + 1 :]
        base = key.split(".", 1)[0]
        if base in SWEEP_PLACED:
            raise ConfigError(f"{raw.strip()}= is not honoured by a sweep: {SWEEP_PLACED[base]}")


def new_sweep_dir(experiment: str) -> tuple[str, Path]:
    """A fresh sweep id and its folder, made with one atomic mkdir: `<experiment>-<time>-<4 hex>`. Two
    sweeps started in the same second get two ids (the random part, and mkdir refusing an existing
    folder), and an id is never given again, even after its folder was deleted (its MLflow runs keep it)."""
    root = outputs_root() / experiment / "sweeps"
    root.mkdir(parents=True, exist_ok=True)
    while True:
        sweep_id = f"{experiment}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        try:
            (root / sweep_id).mkdir()
        except FileExistsError:
            continue
        return sweep_id, root / sweep_id


def submit(
    experiment: str,
    launcher: str = "local",
    cluster: str | None = None,
    overrides: list[str] | None = None,
    started: float | None = None,
    grid_overrides: dict[str, list] | None = None,
) -> dict:
    """Validate all points, check the scheduler, then submit one job per point; returns sweep.json's content."""
    started = started or time.time()
    exp, points = plan(experiment, overrides or [], grid_overrides)
    check_launcher(launcher, cluster)  # a bad launcher or cluster: refused before any folder is made
    sweep_id, sweep_dir = new_sweep_dir(experiment)
    executor = make_executor(launcher, sweep_dir / "logs", cluster, checked=True)
    if launcher == "slurm":
        executor.update_parameters(job_name=sweep_id)
    parent, tags = _open_parent_run(experiment, sweep_id, launcher, cluster, overrides or [], len(points))
    parent_id = parent.run_id
    max_parallel = int((exp.get("sweep", {}) or {}).get("max_parallel", 0) or 0) if launcher == "local" else 0
    slots = str(sweep_dir / "slots")
    entries = [_write_point(experiment, sweep_dir, point, cfg, parent_id, tags) for point, cfg in points]
    t0 = time.time()
    jobs = _submit_points(executor, [Path(e["run_dir"]) for e in entries], slots, max_parallel)
    submit_s = time.time() - t0
    for entry, job in zip(entries, jobs):
        entry["job_id"] = str(job.job_id)
        entry["past_job_ids"] = []
    parent.set_tags({"rlpost.job_ids": ",".join(e["job_id"] for e in entries)})
    info = {
        "sweep_id": sweep_id,
        "experiment": experiment,
        "launcher": launcher,
        "cluster": cluster,
        "mlflow_parent_run": parent_id,
        "logs": str(sweep_dir / "logs"),
        "slots": slots,
        "max_parallel": max_parallel,
        "jobs": entries,
        "overrides": redact(overrides or []),
        "started": started,
        "submit_s": submit_s,
    }
    _write_sweep_json(sweep_dir, info)
    return info


def _open_parent_run(
    experiment: str, sweep_id: str, launcher: str, cluster: str | None, overrides: list[str], n_points: int
) -> tuple:
    """The sweep's MLflow parent run (a Tracker) (its points' runs are children) and the tags every point inherits."""
    from infra.tracking import Tracker

    tags = {"rlpost.sweep": sweep_id, "rlpost.experiment": experiment, "rlpost.kind": "sweep", **git_state()}
    tags["rlpost.scheduler"] = launcher if launcher == "local" else f"slurm:{cluster or 'local'}"
    parent = Tracker()
    parent.start(experiment, sweep_id, tags=tags)
    parent.log_params(
        {
            "sweep.launcher": launcher,
            "sweep.cluster": cluster or "",
            "sweep.points": n_points,
            "sweep.overrides": " ".join(overrides),
        }
    )
    return parent, tags


def _write_point(experiment: str, sweep_dir: Path, point: dict, cfg, parent_id: str, tags: dict) -> dict:
    """A point's run folder with the full config every (re)submission runs; its sweep.json entry."""
    slug = point_slug(point)
    cfg.run_name = f"{experiment}-{slug}"
    cfg.run_dir = str(sweep_dir / "runs" / slug)
    cfg.resume = True  # every attempt (requeue, --resume) continues from the latest checkpoint
    cfg.parent_run_id = parent_id
    cfg.tags = {**tags, "rlpost.kind": "train", "rlpost.grid_point": json.dumps(point)}
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / POINT_CONFIG).write_text(redacted_yaml(cfg))
    write_status(run_dir, "submitted")
    return {"point": point, "run_dir": cfg.run_dir, "run_name": cfg.run_name}


def _submit_points(executor, run_dirs: list[Path], slots: str, max_parallel: int) -> list:
    """One job per point; on Slurm one job array (one sbatch call for the whole sweep)."""
    with _detached_stdio(), executor.batch() if len(run_dirs) > 1 else contextlib.nullcontext():
        jobs = [
            executor.submit(TrainPoint(), (d / POINT_CONFIG).read_text(), slots, max_parallel)
            for d in run_dirs
        ]
    return jobs


def _write_sweep_json(sweep_dir: Path, info: dict) -> None:
    tmp = sweep_dir / ".sweep.json.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    tmp.replace(sweep_dir / "sweep.json")


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
    """The newest sweep.json of an experiment: by the time its sweep command started (ids of one second
    do not sort by time), then by folder creation."""
    root = outputs_root() / experiment / "sweeps"

    def started(path: Path) -> tuple[float, float]:
        try:
            when = float(json.loads(path.read_text()).get("started") or 0.0)
        except (OSError, ValueError):
            when = 0.0
        return when, path.parent.stat().st_ctime

    found = sorted(root.glob("*/sweep.json"), key=started)
    return found[-1] if found else None


def status_rows(sweep_json: Path) -> list[dict]:
    """Each point's status.json and its job's log (`log`), with `dead` where the scheduler says the job ended
    without writing done/failed (SIGKILL, OOM kill, node loss, scancel, a pickle that no longer loads) and
    then its `cause`: the last error its log shows, else the scheduler's state."""
    info = json.loads(sweep_json.read_text())
    rows = [{**job, **read_status(Path(job["run_dir"])), "log": str(job_log(info["logs"], job["job_id"]))}
            for job in info["jobs"]]  # fmt: skip
    active = [r for r in rows if r["state"] not in ENDED]
    if not active:
        return rows
    view = scheduler_view(info["launcher"], [r["job_id"] for r in active])
    for r in active:
        alive, sched_state = view[r["job_id"]]
        r["scheduler_state"] = sched_state
        if alive is False:
            again = read_status(Path(r["run_dir"]))  # it may have finished while we asked
            r.update(again)
            if again["state"] not in ENDED:
                r["state"] = "dead"
                r["cause"] = last_error(Path(r["log"])) or sched_state or _silent(Path(r["log"]))
    return rows


def _silent(log: Path) -> str:
    """The cause of a death neither the log nor the scheduler explains."""
    if not log.is_file():
        return "no log: the job died before it started"
    return "its log ends without an error (a SIGKILL or an OOM kill leaves none)"


def reconcile_mlflow(info: dict, rows: list[dict]) -> None:
    """Dead points' MLflow runs -> KILLED (they would stay RUNNING forever); the sweep's parent run ->
    FINISHED / FAILED once every point has ended."""
    with contextlib.suppress(Exception):
        from infra.tracking import Tracker

        client = Tracker().client
        for r in rows:
            run_id = recorded_run_id(Path(r["run_dir"]))
            if r["state"] == "dead" and run_id and client.get_run(run_id).info.status == "RUNNING":
                mark_mlflow_run(Path(r["run_dir"]), "KILLED", note=f"job {r['job_id']} died: {r['cause']}")
        if all(r["state"] in ENDED for r in rows) and info.get("mlflow_parent_run"):
            status = "FINISHED" if all(r["state"] == "done" for r in rows) else "FAILED"
            if client.get_run(info["mlflow_parent_run"]).info.status != status:
                client.set_terminated(info["mlflow_parent_run"], status=status)


def print_status(experiment: str) -> int:
    path = latest_sweep(experiment)
    if path is None:
        print(
            f"error: no sweep of {experiment!r} under {outputs_root() / experiment / 'sweeps'}",
            file=sys.stderr,
        )
        return 1
    info = json.loads(path.read_text())
    rows = status_rows(path)
    reconcile_mlflow(info, rows)
    print(f"sweep {path.parent.name} ({info['launcher']}), MLflow parent run {info['mlflow_parent_run']}")
    for r in rows:
        extra = f"  [{r['scheduler_state']}]" if r["state"] == "dead" and r["scheduler_state"] else ""
        print(f"  {r['job_id']:>12}  {r['state']:<9} {json.dumps(r['point'])}  {r['run_dir']}{extra}")
        if r["state"] == "failed":
            for line in r.get("error", "").strip().splitlines()[-5:]:
                print(f"      | {line}")
        if r["state"] == "dead":
            print(f"      | {r['cause']}")
        if r["state"] in ("failed", "dead"):
            print(f"      | log {r['log']}")
    running_at = [r["running_at"] for r in rows if "running_at" in r]
    if running_at and info.get("started"):
        print(f"first job started training {min(running_at) - info['started']:.1f} s after the sweep command")
    if any(r["state"] in ("dead", "failed") for r in rows):
        print(f"resume the failed/dead points: make sweep-resume EXP={experiment}")
    return 0


def resume(experiment: str) -> dict:
    """Resubmit the latest sweep's failed and dead points (same launcher, cluster, run dirs and MLflow
    runs); each continues from its latest checkpoint. Returns the updated sweep.json content."""
    path = latest_sweep(experiment)
    if path is None:
        raise ConfigError(
            f"no sweep of {experiment!r} to resume under {outputs_root() / experiment / 'sweeps'}"
        )
    info = json.loads(path.read_text())
    rows = status_rows(path)
    todo = [i for i, r in enumerate(rows) if r["state"] in ("failed", "dead")]
    if not todo:
        return {**info, "resubmitted": []}
    executor = make_executor(info["launcher"], Path(info["logs"]), info.get("cluster"))
    if info["launcher"] == "slurm":
        executor.update_parameters(job_name=info["sweep_id"])
    run_dirs = [Path(info["jobs"][i]["run_dir"]) for i in todo]
    for i, d in zip(todo, run_dirs):
        if rows[i]["state"] == "dead":
            mark_mlflow_run(d, "KILLED", note=f"job {rows[i]['job_id']} died: {rows[i]['cause']}")
        write_status(d, "submitted", resubmitted_after=rows[i]["state"])
    jobs = _submit_points(executor, run_dirs, info.get("slots", ""), int(info.get("max_parallel", 0)))
    for i, job in zip(todo, jobs):
        entry = info["jobs"][i]
        entry["past_job_ids"] = [*entry.get("past_job_ids", []), entry["job_id"]]
        entry["job_id"] = str(job.job_id)
    _write_sweep_json(path.parent, info)
    return {**info, "resubmitted": [info["jobs"][i] for i in todo]}


def job_table(rows: list[dict], now: float | None = None) -> str:
    """One line per point: job id, state, step k/N, the last step's accuracy/reward and time, the point."""
    now = time.time() if now is None else now
    lines = [f"{'job':>10}  {'state':<9} {'step':>9}  {'acc':>6} {'reward':>7} {'s/step':>7}  point"]
    for r in rows:
        prog = read_progress(Path(r["run_dir"]))
        m = prog.get("metrics", {})
        step = f"{prog['step']}/{prog['total']}" if prog else "-"
        acc = m.get("train/accuracy", m.get("val/accuracy"))
        reward = m.get("train/reward_mean", m.get("train/loss"))
        cells = [f"{v:.3f}" if v is not None else "-" for v in (acc, reward)]
        secs = f"{m['timing/step_s']:.1f}" if "timing/step_s" in m else "-"
        lines.append(f"{r['job_id']:>10}  {r['state']:<9} {step:>9}  {cells[0]:>6} {cells[1]:>7} {secs:>7}  "
                     f"{json.dumps(r['point'])}")  # fmt: skip
    return "\n".join(lines)


def wait(info: dict, poll_s: float = 10.0) -> int:
    """A live table of the points until every one has ended (redrawn in place on a terminal, printed
    again only when a state or step changes otherwise); 1 if any failed/died."""
    sweep_json = Path(info["logs"]).parent / "sweep.json"
    states = ("submitted", "waiting", "running", "preempted", "requeued", "done", "failed", "dead")
    tty = sys.stdout.isatty()
    shown = None
    while True:
        rows = status_rows(sweep_json)
        counts = {s: sum(r["state"] == s for r in rows) for s in states}
        key = [(r["state"], read_progress(Path(r["run_dir"])).get("step")) for r in rows]
        if tty or key != shown:
            head = time.strftime("%H:%M:%S") + "  " + " ".join(f"{k}={v}" for k, v in counts.items() if v)
            text = head + "\n" + job_table(rows)
            print(("\x1b[H\x1b[J" if tty else "") + text, flush=True)
            shown = key
        if all(r["state"] in ENDED for r in rows):
            reconcile_mlflow(info, rows)
            for r in rows:
                if r["state"] in ("failed", "dead"):
                    print(
                        f"{r['job_id']} {r['state']}: {r.get('message') or r.get('cause', '')} (log {r['log']})"
                    )
            return 1 if counts["failed"] + counts["dead"] else 0
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    parser = argparse.ArgumentParser(
        prog="python -m orchestration.sweep", description=__doc__.splitlines()[0]
    )
    parser.add_argument("experiment")
    parser.add_argument("overrides", nargs="*", help="key=value overrides applied to every point")
    parser.add_argument("--launcher", default="local", choices=["local", "slurm"])
    parser.add_argument("--cluster", default=None, help="slurm/<profile>.yaml (default: local)")
    parser.add_argument("--wait", action="store_true", help="wait, printing job states, until all finish")
    parser.add_argument("--status", action="store_true", help="print the state of the latest sweep and exit")
    parser.add_argument(
        "--resume", action="store_true", help="resubmit the latest sweep's failed/dead points"
    )
    parser.add_argument("--poll", type=float, default=10.0, help="seconds between --wait updates")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                        help="replace (or add) a grid key's values, e.g. --grid seed=1")  # fmt: skip
    args = parser.parse_intermixed_args(argv)  # overrides may follow --grid options
    if args.status:
        return print_status(args.experiment)
    try:
        if args.resume:
            info = resume(args.experiment)
            if not info["resubmitted"]:
                print(f"sweep {info['sweep_id']}: nothing to resume (no failed or dead point)")
                return 0
            print(f"sweep {info['sweep_id']}: resubmitted {len(info['resubmitted'])} point(s)")
            for job in info["resubmitted"]:
                print(f"  job {job['job_id']} (was {job['past_job_ids'][-1]})  {json.dumps(job['point'])}")
        else:
            grid = parse_grid_overrides(args.grid)
            info = submit(args.experiment, args.launcher, args.cluster, args.overrides, started, grid)
            rate = len(info["jobs"]) / max(info["submit_s"], 1e-9) * 60
            print(
                f"sweep {info['sweep_id']}: {len(info['jobs'])} job(s) via {info['launcher']}"
                f" (submitted in {info['submit_s']:.2f} s, {rate:.0f} jobs/min)"
            )
            for job in info["jobs"]:
                print(f"  job {job['job_id']}  {json.dumps(job['point'])}  -> {job['run_dir']}")
    except (ConfigError, LauncherError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"MLflow parent run {info['mlflow_parent_run']} (make ui); logs in {info['logs']}")
    print(f"status: make sweep-status EXP={args.experiment}")
    if args.wait:
        return wait(info, args.poll)
    return 0


if __name__ == "__main__":
    from infra import allocator

    allocator.ensure()  # before anything else: may re-exec this process with the allocator preloaded
    sys.exit(main())
