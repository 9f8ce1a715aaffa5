"""A 2-point sweep through the real single-node Slurm (slurm/local), end to end, with every fault a
cluster deals out: preemption (USR2 -> submitit checkpoint hook -> requeue), `scontrol requeue`, and a
SIGKILLed job resubmitted with --resume. Both points end FINISHED in their own MLflow run, with every
step's metrics exactly once."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.test_sweep import (
    children_of,
    has_checkpoint,
    metric_steps,
    status_of,
    steps_trained,
    sweep_cli,
    sweep_env,
    sweep_info,
    wait_for,
)

STEPS, SAVE_EVERY = 6, 2


@pytest.mark.slow
def test_slurm_sweep_survives_preemption_requeue_and_kill(slurm_cluster, tiny_model, tmp_path):
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

    # preemption on seed 1 (what Slurm sends before it preempts: USR2), scontrol requeue on seed 2
    wait_for(
        "checkpoint 2 of both points", lambda: all(has_checkpoint(j["run_dir"], 2) for j in info["jobs"])
    )
    assert not any(has_checkpoint(j["run_dir"], STEPS) for j in info["jobs"]), "too fast to interrupt"
    subprocess.run(["scancel", "--signal=USR2", seed1["job_id"]], check=True, timeout=30)
    subprocess.run(["scontrol", "requeue", seed2["job_id"]], check=True, timeout=30)
    wait_for("both restarted by Slurm", lambda: all(status_of(j["run_dir"]).get("restart", 0) >= 1
                                                    for j in info["jobs"]), timeout=300)  # fmt: skip
    assert (Path(seed1["run_dir"]) / "status.json").is_file()

    # seed 1 is then killed outright: the job fails, --status calls it dead, --resume resubmits it
    wait_for("seed 1 running again", lambda: status_of(seed1["run_dir"])["state"] == "running", timeout=300)
    if not has_checkpoint(seed1["run_dir"], STEPS):
        os.kill(status_of(seed1["run_dir"])["pid"], signal.SIGKILL)
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
    for seed, job in zip((1, 2), final["jobs"]):
        child = by_seed[seed]
        assert child.info.status == "FINISHED"
        assert metric_steps(env, child.info.run_id) == list(range(1, STEPS + 1))  # none lost, none twice
        assert child.data.tags["rlpost.job_id"] == job["job_id"] and int(
            child.data.tags["rlpost.job_restart"]
        ) >= (0 if job["past_job_ids"] else 1)
        trained = steps_trained(job["run_dir"], final["logs"])
        print(f"[measure] seed {seed}: {trained} steps trained for {STEPS} (recomputed {trained - STEPS}),"
              f" jobs {job['past_job_ids'] + [job['job_id']]}")  # fmt: skip
        assert trained - STEPS <= 2 * SAVE_EVERY  # at most one checkpoint interval lost per interruption
    assert final["jobs"][0]["past_job_ids"] == [seed1["job_id"]]  # seed 1 was resubmitted after its kill


def test_slurm_profile_keys_are_checked(tmp_path, monkeypatch):
    """A typo in a profile fails naming the key, before Slurm is even asked."""
    from train.config import ConfigError
    from train.launch import executors

    (tmp_path / "typo.yaml").write_text("partition: debug\ngpu_per_node: 8\n")
    monkeypatch.setattr(executors, "SLURM_DIR", tmp_path)
    with pytest.raises(ConfigError, match="unknown key.*gpu_per_node"):
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
    _target_: train.launch.ray_reward.RayReward
    num_workers: 2
    num_cpus_per_worker: 0.5
    reward: {{_target_: tests.test_sweep.SlowVowelReward}}
sweep:
  grid:
    seed: [1]
"""


@pytest.mark.slow
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
