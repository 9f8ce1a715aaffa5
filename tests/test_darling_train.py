"""DARLING in the trainer: the experiment files build (CPU default and paper preset), the sweep compares
DARLING with its baseline on the same seeds, and real training steps (tiny model, shared vLLM engine,
packaged embedding judge) log the reward figures to MLflow with diversity moving the advantages."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from orchestration.sweep import plan
from train.config import build_config

# ---------------------------------------------------------------------------------------------------
# experiment files
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("experiment", ["darling_math", "darling_wildchat"])
def test_experiments_build_with_and_without_paper_preset(experiment):
    cpu = build_config(experiment)
    paper = build_config(experiment, preset="paper")
    for cfg in (cpu, paper):
        assert cfg.reward._target_ == "train.rewards.darling_reward.DarlingReward"
        assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.norm_adv_by_std_in_grpo is False
    assert cpu.model.path == "default" and cpu.policy.precision == "auto"
    if experiment == "darling_math":  # one-number answers: the same final number = the same class
        assert cpu.reward.judge._target_ == "train.diversity.judges.AnswerAwareJudge"
        assert cpu.reward.judge.get("judge") is None
    else:
        assert cpu.reward.judge._target_ == "train.diversity.judges.EmbeddingJudge"
    assert paper.reward.judge._target_ == "train.diversity.judges.VLLMClassifyJudge"
    assert paper.rollout.n == 8 and paper.rollout.temperature == 1.0
    if experiment == "darling_math":  # Qwen3-4B-Base, 256 x 8, 8192 tokens, lr 1e-6, 4 updates, no KL
        assert cpu.data.train_path == "builtin:multi_answer_spread" and cpu.reward.combine == "multiplicative"
        assert cpu.data.val_path == "builtin:multi_answer_spread" and cpu.data.val_n == cpu.rollout.n == 8
        assert paper.data.prompts_per_step == 256 and paper.rollout.max_new_tokens == 8192
        assert paper.data.prompts_per_step // paper.algorithm.ppo_mini_batch_size == 4
        assert paper.optim.lr == pytest.approx(1e-6) and not paper.algorithm.use_kl_loss
        assert paper.reward.judge.threshold == 0.5 and "Qwen3-4B-Base" in paper.model.path
    else:  # Llama-3.1-8B-Instruct, 64 x 8, 1024 tokens, k3 KL 0.001, 1 update, threshold 0.32
        assert cpu.data.train_path == "builtin:open_prompts"
        assert "_target_" in cpu.reward.quality
        assert paper.data.prompts_per_step == 64 and paper.rollout.max_new_tokens == 1024
        assert paper.algorithm.ppo_mini_batch_size in (None, 64)
        assert paper.algorithm.use_kl_loss and paper.algorithm.kl_loss_type == "k3"
        assert paper.algorithm.kl_loss_coef == pytest.approx(0.001)
        assert paper.reward.judge.threshold == pytest.approx(0.32) and "Llama-3.1-8B" in paper.model.path
        assert paper.reward.quality._target_ == "train.rewards.scorers.RewardModelScorer"


def test_darling_math_reward_builds_its_judge_and_separates_math_answers():
    from hydra.utils import instantiate

    from train.diversity.judges import AnswerAwareJudge, EmbeddingJudge

    reward = instantiate(build_config("darling_math").reward, _recursive_=False)
    assert isinstance(reward.judge, AnswerAwareJudge) and reward.judge.judge is None
    # darling_math's answers are one number: the same number is the same answer, however it is worded
    assert reward.judge.equivalent([("42", "The answer is 42."), ("42", "\\boxed{43}")]) == [True, False]
    # for worded solutions an inner text judge separates methods; a changed number still separates
    near_copies = (
        "Tom has 3 bags of 4 apples, so 3 x 4 = 12 apples in all. The answer is 12.",
        "Tom has 3 bags of 4 apples, so 3 x 4 = 14 apples in all. The answer is 14.",
    )
    worded = AnswerAwareJudge(judge=EmbeddingJudge())
    assert worded.equivalent([near_copies]) == [False]
    assert worded.judge.equivalent([near_copies]) == [True]  # what MiniLM alone says


def test_darling_math_sweep_is_darling_vs_baseline_on_the_same_seeds():
    _, points = plan("darling_math", [])
    grid = sorted((p["reward.combine"], p["seed"]) for p, _ in points)
    assert grid == [("multiplicative", 1), ("multiplicative", 2), ("quality", 1), ("quality", 2)]
    configs = {(p["reward.combine"], p["seed"]): cfg for p, cfg in points}
    for seed in (1, 2):
        darling, base = configs[("multiplicative", seed)], configs[("quality", seed)]
        assert darling.reward.combine == "multiplicative" and base.reward.combine == "quality"
        darling.reward.combine = base.reward.combine = None
        assert darling == base  # same budget, data, algorithm, judge: only the reward differs


# ---------------------------------------------------------------------------------------------------
# training steps
# ---------------------------------------------------------------------------------------------------


class ConstantQuality:
    """Every response scores the same quality, so the reward q x d isolates the diversity term."""

    def __init__(self, value: float = 1.0) -> None:
        self.value = value

    def score(self, prompts, responses):
        return [self.value] * len(responses)


class _Spy:
    """Calls the real function and keeps its arguments and result."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, *args, **kwargs):
        out = self.fn(*args, **kwargs)
        self.calls.append((args, kwargs, out))
        return out


