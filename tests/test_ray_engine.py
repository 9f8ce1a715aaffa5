"""Rollout engines as Ray actors: the batch split and merge (pure), then real vLLM engines in two actors
whose samples and log-probs agree with the trainer's policy before and after a weight sync."""

import pytest
import torch

from train.rollout.base import SamplingConfig
from train.rollout.ray_engine import split_prompts

TOL = 2e-3  # as tests/test_rollout_sync.py: fp32, vLLM CPU attention vs torch SDPA


def test_split_prompts_is_contiguous_balanced_and_drops_empty_parts():
    assert split_prompts(5, 2) == [range(0, 3), range(3, 5)]
    assert split_prompts(2, 4) == [range(0, 1), range(1, 2)]
    assert split_prompts(6, 3) == [range(0, 2), range(2, 4), range(4, 6)]
    assert [p for r in split_prompts(17, 4) for p in r] == list(range(17))


def _max_diff(a: list[list[float]], b: torch.Tensor) -> float:
    return max(abs(x - float(b[i, k])) for i, row in enumerate(a) for k, x in enumerate(row))


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_vllm_engines_in_ray_actors_sample_and_sync_like_the_trainer(tiny_model, dist_group):
    import ray

    from train.policy.fsdp import Policy
    from train.rollout.ray_engine import RayEngine

    ray.init(address="local", num_cpus=2, log_to_driver=False, include_dashboard=False)
    engine = None
    try:
        engine = RayEngine(
            tiny_model, engine={"_target_": "train.rollout.vllm_engine.VLLMEngine", "kv_cache_gb": 1},
            num_engines=2, num_cpus_per_engine=1, dtype="float32", max_model_len=256, seed=0,
        )  # fmt: skip
        policy = Policy(tiny_model, lr=5e-3, grad_clip=100.0, pad_id=0)
        prompts = [[1, 504, 3458, 314], [1, 253, 1234], [1, 99, 4000, 7, 12]]
        out = engine.generate(prompts, SamplingConfig(n=2, max_new_tokens=6, seed=3))
        assert len(out) == 6 and out.group_index == [0, 0, 1, 1, 2, 2]
        assert out.prompt_ids == [p for p in prompts for _ in range(2)]
        assert all(len(r) == len(lp) > 0 for r, lp in zip(out.response_ids, out.response_logprobs))
        trainer_lp, _ = policy.compute_log_probs(out.prompt_ids, out.response_ids)
        assert _max_diff(out.response_logprobs, trainer_lp) < TOL  # both actors hold the policy's weights
        again = engine.generate(prompts, SamplingConfig(n=2, max_new_tokens=6, seed=3))
        assert again.response_ids == out.response_ids  # per-row seeds: reproducible across actors

        def loss_fn(mb, log_probs, entropy):
            return -(log_probs * mb.response_mask).sum(), {}

        for _ in range(3):
            policy.train_step(out.prompt_ids, out.response_ids, loss_fn, with_entropy=False)
        after, _ = policy.compute_log_probs(out.prompt_ids, out.response_ids)
        stale = engine.sequence_logprobs(out.prompt_ids, out.response_ids)
        assert _max_diff(stale, after) > 50 * TOL, "the update did not move the policy enough to test a sync"
        engine.update_weights(policy.full_weights())
        assert _max_diff(engine.sequence_logprobs(out.prompt_ids, out.response_ids), after) < TOL
    finally:
        if engine is not None:
            engine.close()
        ray.shutdown()


def test_ray_engine_rejects_a_bad_engine_count(tiny_model):
    from train.rollout.ray_engine import RayEngine

    with pytest.raises(ValueError, match="num_engines=0"):
        RayEngine(tiny_model, num_engines=0)
