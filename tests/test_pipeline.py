"""Stage chaining: plans and keys, sft -> grpo on the tiny model with the SFT stage trained once for a
sweep over the GRPO stage and for reruns, and two concurrent jobs sharing one stage through its lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.models import PROJECT_ROOT
from orchestration.pipeline import plan, point_config, read_result, run_plan, run_point
from train.config import ConfigError


def _write_experiment(folder: Path, name: str, stages: dict, **extra) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(yaml.safe_dump({"stages": stages, **extra}, sort_keys=False))


def _tiny_stages(model: Path, out: Path) -> dict:
    return {
        "sft": {
            "_target_": "train.stages.sft.SFTStage",
            "config": {
                "model": {"path": str(model)}, "output_dir": str(out), "total_steps": 1, "save_every": 0,
                "data": {"builtin_size": 8, "batch_size": 2}, "optim": {"lr": 1e-3},
            },
        },
        "grpo": {
            "_target_": "train.stages.grpo.GRPOStage",
            "model_from": "sft",
            "config": {
                "output_dir": str(out), "total_steps": 1, "save_every": 0,
                "data": {"builtin_size": 8, "prompts_per_step": 2},
                "rollout": {"n": 2, "max_new_tokens": 6, "engine": {"_target_": "train.rollout.hf_engine.HFEngine"}},
                "reward": {"_target_": "tests.rewards_for_tests.VowelShareReward"},
                "optim": {"lr": 1e-3},
            },
        },
    }  # fmt: skip


@pytest.fixture()
def experiments(tmp_path, monkeypatch):
    folder = tmp_path / "experiments"
    folder.mkdir()
    monkeypatch.setattr("train.config.EXPERIMENTS_DIR", folder)
    monkeypatch.setenv("RLPOST_EXPERIMENTS_DIR", str(folder))
    return folder


def test_keys_ignore_placement_and_follow_the_upstream_stage(experiments, tmp_path):
    _write_experiment(experiments, "pipe", _tiny_stages(Path("/models/x"), tmp_path / "out"))
    base = plan("pipe")
    assert [s.name for s in base] == ["sft", "grpo"]
    sft, grpo = base
    assert sft.run_dir == (tmp_path / "out" / "stages" / f"sft-{sft.key}").resolve()
    assert grpo.cfg.model.path == str(sft.run_dir / "checkpoints" / "step_000001" / "hf")
    assert grpo.cfg.tags["rlpost.stage"] == "grpo" and grpo.cfg.resume is True

    # where a run is tracked does not change what it trains
    same = plan("pipe", ["sft.run_name=other", "sft.tags.x=y", "sft.log_every=5", "grpo.track=false"])
    assert [s.key for s in same] == [sft.key, grpo.key]
    # a later-stage change leaves the earlier stage's key alone; an earlier-stage change moves both
    seed = plan("pipe", ["grpo.seed=2"])
    assert seed[0].key == sft.key and seed[1].key != grpo.key
    lr = plan("pipe", ["sft.optim.lr=2e-3"])
    assert lr[0].key != sft.key and lr[1].key != grpo.key
    # sweeps place the last stage in the grid point's folder
    point = plan(
        "pipe",
        ["grpo.seed=2"],
        final={"run_dir": str(tmp_path / "point"), "run_name": "p", "tags": {"rlpost.sweep": "s1"}},
    )
    assert point[1].run_dir == tmp_path / "point" and point[1].cfg.tags["rlpost.sweep"] == "s1"
    assert point[0].run_dir == sft.run_dir and point[0].cfg.tags["rlpost.sweep"] == "s1"
    assert point_config("pipe", ["grpo.seed=2"]).pipeline == "pipe"


def test_plan_errors_are_one_line_and_name_the_stage(experiments, tmp_path):
    stages = _tiny_stages(Path("/models/x"), tmp_path / "out")
    _write_experiment(experiments, "pipe", stages)
    for overrides, message in [
        (["seed=2"], r"pipeline overrides are <stage>.<key>=<value> with a stage among \['sft', 'grpo'\]"),
        (["dpo.beta=1"], "with a stage among"),
        (["sft.optim.lrr=1"], "stage sft: bad config value for optim.lrr"),
        (["grpo.rollout.n=0"], "stage grpo: bad config value: rollout.n=0 must be >= 1"),
    ]:
        with pytest.raises(ConfigError, match=message):
            plan("pipe", overrides)
    _write_experiment(
        experiments, "late", {"a": {**stages["grpo"], "model_from": "sft"}, "sft": stages["sft"]}
    )
    with pytest.raises(ConfigError, match=r"stages.a.model_from='sft': must name an earlier stage"):
        plan("late")
    _write_experiment(experiments, "nokind", {"sft": {"config": {}}})
    with pytest.raises(ConfigError, match="stages.sft: `_target_` missing"):
        plan("nokind")
    _write_experiment(experiments, "badkind", {"sft": {"_target_": "train.stages.nope.Stage"}})
    with pytest.raises(ConfigError, match=r"stages.sft._target_='train.stages.nope.Stage' cannot be loaded"):
        plan("badkind")
    _write_experiment(experiments, "typo", {"sft": {**stages["sft"], "modelfrom": "x"}})
    with pytest.raises(ConfigError, match=r"stages.sft: unknown key\(s\) \['modelfrom'\]"):
        plan("typo")
    (experiments / "single.yaml").write_text("config: {total_steps: 1}\n")
    with pytest.raises(ConfigError, match="has no `stages:` block"):
        plan("single")


def test_the_shipped_experiment_plans(monkeypatch):
    stages = plan("sft_grpo_math")
    assert [(s.name, s.model_from) for s in stages] == [("sft", None), ("grpo", "sft")]
    assert stages[1].cfg.reward["_target_"] == "train.rewards.math_reward.MathReward"  # from base: grpo_math
    assert stages[1].cfg.total_steps == 20 and stages[1].cfg.rollout.n == 6
    dpo, darling = plan("dpo_darling_math", ["darling.reward.combine=quality"])
    assert darling.model_from == "dpo" and darling.cfg.reward.combine == "quality"
    assert (
        darling.cfg.reward["_target_"] == "train.rewards.darling_reward.DarlingReward"
    )  # base: darling_math


def test_sweep_of_a_staged_experiment_submits_pipeline_points():
    """`make sweep EXP=sft_grpo_math`: each grid point is a pipeline job (orchestration/job.py runs run_point)."""
    from orchestration.sweep import plan as sweep_plan

    _, points = sweep_plan("sft_grpo_math", [])
    assert [p for p, _ in points] == [{"grpo.seed": 1}, {"grpo.seed": 2}]
    assert all(cfg.pipeline == "sft_grpo_math" for _, cfg in points)
    assert [list(cfg.overrides) for _, cfg in points] == [["grpo.seed=1"], ["grpo.seed=2"]]


def _stage_runs(client, experiment: str, stage: str) -> list:
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], filter_string=f"tags.`rlpost.stage` = '{stage}'")


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_sft_then_grpo_sweep_points_and_reruns_train_sft_once(
    experiments, tiny_model, dist_group, mlflow_uri, tmp_path, capsys
):
    import mlflow

    _write_experiment(experiments, "pipe", _tiny_stages(tiny_model, tmp_path / "out"))
    client = mlflow.MlflowClient()
    # a sweep grid point (what orchestration/sweep.py's job would run), the last stage in the point's folder
    point = point_config("pipe", ["grpo.seed=1"])
    point.run_dir, point.run_name, point.tags = (
        str(tmp_path / "points" / "seed1"),
        "pipe-seed1",
        {"rlpost.sweep": "s"},
    )
    metrics = run_point(point)
    assert "train/reward_mean" in metrics
    sft_dir = plan("pipe")[0].run_dir
    sft_result, grpo_result = read_result(sft_dir), read_result(tmp_path / "points" / "seed1")
    assert grpo_result["checkpoint"].endswith("points/seed1/checkpoints/step_000001/hf")
    grpo_run = client.get_run(grpo_result["run_id"])
    assert grpo_run.data.params["model.path"] == sft_result["checkpoint"]
    assert grpo_run.data.tags["rlpost.upstream.sft"] == sft_result["run_id"]
    assert grpo_run.data.tags["rlpost.sweep"] == "s" and grpo_run.info.run_name == "pipe-seed1"
    assert client.get_run(sft_result["run_id"]).data.tags["rlpost.stage_key"] == sft_result["key"]

    # another grid point (other GRPO seed) and a plain rerun: the SFT stage is reused, never retrained
    capsys.readouterr()
    run_plan(plan("pipe", ["grpo.seed=2"]), isolate=False)
    run_plan(plan("pipe", ["grpo.seed=2"]), isolate=False)
    out = capsys.readouterr().out
    assert out.count(f"stage sft (key {sft_result['key']}): reusing") == 2
    assert out.count("stage grpo") == 2 and out.count("training in") == 1  # 2nd run reuses GRPO too
    assert len(_stage_runs(client, "pipe", "sft")) == 1
    assert len(_stage_runs(client, "pipe", "grpo")) == 2


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_two_concurrent_jobs_train_a_shared_stage_once(experiments, tiny_model, mlflow_uri, tmp_path):
    import mlflow

    stages = _tiny_stages(tiny_model, tmp_path / "out")
    _write_experiment(experiments, "shared", {"sft": stages["sft"]})
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    cmd = [sys.executable, "-m", "orchestration.pipeline", "shared"]  # each stage in its own process
    procs = [
        subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    text = "\n".join(outs)
    assert text.count("training in") == 1 and text.count("reusing") == 1, text[-3000:]
    assert len(_stage_runs(mlflow.MlflowClient(), "shared", "sft")) == 1
    result = read_result(plan("shared")[0].run_dir)
    assert result["metrics"]["sft/loss"] > 0  # the stage process handed its final metrics back
