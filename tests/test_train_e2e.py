"""End to end: GRPO steps with vLLM rollouts, MLflow metrics, checkpoints, and resume after a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from infra.checkpoint import layout as ckpt
from infra.models import PROJECT_ROOT
from train.config import build_config
from train.stages.grpo import GRPOTrainer

pytestmark = pytest.mark.slow

METRICS = [
    "train/reward_mean", "train/reward_std", "train/accuracy", "train/response_length_mean", "actor/pg_clipfrac",
    "actor/ppo_kl", "actor/entropy", "actor/grad_norm", "actor/lr", "perf/rollout_tokens_per_s",
    "timing/rollout_s", "timing/reward_s", "timing/update_s", "timing/weight_sync_s",
]  # fmt: skip
COMPARED = [
    "train/reward_mean",
    "train/response_length_mean",
    "actor/grad_norm",
    "actor/entropy",
    "actor/pg_loss",
]


def _overrides(model: Path, run_dir: Path, steps: int) -> list[str]:
    return [
        f"model.path={model}", f"run_dir={run_dir}", f"total_steps={steps}", "save_every=2", "keep_last=2",
        "reward._target_=tests.rewards_for_tests.VowelShareReward", "data.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=12", "optim.lr=1e-3", "data.builtin_size=64", "seed=3",
        # run A shares the session's fp32 vLLM engine, so both runs train in fp32 (in bf16, what auto picks on
        # an AVX512-BF16 CPU, B's own engine would compute in bf16 and A's not); resume is bit-exact in bf16
        # too when both sides build their own engine (4 steps, every compared metric equal)
        "policy.precision=fp32",
    ]  # fmt: skip


def _history(run_id: str) -> dict[str, dict[int, float]]:
    import mlflow

    client = mlflow.MlflowClient()
    out = {}
    for key in COMPARED + ["train/accuracy"]:
        hist = client.get_metric_history(run_id, key)
        steps = [m.step for m in hist]
        assert len(steps) == len(set(steps)), f"{key} logged twice for a step: {sorted(steps)}"
        out[key] = {m.step: m.value for m in hist}
    return out


def test_train_resume_after_kill_matches_uninterrupted(tiny_model, vllm_engine, mlflow_uri, tmp_path):
    import mlflow

    # A: 4 uninterrupted steps, in this process, on the session's shared engine.
    cfg = build_config(overrides=_overrides(tiny_model, tmp_path / "a", 4))
    cfg.run_name = "a"
    trainer = GRPOTrainer(cfg, engine=vllm_engine)
    initial = {k: v.clone() for k, v in trainer.policy.full_weights()}
    trainer.train()
    run_a = trainer.run_id
    client = mlflow.MlflowClient()
    run = client.get_run(run_a)
    assert run.info.status == "FINISHED"
    for key in METRICS:
        assert len(client.get_metric_history(run_a, key)) == 4, key
    assert run.data.params["optim.lr"] == "0.001"
    assert run.data.tags["rlpost.checkpoint_latest"].endswith("step_000004")
    # the policy learned something: weights moved
    moved = max((v - initial[k]).abs().max().item() for k, v in trainer.policy.full_weights())
    assert moved > 1e-4
    # checkpoints: retention, latest pointer, HF folder loadable by transformers with the trained weights
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path / "a")] == [2, 4]
    latest = ckpt.latest_checkpoint(tmp_path / "a")
    assert latest.name == "step_000004"
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(latest / "hf")
    name = "model.layers.0.mlp.down_proj.weight"
    trained = dict(trainer.policy.full_weights())[name]
    assert torch.equal(loaded.state_dict()[name], trained)
    assert not list((tmp_path / "a" / "checkpoints").glob(".tmp-*"))

    # B: the same run as a real process, killed (SIGKILL) after its step-2 checkpoint, then resumed.
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri, "PYTHONPATH": str(PROJECT_ROOT)}
    cmd = [sys.executable, "-m", "train", *_overrides(tiny_model, tmp_path / "b", 4), "run_name=b"]
    proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    deadline = time.time() + 300
    while not (tmp_path / "b" / "checkpoints" / "step_000002" / "meta.json").exists():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.time() < deadline, "no step-2 checkpoint within 300 s"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    resumed = subprocess.run(cmd + ["resume=true"], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                             timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout
    run_b = (tmp_path / "b" / "mlflow_run_id").read_text().strip()
    assert client.get_run(run_b).info.status == "FINISHED"
    hist_a, hist_b = _history(run_a), _history(run_b)
    for key in COMPARED:
        assert sorted(hist_b[key]) == [1, 2, 3, 4], key  # nothing missing, nothing twice
        for step in (1, 2, 3, 4):
            assert hist_b[key][step] == pytest.approx(hist_a[key][step], rel=1e-3, abs=1e-5), (key, step)
