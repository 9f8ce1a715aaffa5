"""Multi-turn rollouts on the real engine and the one training loop: vLLM's turn-level requests give
token-exact trajectories whose model-token log-probs the engine and the trainer agree on, and GRPO trains
on them with the environment's tokens masked out."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from train.env.registry import build_agent
from train.rollout.base import SamplingConfig

pytestmark = pytest.mark.slow

TOL = 2e-4  # fp32 engine vs trainer (tests/test_rollout_sync.py)
# a user who never accepts: every trajectory runs max_turns model turns with feedback between them
NEVER_RIGHT = {"_target_": "train.env.interactions.answer_check.AnswerCheck", "max_attempts": 10}
ROWS = [
    {"prompt": [{"role": "user", "content": "What is 12 * 34?"}], "ground_truth": "no such answer"},
    {"prompt": [{"role": "user", "content": "Add 5 and 7."}], "ground_truth": "no such answer"},
]


def test_vllm_trajectories_are_token_exact_and_the_trainer_agrees(vllm_engine, tiny_model, dist_group):
    from train.policy.fsdp import Policy

    policy = Policy(tiny_model, pad_id=0)
    vllm_engine.update_weights(policy.full_weights())  # the session engine may hold other weights
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    agent = build_agent(
        {"interaction": NEVER_RIGHT, "max_turns": 3, "max_total_tokens": 200}, vllm_engine, tokenizer
    )
    prompts = agent.encode(ROWS)
    batch = agent.generate(prompts, ROWS, SamplingConfig(n=2, max_new_tokens=6, seed=11))
    assert [e["turns"] for e in batch.episodes] == [3] * 4
    for ids, mask, lps, ep in zip(
        batch.response_ids, batch.token_mask, batch.response_logprobs, batch.episodes
    ):
        assert [s["role"] for s in ep["segments"]] == ["model", "env", "model", "env", "model"]
        assert len(ids) == len(mask) == len(lps) == ep["segments"][-1]["end"]
    # teacher-forced over the whole trajectory, the engine gives the model's tokens the log-probs it
    # sampled them with: the tokens it was given back are the tokens it sampled (token in, token out)
    forced = vllm_engine.sequence_logprobs(batch.prompt_ids, batch.response_ids)
    trainer, _ = policy.compute_log_probs(batch.prompt_ids, batch.response_ids)
    for row, (f, lps, mask) in enumerate(zip(forced, batch.response_logprobs, batch.token_mask)):
        model = [k for k, m in enumerate(mask) if m]
        assert max(abs(f[k] - lps[k]) for k in model) < TOL
        assert max(abs(float(trainer[row, k]) - lps[k]) for k in model) < TOL
    # the same seed reproduces the trajectories
    again = agent.generate(prompts, ROWS, SamplingConfig(n=2, max_new_tokens=6, seed=11))
    assert again.response_ids == batch.response_ids
    agent.close()


def test_grpo_trains_on_multi_turn_trajectories(vllm_engine, tiny_model, tmp_path, monkeypatch):
    import mlflow

    from train.config import build_config, validate
    from train.stages.grpo import GRPOTrainer, run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    cfg = build_config(
        overrides=[
            f"model.path={tiny_model}", f"run_dir={tmp_path / 'run'}", "total_steps=2", "save_every=0",
            "data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=6", "data.builtin_size=16",
            "policy.precision=fp32", "env.interaction=answer_check", "env.max_turns=2", "env.max_total_tokens=120", "log_samples_every=1",
        ]
    )  # fmt: skip
    validate(cfg)
    captured = {}
    original = GRPOTrainer._update

    def spy(self, batch, step):  # the update's mask: the model's tokens only
        captured["mask"], captured["token_mask"] = batch["response_mask"].clone(), batch.token_mask
        return original(self, batch, step)

    monkeypatch.setattr(GRPOTrainer, "_update", spy)
    run(cfg, engine=vllm_engine)
    run_id = (tmp_path / "run" / "mlflow_run_id").read_text()
    metrics = mlflow.MlflowClient().get_run(run_id).data.metrics
    assert metrics["env/turns_mean"] == 2.0 and metrics["env/observation_token_share"] > 0
    assert "actor/grad_norm" in metrics and metrics["env/truncated_rate"] == 1.0
    mask, token_mask = captured["mask"], captured["token_mask"]
    for i, row in enumerate(token_mask):
        assert mask[i, : len(row)].tolist() == [float(m) for m in row] and 0 in row
