"""Trainer-side features as step plug-ins (issue 23): the length penalty (the proof plug-in: one file,
one knob) on hand-computed values, the table of plug-ins, and the order of a real step's calls: the
rollout engine sleeps right after generation (and ReMax's greedy answers), before any log-prob pass."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.configs import hf_grpo_config
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

    cfg = hf_grpo_config(
        tiny_model, tmp_path / "run", "order", "total_steps=1", "algorithm.adv_estimator=remax",
        "algorithm.use_kl_loss=true", "algorithm.ppo_epochs=2", "algorithm.ppo_mini_batch_size=1",
        "algorithm.length_penalty_coef=0.5", "data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=8",
        "data.builtin_size=16", "optim.lr=1e-3", "reward._target_=tests.rewards_for_tests.VowelShareReward",
    )  # fmt: skip
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


def test_every_declared_need_comes_from_one_row_of_the_provider_table():
    """The estimators' and step plug-ins' needs, signals.<name> included, each map to one INPUT_PROVIDERS
    row whose trainer method exists: there is no other place an input comes from."""
    from train.stages.grpo import GRPOTrainer, provider

    needs = {n for e in registry.ADV_ESTIMATORS.values() for n in e.needs}
    needs |= {n for p in registry.step_plugins() for n in p.needs}
    assert {"signals.classmate_scores", "signals.cot_token_mask", "baseline_scores"} <= needs
    for need in needs:
        method, _ = provider(need)
        assert callable(getattr(GRPOTrainer, method)), need
    assert provider("signals.cot_token_mask") == ("_signal", False)
    assert registry.input_row("signals.") is None and registry.input_row("signal.x") is None


def test_the_signal_row_names_a_missing_signal_and_makes_token_masks_from_spans():
    from functools import partial

    from transformers import AutoTokenizer

    from infra.models import ensure_default_model
    from train.stages.grpo import GRPOTrainer

    tok = AutoTokenizer.from_pretrained(ensure_default_model())
    head, text = tok.encode("hello world"), "hello world foo bar"
    ids = tok.encode(text)
    assert ids[: len(head)] == head and len(ids) > len(head)
    batch = Batch([[1]], [ids], [[]], [text], ["stop"], [0])
    batch.signals = {"cot_spans": [[0, len("hello world")]], "format": [1.0]}
    batch["response_mask"] = torch.ones(1, len(ids))
    trainer = SimpleNamespace(tokenizer=tok)
    trainer._signal = partial(GRPOTrainer._signal, trainer)
    with pytest.raises(
        KeyError, match=r"the reward gave no signal 'classmate_scores' \(it gave: cot_spans, format\)"
    ):
        GRPOTrainer._provide(trainer, batch, ["signals.classmate_scores"])
    GRPOTrainer._provide(trainer, batch, ["signals.format", "signals.cot_token_mask"])
    expected = [1.0] * len(head) + [0.0] * (len(ids) - len(head))
    assert batch["signals.cot_token_mask"].tolist() == [expected]
    assert batch.reward_metrics["cot_token_fraction"] == pytest.approx(len(head) / len(ids))
    assert "signals.format" not in batch  # the reward's own signal stays where the reward put it