REWARD_METRICS = [
    "reward/quality_mean", "reward/diversity_mean", "reward/distinct_classes_mean", "reward/distinct_share_mean",
    "reward/partition_s", "reward/quality_s",
]  # fmt: skip


@pytest.mark.slow
def test_darling_steps_log_reward_figures_and_diversity_moves_advantages(
    tiny_model, vllm_engine, tmp_path, monkeypatch
):
    import mlflow

    from train.algorithms import registry
    from train.algorithms.diversity import diversity_scores
    from train.diversity.partition import partition_groups
    from train.stages.grpo import GRPOTrainer

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    # A random tiny model writes gibberish whose MiniLM cosine similarities are ~0-0.5: a low threshold
    # makes some (not all) of them equivalent, so groups have several classes of different sizes.
    cfg = build_config(
        "darling_wildchat",
        [
            f"model.path={tiny_model}", f"run_dir={tmp_path / 'run'}", "total_steps=2", "save_every=0",
            "val_every=0", "data.prompts_per_step=4", "data.builtin_size=16", "rollout.n=4",
            "rollout.max_new_tokens=8", "optim.lr=1e-3", "reward.quality._target_=tests.test_darling_train.ConstantQuality",
            "reward.judge.threshold=0.12", "reward.add_bias=false",
        ],
    )  # fmt: skip
    cfg.run_name = "darling"
    trainer = GRPOTrainer(cfg, engine=vllm_engine)
    trainer.reward_fn = reward_spy = _Spy(trainer.reward_fn)
    grpo = registry.adv_estimator("grpo")  # the method-table entry the trainer calls
    adv_spy = _Spy(grpo.fn)
    monkeypatch.setitem(registry.ADV_ESTIMATORS, "grpo", dataclasses.replace(grpo, fn=adv_spy))
    trainer.train()

    # ---- reward figures in MLflow, one value per step ----
    run = mlflow.MlflowClient().get_run(trainer.run_id)
    for key in REWARD_METRICS + ["timing/step_s", "train/reward_mean"]:
        assert len(mlflow.MlflowClient().get_metric_history(trainer.run_id, key)) == 2, key
    assert run.data.metrics["reward/quality_mean"] == 1.0
    assert 1 <= run.data.metrics["reward/distinct_classes_mean"] <= 4
    assert run.data.metrics["reward/partition_s"] < run.data.metrics["timing/step_s"]
    assert "train/accuracy" not in run.data.metrics  # no ground truth, no accuracy

    # ---- reward = d (quality 1), d from the real partition; advantage = r - group mean (no std) ----
    judge = trainer.reward_fn.fn.judge
    nontrivial = 0
    for (args, _, result), ((algo, ctx), _, adv) in zip(reward_spy.calls, adv_spy.calls):
        _, texts, group_index = args
        assert algo.norm_adv_by_std_in_grpo is False
        groups = sorted(set(group_index))
        classes = partition_groups([[t for t, g in zip(texts, group_index) if g == k] for k in groups], judge)
        flat = torch.tensor([c for cl in classes for c in cl])
        gi = torch.tensor(group_index)
        assert gi.tolist() == sorted(gi.tolist())  # prompt-major, so the flattening above lines up
        d = diversity_scores(flat, gi)
        assert result.scores == pytest.approx(d.tolist())
        scores, token_adv = ctx.scores, adv[:, 0]
        for k in groups:
            rows = (gi == k).nonzero().flatten()
            assert token_adv[rows].tolist() == pytest.approx((scores[rows] - scores[rows].mean()).tolist())
            sizes = [sum(c == x for x in classes[k]) for c in classes[k]]
            if 1 < len(set(classes[k])) < len(classes[k]):
                nontrivial += 1
                # an answer in a bigger class (more look-alikes) gets a lower advantage
                for a in range(len(rows)):
                    for b in range(len(rows)):
                        if sizes[a] > sizes[b]:
                            assert token_adv[rows[a]] < token_adv[rows[b]]
            if len(set(classes[k])) == 1:  # all equivalent: every d is the floor, no signal
                assert token_adv[rows].abs().max() == 0
    assert nontrivial >= 1, "no group with several classes of different sizes: lower reward.judge.threshold"


@pytest.mark.slow
def test_darling_math_experiment_trains_one_step(tiny_model, vllm_engine, tmp_path):
    """The darling_math experiment file as a user runs it (DARLING arm), shrunk to a tiny model."""
    from train.stages.grpo import GRPOTrainer

    cfg = build_config(
        "darling_math",
        [
            f"model.path={tiny_model}", f"run_dir={tmp_path / 'math'}", "track=false", "total_steps=1",
            "val_every=0", "data.prompts_per_step=2", "data.builtin_size=8", "rollout.n=3",
            "rollout.max_new_tokens=6",
        ],
    )  # fmt: skip
    cfg.run_name = "math"
    trainer = GRPOTrainer(cfg, engine=vllm_engine)
    metrics = trainer.step(1)
    assert 0 <= metrics["train/accuracy"] <= 1
    # multiplicative: reward = correct x d <= accuracy; the quality_mean is the accuracy itself
    assert metrics["reward/quality_mean"] == pytest.approx(metrics["train/accuracy"])
    assert metrics["train/reward_mean"] <= metrics["train/accuracy"] + 1e-9
    for key in REWARD_METRICS:
        assert math.isfinite(metrics[key]), key
