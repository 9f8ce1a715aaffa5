"""Sweeps: grid expansion, bad input, and a real 2-point sweep through submitit's local executor."""

import json
import os
import subprocess
import sys

import pytest

from train.config import ConfigError
from train.models import PROJECT_ROOT
from train.sweep import expand_grid, point_slug


def test_expand_grid_is_the_cartesian_product_in_file_order():
    points = expand_grid({"seed": [1, 2], "optim.lr": [1e-6, 1e-5]})
    assert points == [
        {"seed": 1, "optim.lr": 1e-6}, {"seed": 1, "optim.lr": 1e-5},
        {"seed": 2, "optim.lr": 1e-6}, {"seed": 2, "optim.lr": 1e-5},
    ]  # fmt: skip
    assert expand_grid({}) == [{}]
    assert point_slug({"seed": 2, "optim.lr": 1e-5}) == "seed2_lr1e-05"
    with pytest.raises(ConfigError, match="sweep.grid.seed"):
        expand_grid({"seed": []})


EXPERIMENT = """
config:
  experiment: tinysweep
  total_steps: 2
  save_every: 0
  model: {{path: {model}}}
  data: {{prompts_per_step: 2, builtin_size: 16}}
  rollout:
    n: 2
    max_new_tokens: 6
    engine: {{_target_: train.rollout.hf_engine.HFEngine}}
  reward: {{_target_: tests.rewards_for_tests.VowelShareReward}}
sweep:
  grid:
    seed: [1, 2]
  max_parallel: 1
"""


@pytest.mark.slow
def test_two_point_sweep_runs_through_submitit_and_mlflow(tiny_model, tmp_path):
    import mlflow

    (tmp_path / "exps").mkdir()
    (tmp_path / "exps" / "tinysweep.yaml").write_text(EXPERIMENT.format(model=tiny_model))
    env = {
        **os.environ, "PYTHONPATH": str(PROJECT_ROOT), "RLPOST_EXPERIMENTS_DIR": str(tmp_path / "exps"),
        "RLPOST_OUTPUTS": str(tmp_path / "out"), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
    }  # fmt: skip
    run = subprocess.run([sys.executable, "-m", "train.sweep", "tinysweep", "--wait"], env=env, cwd=PROJECT_ROOT,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "2 job(s) via local" in run.stdout
    info = json.loads(next((tmp_path / "out" / "tinysweep" / "sweeps").glob("*/sweep.json")).read_text())
    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    parent = client.get_run(info["mlflow_parent_run"])
    assert parent.data.tags["rlpost.kind"] == "sweep" and "rlpost.git_commit" in parent.data.tags
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    assert sorted(json.loads(c.data.tags["rlpost.grid_point"])["seed"] for c in children) == [1, 2]
    for child in children:
        assert child.info.status == "FINISHED"
        assert len(client.get_metric_history(child.info.run_id, "train/reward_mean")) == 2
    status = subprocess.run([sys.executable, "-m", "train.sweep", "tinysweep", "--status"], env=env,
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert status.stdout.count(" done ") == 2, status.stdout


def test_bad_sweep_input_submits_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "RLPOST_OUTPUTS": str(tmp_path / "out")}
    for args, fragment in [
        (["nope"], "unknown experiment 'nope'"),
        (["grpo_math", "optim.lr=abc"], "optim.lr"),
        (["grpo_math", "--launcher", "slurm", "--cluster", "nocluster"], "unknown cluster profile"),
    ]:
        run = subprocess.run([sys.executable, "-m", "train.sweep", *args], env=env, cwd=PROJECT_ROOT,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert run.returncode == 2 and fragment in run.stderr, (args, run.stderr[-500:])
    assert not (tmp_path / "out").exists()
