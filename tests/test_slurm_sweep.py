"""A 2-point sweep through the real single-node Slurm (slurm/local), end to end, with every fault a
cluster deals out: preemption (USR2 -> the step finishes, a checkpoint, then submitit's hook requeues),
`scontrol requeue` (SIGTERM -> the same checkpoint, Slurm requeues), and a SIGKILLed job resubmitted with
--resume. Both points end FINISHED in their own MLflow run, with every step's metrics exactly once."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from infra.executors import pid_alive
from tests.test_sweep import (
    children_of,
    metric_steps,
    status_of,
    steps_trained,
    sweep_cli,
    sweep_env,
    sweep_info,
    wait_for,
)

STEPS, SAVE_EVERY = 8, 0  # no periodic checkpoint: whatever survives an interruption, its own checkpoint kept


def progress_of(run_dir: str) -> int:
    try:
        return int(json.loads((Path(run_dir) / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def stop_and_time(job: dict, command: list[str]) -> dict:
    """Send a scheduler command to a running job; wait until the job's training process has exited.
    Returns what happened: signal-to-exit seconds, the step it stopped after, its checkpoint."""
    pid, before = status_of(job["run_dir"])["pid"], progress_of(job["run_dir"])
    sent = time.time()
    subprocess.run(command, check=True, timeout=30)
    wait_for(
        f"job {job['job_id']} exits after {command[0]}", lambda: not pid_alive(pid), timeout=120, poll=0.1
    )
    secs = time.time() - sent
    st = status_of(job["run_dir"])
    return {"secs": secs, "before": before, "state": st["state"], "step": st.get("step"),
            "checkpoint": st.get("checkpoint"), "signal": st.get("signal"), "job_id": job["job_id"],
            "run_id": (Path(job["run_dir"]) / "mlflow_run_id").read_text().strip()}  # fmt: skip


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_slurm_sweep_survives_preemption_requeue_and_kill(slurm_cluster, tiny_model, tmp_path):
    """Seed 1: submitit's USR2 (preemption / time limit warning): the step finishes, a checkpoint is written,
    then submitit requeues the job. Seed 2: `scontrol requeue` (SIGTERM, SIGKILL after KillWait): the same
    checkpoint, then Slurm requeues it. Without periodic checkpoints (save_every=0), each resumes from its
    preemption checkpoint in the same MLflow run: no step trained twice, none lost. Seed 1 is then
    SIGKILLed outright (no checkpoint possible): --status says dead, --resume resubmits it."""
    env = sweep_env(tmp_path, tiny_model, name="tinyslurm", steps=STEPS, save_every=SAVE_EVERY, delay=1.5)
    t0 = time.time()
    run = sweep_cli(env, "tinyslurm", "--launcher", "slurm", "--cluster", "local", timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "2 job(s) via slurm" in run.stdout
    info = sweep_info(env, "tinyslurm")
    seed1, seed2 = info["jobs"]
    wait_for(
        "a job running", lambda: any(status_of(j["run_dir"])["state"] == "running" for j in info["jobs"])
    )
    print(f"\n[measure] slurm: sweep command -> first job running {time.time() - t0:.1f} s")

    wait_for("step 2 of both points", lambda: all(progress_of(j["run_dir"]) >= 2 for j in info["jobs"]),
             timeout=600)  # fmt: skip
    usr2 = stop_and_time(seed1, ["scancel", "--signal=USR2", seed1["job_id"]])
    requeue = stop_and_time(seed2, ["scontrol", "requeue", seed2["job_id"]])
    for name, got in (("USR2", usr2), ("scontrol requeue", requeue)):
        print(f"[measure] slurm {name}: job {got['job_id']} stopped after step {got['step']} (step {got['before']} "
              f"when signalled), exited {got['secs']:.1f} s after the command, state {got['state']}, "
              f"checkpoint {got['checkpoint']}, MLflow run {got['run_id']}")  # fmt: skip
    assert usr2["state"] == "requeued" and usr2["signal"] == "SIGUSR2", usr2
    assert requeue["state"] == "preempted" and requeue["signal"] == "SIGTERM", requeue
    for got in (usr2, requeue):
        assert got["step"] is not None and got["step"] < STEPS and got["checkpoint"], got
        assert got["checkpoint"].endswith(f"step_{got['step']:06d}")
    wait_for("both restarted by Slurm", lambda: all(status_of(j["run_dir"]).get("restart", 0) >= 1
                                                    and status_of(j["run_dir"])["state"] == "running"
                                                    for j in info["jobs"]), timeout=300)  # fmt: skip
    restarted_at = time.time()

    # seed 1 is then killed outright: the job fails, --status calls it dead, --resume resubmits it
    killed_after = None
    if status_of(seed1["run_dir"])["state"] != "done":
        pid = status_of(seed1["run_dir"])["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for("seed 1's process gone", lambda: not pid_alive(pid), timeout=60, poll=0.1)
        killed_after = progress_of(seed1["run_dir"])  # read once it is dead: the steps it completed
        wait_for("seed 1 dead", lambda: " dead " in sweep_cli(env, "tinyslurm", "--status", timeout=60).stdout,
                 timeout=120, poll=2)  # fmt: skip
        resumed = sweep_cli(env, "tinyslurm", "--resume", timeout=120)
        assert resumed.returncode == 0 and "resubmitted 1 point(s)" in resumed.stdout, resumed.stderr[-2000:]

    wait_for("both points done", lambda: all(status_of(j["run_dir"])["state"] == "done" for j in info["jobs"]),
             timeout=600, poll=2)  # fmt: skip
    status = sweep_cli(env, "tinyslurm", "--status", timeout=60)
    assert status.stdout.count(" done ") == 2, status.stdout

    import mlflow

    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    parent = client.get_run(info["mlflow_parent_run"])
    assert parent.info.status == "FINISHED" and parent.data.tags["rlpost.scheduler"] == "slurm:local"
    children = children_of(env, parent.info.run_id)
    assert len(children) == 2, [c.info.run_name for c in children]  # no second run for a resumed point
    final = sweep_info(env, "tinyslurm")
    by_seed = {json.loads(c.data.tags["rlpost.grid_point"])["seed"]: c for c in children}
    for seed, job, got in zip((1, 2), final["jobs"], (usr2, requeue)):
        child = by_seed[seed]
        assert child.info.status == "FINISHED" and child.info.run_id == got["run_id"]  # both halves, one run
        history = client.get_metric_history(child.info.run_id, "train/reward_mean")
        assert sorted(m.step for m in history) == list(range(1, STEPS + 1))  # none lost, none twice
        first_half = sorted(m.step for m in history if m.timestamp / 1000 < restarted_at - 1)
        assert first_half[: got["step"]] == list(range(1, got["step"] + 1))
        trained = steps_trained(job["run_dir"], final["logs"])
        recomputed = trained - STEPS
        print(f"[measure] seed {seed}: {trained} steps trained for {STEPS} (recomputed {recomputed}), jobs "
              f"{job['past_job_ids'] + [job['job_id']]}, MLflow run {child.info.run_id}")  # fmt: skip
        # nothing recomputed through the USR2 or requeue; the SIGKILL loses what followed the checkpoint
        assert recomputed == (killed_after - got["step"] if seed == 1 and killed_after is not None else 0)
    assert final["jobs"][0]["past_job_ids"] == ([seed1["job_id"]] if killed_after is not None else [])


def test_slurm_profile_keys_are_checked(tmp_path, monkeypatch):
    """A typo in a profile fails naming the key, before Slurm is even asked."""
    from infra import executors

    (tmp_path / "typo.yaml").write_text("partition: debug\ngpu_per_node: 8\n")
    monkeypatch.setattr(executors, "SLURM_DIR", tmp_path)
    with pytest.raises(executors.LauncherError, match="unknown key.*gpu_per_node"):
        executors.load_cluster_profile("typo")
    profile = {"partition": "gpu", "mem_gb": 64, "timeout_min": 30, "tasks_per_node": 2, "account": None}
    params = executors.slurm_parameters(profile)
    assert params == {"partition": "gpu", "mem": "64G", "time": 30, "ntasks_per_node": 2}


RAY_EXPERIMENT = """
config:
  experiment: tinyray
  total_steps: 2
  save_every: 0
  model: {{path: {model}}}
  data: {{prompts_per_step: 4, builtin_size: 16}}
  rollout:
    n: 2
    max_new_tokens: 6
    engine:
      _target_: train.rollout.ray_engine.RayEngine
      max_model_len: 256
      num_engines: 2
      num_cpus_per_engine: 1
      engine: {{_target_: train.rollout.vllm_engine.VLLMEngine, kv_cache_gb: 1}}
  reward:
    _target_: train.rewards.ray_reward.RayReward
    num_workers: 2
    num_cpus_per_worker: 0.5
    reward: {{_target_: tests.test_sweep.SlowVowelReward}}
