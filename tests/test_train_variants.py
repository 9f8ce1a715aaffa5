"""Trainer paths the main e2e test does not take: KL to a frozen reference, several mini-batch updates
per rollout, entropy bonus, gradient checkpointing, the HF generate engine, and bad data paths."""

import math

import pytest

from orchestration.train_cli import main
from tests.configs import hf_grpo_config
from train.stages.grpo import GRPOTrainer

pytestmark = pytest.mark.slow


def test_kl_minibatches_entropy_checkpointing_with_hf_engine(tiny_model, dist_group, tmp_path):
    cfg = hf_grpo_config(
        tiny_model, tmp_path / "run", "variants", "total_steps=2", "save_every=0",
        "reward._target_=tests.rewards_for_tests.VowelShareReward", "data.prompts_per_step=4",
        "data.builtin_size=32", "rollout.n=3", "rollout.max_new_tokens=8", "algorithm.use_kl_loss=true",
        "algorithm.kl_loss_type=k3", "algorithm.ppo_mini_batch_size=2", "algorithm.ppo_epochs=2",
        "algorithm.entropy_coeff=0.01", "algorithm.loss_agg_mode=seq-mean-token-sum-norm",
        "policy.gradient_checkpointing=true", "policy.micro_batch_tokens=64", "optim.lr=1e-3",
        "val_every=2", "data.val_path=builtin:arithmetic", "data.val_size=6",
    )  # fmt: skip
    trainer = GRPOTrainer(cfg)
    assert trainer.ref is not None
    first = trainer.step(1)
    second = trainer.step(2)
    assert first["actor/updates"] == 4.0  # 2 epochs x 2 mini-batches
    assert first["actor/micro_batches"] >= 2
    # the policy moved away from the frozen reference: KL is zero at step 1's first update, not after
    assert second["actor/kl_loss"] > 0
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "train/reward_mean"):
        assert math.isfinite(second[key]), key
    val = trainer.validate(2)
    assert set(val) == {"val/reward_mean", "val/accuracy"} and 0 <= val["val/accuracy"] <= 1
    trainer.close()


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_plus_plus", "remax"])
def test_other_estimators_train(estimator, tiny_model, dist_group, tmp_path):
    cfg = hf_grpo_config(
        tiny_model, tmp_path / estimator, estimator, "total_steps=1",
        "reward._target_=tests.rewards_for_tests.VowelShareReward", "data.prompts_per_step=2",
        "data.builtin_size=8", "rollout.n=3", "rollout.max_new_tokens=6", f"algorithm.adv_estimator={estimator}",
        "optim.lr=1e-3",
    )  # fmt: skip
    trainer = GRPOTrainer(cfg)
    metrics = trainer.step(1)
    assert metrics["actor/grad_norm"] > 0 and math.isfinite(metrics["actor/pg_loss"])
    trainer.close()


def test_missing_dataset_is_a_one_line_error(capsys, tmp_path):
    assert main([f"data.train_path={tmp_path / 'nope.parquet'}", "track=false", "model.path=default"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.parquet" in err[0]


def test_sampled_validation_reports_pass_at_k_and_distinct_answers(tiny_model, dist_group, tmp_path):
    """data.val_n > 1: n samples per held-out multi_answer prompt, scored by DARLING's reward and checker."""
    cfg = hf_grpo_config(
        tiny_model, tmp_path / "run", "sampled-val", "total_steps=1",
        "data.train_path=builtin:multi_answer", "data.builtin_size=8", "data.prompts_per_step=2",
        "rollout.n=2", "rollout.max_new_tokens=4", "reward._target_=train.rewards.darling_reward.DarlingReward",
        "reward.judge._target_=train.diversity.judges.AnswerAwareJudge",
        "val_every=1", "data.val_path=builtin:multi_answer", "data.val_size=3", "data.val_n=3",
    )  # fmt: skip
    trainer = GRPOTrainer(cfg)
    val = trainer.validate(1)
    trainer.close()
    assert set(val) == {
        "val/reward_mean", "val/accuracy", "val/pass_at_1", "val/pass_at_2", "val/pass_at_3",
        "val/distinct_correct_mean", "val/distinct_k",
    }  # fmt: skip
    assert val["val/pass_at_1"] == pytest.approx(val["val/accuracy"])  # every prompt has 3 samples
    assert val["val/pass_at_1"] <= val["val/pass_at_2"] <= val["val/pass_at_3"] <= 1
    assert 1 <= val["val/distinct_k"] <= 3 and 0 <= val["val/distinct_correct_mean"] <= val["val/distinct_k"]
