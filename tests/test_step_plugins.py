"""Trainer-side features as step plug-ins (issue 23): the length penalty (the proof plug-in: one file,
one knob) on hand-computed values, the table of plug-ins, and the order of a real step's calls: the
rollout engine sleeps right after generation (and ReMax's greedy answers), before any log-prob pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from train.algorithms import registry
from train.algorithms.length_penalty import length_penalty, length_penalty_step
from train.batch import Batch
from train.config import ConfigError, build_config


def test_length_penalty_by_hand():
    # lengths 2 and 4 of a budget of 8, coefficient 0.5: -0.5 * 2/8 = -0.125 and -0.5 * 4/8 = -0.25
    assert length_penalty(torch.tensor([2, 4]), 8, 0.5).tolist() == [-0.125, -0.25]
    batch = Batch([[1], [1]], [[5, 6], [5, 6, 7, 8]], [[], []], ["a", "b"], ["stop", "stop"], [0, 0])
    batch["response_mask"] = batch.padded([[1.0] * 2, [1.0] * 4])
    batch["rewards"] = torch.tensor([1.0, 0.0])
    figures = length_penalty_step(SimpleNamespace(length_penalty_coef=0.5), batch, registry.StepContext(8))
    assert batch["rewards"].tolist() == [0.875, -0.25]
    assert figures == {"train/length_penalty_mean": -0.1875}


def test_the_length_penalty_is_a_checked_key_and_runs_only_when_on():
    assert build_config().algorithm.length_penalty_coef == 0.0
    with pytest.raises(ConfigError, match=r"algorithm.length_penalty_coef=-1.0 must be >= 0"):
        build_config(overrides=["algorithm.length_penalty_coef=-1"])
    on = build_config(overrides=["algorithm.length_penalty_coef=0.1"]).algorithm
    assert "length_penalty" in [p.name for p in registry.step_plugins(on, "after_reward")]
    assert "length_penalty" not in [p.name for p in registry.step_plugins(build_config().algorithm)]


def test_step_points_and_inputs_are_refused_when_unknown():
    with pytest.raises(ValueError, match="unknown step point 'mid_update'"):
        registry.register_step("x", "mid_update", enabled=bool)
    with pytest.raises(ValueError, match="unknown need 'logits'"):
        registry.register_step("x", "after_reward", enabled=bool, needs=("logits",))(lambda c, b, x: {})


def test_every_input_has_one_provider():
    from train.stages.grpo import INPUT_PROVIDERS

    assert set(INPUT_PROVIDERS) == set(registry.INPUTS)


def test_a_plugin_check_refuses_a_bad_combination_before_a_model_loads():
    with pytest.raises(ConfigError, match="overlong_buffer_len=20 must be <= rollout.max_new_tokens=16"):
        build_config(overrides=["algorithm.overlong_buffer_len=20", "rollout.max_new_tokens=16"])


@pytest.mark.slow
def test_engine_sleeps_after_generation_before_any_log_prob_pass(tiny_model, dist_group, tmp_path):
    """ReMax (greedy answers need the engine), the KL loss (reference log-probs), two PPO epochs of two
    mini-batches (old log-probs) and the length penalty, one real step with the HF engine."""
    from train.stages.grpo import GRPOTrainer

    cfg = build_config(
        overrides=[
            f"model.path={tiny_model}", f"run_dir={tmp_path / 'run'}", "total_steps=1", "track=false",
            "algorithm.adv_estimator=remax", "algorithm.use_kl_loss=true", "algorithm.ppo_epochs=2",
            "algorithm.ppo_mini_batch_size=1", "algorithm.length_penalty_coef=0.5", "data.prompts_per_step=2",
            "rollout.n=2", "rollout.max_new_tokens=8", "data.builtin_size=16", "optim.lr=1e-3",
            "rollout.engine._target_=train.rollout.hf_engine.HFEngine",
            "reward._target_=tests.rewards_for_tests.VowelShareReward",
        ]
    )  # fmt: skip
    cfg.run_name = "order"
    trainer = GRPOTrainer(cfg)
    calls: list[str] = []

    def spy(obj, method: str, name: str) -> None:
        inner = getattr(obj, method)

        def recorded(*args, **kwargs):
            calls.append(name)
            return inner(*args, **kwargs)

        setattr(obj, method, recorded)

    spy(trainer.engine, "generate", "engine.generate")
    spy(trainer.engine, "sleep", "engine.sleep")
    spy(trainer.engine, "update_weights", "engine.update_weights")
    spy(trainer.policy, "compute_log_probs", "policy.compute_log_probs")
    spy(trainer.policy, "train_step", "policy.train_step")
    spy(trainer.ref, "compute_log_probs", "ref.compute_log_probs")
    try:
        metrics = trainer.step(1)
    finally:
        trainer.close()
    assert calls == [
        "engine.generate",  # the samples
        "engine.generate",  # ReMax's greedy answers: still before the engine sleeps
        "engine.sleep",
        "policy.compute_log_probs",
        "ref.compute_log_probs",
        *["policy.train_step"] * 4,  # 2 epochs x 2 mini-batches
        "engine.update_weights",
    ]
    # the plug-in shaped the rewards by -0.5 * length / 8 on average
    assert metrics["train/length_penalty_mean"] == pytest.approx(
        -0.5 * metrics["train/response_length_mean"] / 8
    )