sweep:
  grid:
    seed: [1]
"""


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_two_task_slurm_job_trains_with_ray_engines_and_reward_workers_on_both_nodes(
    slurm_cluster, tiny_model, tmp_path
):
    """CLUSTER=ray_local: task 0 starts a Ray head and the trainer, task 1 joins as a Ray node; the
    rollout engines (vLLM) and the reward workers are Ray actors on both nodes, and the run finishes in
    MLflow with every step. A real multi-node job runs the same job script with one task per node."""
    env = sweep_env(tmp_path, tiny_model, name="tinyray")
    (tmp_path / "exps" / "tinyray.yaml").write_text(RAY_EXPERIMENT.format(model=tiny_model))
    run = sweep_cli(env, "tinyray", "--launcher", "slurm", "--cluster", "ray_local", timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    info = sweep_info(env, "tinyray")
    (job,) = info["jobs"]
    wait_for("the job done or failed", lambda: status_of(job["run_dir"])["state"] in ("done", "failed"),
             timeout=900, poll=2)  # fmt: skip
    logs = "\n".join(p.read_text() for p in Path(info["logs"]).glob("*_log.*"))
    assert status_of(job["run_dir"])["state"] == "done", logs[-3000:]
    assert "[ray] 2 rollout engine(s) on 2 node(s)" in logs, logs[-3000:]
    assert "[ray] 2 reward worker(s) on 2 node(s)" in logs, logs[-3000:]
    (child,) = children_of(env, info["mlflow_parent_run"])
    assert child.info.status == "FINISHED"
    assert metric_steps(env, child.info.run_id) == [1, 2]
    assert child.data.metrics["timing/weight_sync_s"] > 0  # weights went to the actors after each update


@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_start_script_clears_jobs_left_by_a_cluster_that_died(slurm_cluster, tmp_path):
    """A machine stopped mid-test leaves jobs RUNNING in slurmctld's saved state with no process behind
    them: the node stays ALLOCATED, RESUME is refused and no srun starts (the CI failure of 2026-11-25).
    Killing the whole cluster with a job running reproduces it; slurm/local/start.sh must bring it back."""
    root = Path(__file__).resolve().parents[1] / "slurm" / "local"
    subprocess.run(
        [str(root / "start.sh")], capture_output=True, timeout=300, check=True
    )  # an idle node first
    job = subprocess.run(
        ["sbatch", "--parsable", "--exclusive", "-o", str(tmp_path / "out"), "--wrap", "sleep 600"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        _kill_cluster_under_running_job(root, job)
    finally:
        subprocess.run(["scancel", job], capture_output=True)


def _kill_cluster_under_running_job(root: Path, job: str) -> None:
    wait_for(
        f"job {job} to run",
        lambda: (
            subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
            ).stdout.strip()
            == "RUNNING"
        ),
        timeout=60,
    )
    time.sleep(16)  # start.sh leaves a job younger than 15 s alone (it may still be starting its slurmstepd)
    # the machine "stops": every Slurm process dies at once, the saved state still says RUNNING
    for name in ("slurmstepd", "slurmd", "slurmctld"):
        subprocess.run(["pkill", "-9", "-x", name])
    subprocess.run(["pkill", "-9", "-f", "sleep 600"])
    time.sleep(1)
    start = subprocess.run([str(root / "start.sh")], capture_output=True, text=True, timeout=300)
    assert start.returncode == 0, start.stdout + start.stderr
    assert "cancelling jobs left by an earlier run" in start.stdout
    queue = subprocess.run(["squeue", "-h", "-o", "%A %T"], capture_output=True, text=True).stdout
    assert job not in queue.split(), queue
    srun = ["srun", "--immediate=15", "-t", "1", "hostname"]
    assert subprocess.run(srun, capture_output=True, timeout=60).returncode == 0
