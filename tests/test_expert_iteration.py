"""Expert iteration: the filter and the SFT schedule by hand, config errors, and real rounds on the tiny model
(HF rollouts, FSDP policy, MLflow curves, checkpoints)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from train.config import ConfigError, build_config, validate
from train.rewards.base import RewardResult
from train.stages.expert_iteration import kept_indices, sft_batches


def test_kept_samples_are_the_correct_ones_and_optionally_formatted():
    reward = RewardResult(
        scores=[1.0, 0.0, 0.0, 1.0], correct=[1.0, 0.0, 1.0, 1.0], signals={"format": [1.0, 1.0, 0.0, 1.0]}
    )
    assert kept_indices(reward, require_format=False) == [0, 2, 3]
    assert kept_indices(reward, require_format=True) == [0, 3]
    with pytest.raises(ValueError, match="no `format` signal"):
        kept_indices(RewardResult(scores=[1.0], correct=[1.0]), require_format=True)
    with pytest.raises(ValueError, match="must report `correct`"):
        kept_indices(RewardResult(scores=[1.0]), require_format=False)


def test_sft_batches_cover_every_kept_sample_once_per_epoch():
    batches = sft_batches(5, 2, epochs=3, seed=7)
    assert [len(b) for b in batches] == [2, 2, 1] * 3
    for epoch in range(3):
        assert sorted(i for b in batches[3 * epoch : 3 * epoch + 3] for i in b) == [0, 1, 2, 3, 4]
    assert batches[:3] != batches[3:6]  # reshuffled each epoch
    assert sft_batches(0, 2, epochs=2, seed=0) == []


def test_config_errors_name_the_key():
    ok = ["trainer=expert_iteration", "ei.sft_epochs=2"]
    validate(build_config(overrides=ok))
    for bad, message in [
        (["trainer=ei"], "trainer='ei' is not one of"),
        (["ei.sft_epochs=0"], "ei.sft_epochs must be >= 1"),
        (["ei.batch_size=3", "world_size=2"], "ei.batch_size must be >= 1 and divisible by world_size"),
        (["trainer=expert_iteration", "ei.require_format=true"], "ei.require_format=true needs a reward"),
        (["trainer=expert_iteration", "optim.schedule=cosine"], "optim.schedule=constant"),
        (["data.prompt_template=r2"], "data.prompt_template='r2' is not one of"),
    ]:
        with pytest.raises(ConfigError, match=message):
            validate(build_config(overrides=bad))
    fmt = ["trainer=expert_iteration", "ei.require_format=true",
           "reward._target_=train.rewards.r1_zero_reward.R1ZeroReward"]  # fmt: skip
    validate(build_config(overrides=fmt))


def _overrides(model: Path, run_dir: Path, rounds: int, *extra: str) -> list[str]:
    return [
        f"model.path={model}", f"run_dir={run_dir}", f"total_steps={rounds}", "save_every=1", "keep_last=1",
        "trainer=expert_iteration", "reward._target_=tests.rewards_for_tests.VowelShareReward",
        "rollout.engine._target_=train.rollout.hf_engine.HFEngine", "data.prompts_per_step=4", "rollout.n=4",
        "rollout.max_new_tokens=12", "optim.lr=1e-3", "data.builtin_size=64", "seed=3", "policy.precision=fp32",
        "ei.batch_size=4", "ei.sft_epochs=2", *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_expert_iteration_rounds_train_on_kept_samples(tiny_model, dist_group, mlflow_uri, tmp_path):
    """Two real rounds: the kept samples (vowel-rich gibberish, VowelShareReward's `correct`) are trained on
    for 2 epochs, so the policy's weights move and the round's curves are in MLflow."""
    import mlflow
    from transformers import AutoModelForCausalLM

    from infra.checkpoint import layout as ckpt
    from train.stages.grpo import run

    cfg = build_config(overrides=_overrides(tiny_model, tmp_path / "a", 2, "val_every=2",
                                            "data.val_path=builtin:arithmetic", "data.val_size=4"))  # fmt: skip
    validate(cfg)
    last = run(cfg)
    client = mlflow.MlflowClient()
    run_id = (tmp_path / "a" / "mlflow_run_id").read_text()
    hist = {
        k: {m.step: m.value for m in client.get_metric_history(run_id, k)}
        for k in ("ei/round", "ei/kept_fraction", "ei/kept_samples", "ei/sft_updates", "sft/loss",
                  "train/accuracy", "val/accuracy")
    }  # fmt: skip
    assert hist["ei/round"] == {1: 1.0, 2: 2.0}
    assert sorted(hist["val/accuracy"]) == [0, 2]
    for step in (1, 2):
        kept = hist["ei/kept_samples"][step]
        assert (
            hist["ei/kept_fraction"][step]
            == pytest.approx(kept / 16)
            == pytest.approx(hist["train/accuracy"][step])
        )
        assert hist["ei/sft_updates"][step] == 2 * -(-kept // 4)  # 2 epochs of ceil(kept / 4) batches
    assert all(kept > 0 for kept in hist["ei/kept_samples"].values())  # the test exercises the update
    assert hist["sft/loss"][1] > 0 and last["ei/round"] == 2.0
    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(ckpt.latest_checkpoint(tmp_path / "a") / "hf").state_dict()
    key = "model.layers.1.mlp.up_proj.weight"
    assert not torch.allclose(before[key], after[key])
    assert client.get_run(run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_a_round_that_keeps_nothing_makes_no_update(tiny_model, dist_group, mlflow_uri, tmp_path):
    from transformers import AutoModelForCausalLM

    from infra.checkpoint import layout as ckpt
    from train.stages.grpo import run

    # the real math grader on a random model's gibberish: nothing is correct
    cfg = build_config(overrides=_overrides(tiny_model, tmp_path / "b", 1,
                                            "reward._target_=train.rewards.r1_zero_reward.R1ZeroReward"))  # fmt: skip
    last = run(cfg)
    assert last["ei/kept_samples"] == 0 and last["ei/sft_updates"] == 0 and "sft/loss" not in last
    assert last["reward/format_rate"] == 0.0 and last["reward/fmt_wrong_ans_wrong"] == 1.0
    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    after = AutoModelForCausalLM.from_pretrained(ckpt.latest_checkpoint(tmp_path / "b") / "hf").state_dict()
    key = "model.layers.1.mlp.up_proj.weight"
    torch.testing.assert_close(before[key], after[key])
