"""Classmate CoT training end to end on tiny models: the policy on the session vLLM engine, a second tiny
model as a classmate on its own in-process vLLM engine, token-level advantages checked against the
estimators' definitions on the actual rollout."""

from __future__ import annotations

import statistics

import pytest
import torch
from omegaconf import OmegaConf

from train.algorithms.classmate import whiten_batch
from train.config import build_config
from train.rewards.classmate_reward import ClassmateReward
from train.stages.grpo import GRPOTrainer

pytestmark = pytest.mark.slow


class ParityGradedClassmateReward(ClassmateReward):
    """The real classmate reward, except that grading is "even length = correct": random tiny models
    never answer arithmetic right, and the test needs main and classmate scores that vary."""

    def _grade(self, texts, golds):
        return [float(len(t) % 2 == 0) for t in texts]


class RecordingTrainer(GRPOTrainer):
    """Keeps the last reward result and the advantages handed to the policy update."""

    def step(self, step):
        inner = self.reward_fn

        def recording(rows, responses, group_index):
            self.last_reward = inner(rows, responses, group_index)
            return self.last_reward

        self.reward_fn = recording
        try:
            return super().step(step)
        finally:
            self.reward_fn = inner

    def _update(self, batch, step):
        self.last = (batch, batch["advantages"].clone(), batch["response_mask"])
        return super()._update(batch, step)


def _group_adv(values: list[float], groups: list[int]) -> list[float]:
    """GRPO advantage with std normalisation, written out per group."""
    out = []
    for v, g in zip(values, groups):
        members = [x for x, h in zip(values, groups) if h == g]
        mean = statistics.fmean(members)
        std = statistics.stdev(members) if len(members) > 1 else 1.0
        out.append((v - mean) / (std + 1e-6))
    return out


def _cot_positions(tokenizer, ids: list[int], span: tuple[int, int]) -> set[int]:
    """Brute force: token k is a CoT token if its decoded characters overlap the span."""
    ends = [len(tokenizer.decode(ids[:k], skip_special_tokens=True)) for k in range(len(ids) + 1)]
    return {k for k in range(len(ids)) if ends[k] < span[1] and ends[k + 1] > span[0] and span[0] < span[1]}


@pytest.fixture(scope="module")
def classmate_model(tmp_path_factory):
    from infra.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("classmate") / "model", seed=7)


def test_classmate_training_token_level_advantages(tiny_model, classmate_model, vllm_engine, tmp_path):
    cfg = build_config(
        overrides=[
            f"model.path={tiny_model}", f"run_dir={tmp_path / 'run'}", "track=false", "total_steps=2",
            "save_every=0", "data.prompts_per_step=2", "data.builtin_size=16", "rollout.n=4",
            "rollout.max_new_tokens=12", "optim.lr=1e-3",
        ]
    )  # fmt: skip
    cfg.algorithm.adv_estimator = "gdpo"  # with the classmate reward set below (validation needs both)
    cfg.reward = OmegaConf.create(
        {
            "_target_": "tests.test_classmate_train.ParityGradedClassmateReward",
            # random text has spaces: CoT = everything before the last space, answer = the last word
            "think_start": None,
            "think_end": " ",
            "use_classmate_main_cond": "always",
            "max_new_tokens": 6,
            "classmates": [
                {
                    "_target_": "train.rewards.classmate_reward.EngineClassmate",
                    "model_path": str(classmate_model),
                    "max_model_len": 512,
                }
            ],
        }
    )
    cfg.run_name = "classmate"
    trainer = RecordingTrainer(cfg, engine=vllm_engine)
    classmate = trainer.reward_fn.classmates[0]
    probe = ["What is 1 + 1?" * 3]
    before = classmate.complete(probe, 8, seed=5)
    tok = trainer.tokenizer
    try:
        for step, (estimator, mode) in enumerate([("gdpo", "classmate_partial"), ("gdpo_wo_bn", "all")], 1):
            trainer.cfg.algorithm.adv_estimator = estimator
            trainer.cfg.algorithm.token_level_classmate_reward_mode = mode
            metrics = trainer.step(step)
            rollout, adv, mask = trainer.last
            reward = trainer.last_reward
            assert [tok.decode(r, skip_special_tokens=True) for r in rollout.response_ids] == rollout.texts
            for key in ("reward/main_mean", "reward/classmate_mean", "reward/cot_fraction"):
                assert key in metrics, key
            assert metrics["reward/cot_fraction"] > 0 and metrics["reward/cot_token_fraction"] > 0
            m = _group_adv(reward.scores, rollout.group_index)
            c = _group_adv(reward.signals["classmate_scores"], rollout.group_index)
            mc = [a + b for a, b in zip(m, c)]
            cot_value = whiten_batch(torch.tensor(mc)).tolist() if estimator == "gdpo" else mc
            differing = 0
            for i, ids in enumerate(rollout.response_ids):
                cot = _cot_positions(tok, ids, reward.signals["cot_spans"][i])
                for k in range(len(ids)):
                    want = cot_value[i] if (k in cot or mode == "all") else m[i]
                    assert adv[i, k].item() == pytest.approx(want, abs=1e-4), (step, i, k)
                assert float(adv[i, len(ids) :].abs().sum()) == 0.0  # padding
                values = {round(adv[i, k].item(), 5) for k in range(len(ids))}
                differing += len(values) > 1
            # CoT and answer tokens of one response get different advantages under classmate_partial
            assert (differing > 0) == (mode == "classmate_partial")
            assert metrics["actor/grad_norm"] > 0
        # the policy's weight syncs into its engine never reach the classmate's own engine
        assert classmate.complete(probe, 8, seed=5) == before
    finally:
        trainer.close()
