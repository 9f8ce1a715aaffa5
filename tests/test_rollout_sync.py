"""vLLM rollouts against the trainer: same weights -> same log-probs; a sync moves vLLM to the new weights."""

import pytest
import torch

from train.policy.fsdp import Policy
from train.rollout.base import SamplingConfig

pytestmark = pytest.mark.slow

# fp32 on both sides; the kernels differ (vLLM CPU attention vs torch SDPA), so not bit-equal.
TOL = 2e-3


def _fixed_batch():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 5000, (n,), generator=g).tolist() for n in (5, 9, 7)]
    responses = [torch.randint(10, 5000, (n,), generator=g).tolist() for n in (6, 3, 8)]
    return prompts, responses


def _max_diff(a: list[list[float]], b: torch.Tensor) -> float:
    return max(abs(x - float(b[i, k])) for i, row in enumerate(a) for k, x in enumerate(row))


def test_sync_makes_vllm_logprobs_match_the_trainer(vllm_engine, tiny_model, dist_group):
    policy = Policy(tiny_model, lr=5e-3, grad_clip=100.0, pad_id=0)
    vllm_engine.update_weights(policy.full_weights())  # the session engine may hold other weights
    prompts, responses = _fixed_batch()
    before, _ = policy.compute_log_probs(prompts, responses)
    assert _max_diff(vllm_engine.sequence_logprobs(prompts, responses), before) < TOL

    def loss_fn(mb, log_probs, entropy):  # push the log-probs of these tokens up
        return -(log_probs * mb.response_mask).sum(), {}

    for _ in range(3):
        policy.train_step(prompts, responses, loss_fn, with_entropy=False)
    after, _ = policy.compute_log_probs(prompts, responses)
    stale = vllm_engine.sequence_logprobs(prompts, responses)
    assert _max_diff(stale, after) > 50 * TOL, "the update did not move the policy enough to test a sync"
    vllm_engine.update_weights(policy.full_weights())
    assert _max_diff(vllm_engine.sequence_logprobs(prompts, responses), after) < TOL


def test_generate_returns_ids_and_logprobs_the_trainer_agrees_with(vllm_engine, tiny_model, dist_group):
    policy = Policy(tiny_model, pad_id=0)
    vllm_engine.update_weights(policy.full_weights())
    prompts = [[1, 504, 3458, 314], [1, 253, 1234]]
    out = vllm_engine.generate(prompts, SamplingConfig(n=3, max_new_tokens=6, seed=7))
    assert len(out) == 6 and out.group_index == [0, 0, 0, 1, 1, 1]
    assert all(len(r) == len(lp) for r, lp in zip(out.response_ids, out.response_logprobs))
    trainer_lp, _ = policy.compute_log_probs(out.prompt_ids, out.response_ids)
    assert _max_diff(out.response_logprobs, trainer_lp) < TOL
    # a fixed seed reproduces the samples
    again = vllm_engine.generate(prompts, SamplingConfig(n=3, max_new_tokens=6, seed=7))
    assert again.response_ids == out.response_ids


def test_hf_engine_agrees_with_the_trainer(tiny_model, dist_group):
    from train.rollout.hf_engine import HFEngine

    engine = HFEngine(tiny_model)
    policy = Policy(tiny_model, pad_id=0)
    out = engine.generate([[1, 504, 3458, 314], [1, 253]], SamplingConfig(n=2, max_new_tokens=5, seed=3))
    trainer_lp, _ = policy.compute_log_probs(out.prompt_ids, out.response_ids)
    assert _max_diff(out.response_logprobs, trainer_lp) < TOL
    prompts, responses = _fixed_batch()
    lp = engine.sequence_logprobs(prompts, responses)
    assert _max_diff(lp, policy.compute_log_probs(prompts, responses)[0]) < TOL


def test_a_groups_samples_share_their_prompts_kv_blocks(vllm_engine, dist_group):
    """On the CPU the engine's KV blocks hold 32 tokens: of 4 samples of one 80-token prompt, vLLM's prefix
    cache serves the later samples the prompt's full blocks (at the CPU default of 128 tokens a block, a
    prompt under 128 tokens shares nothing and is prefilled once per sample)."""
    from vllm import SamplingParams

    prompt = torch.randint(10, 5000, (80,), generator=torch.Generator().manual_seed(5)).tolist()
    vllm_engine.llm.reset_prefix_cache()
    outs = vllm_engine.llm.generate(
        [{"prompt_token_ids": prompt}] * 4,
        [SamplingParams(max_tokens=2, seed=i) for i in range(4)],
        use_tqdm=False,
    )
    assert vllm_engine.kwargs["block_size"] == 32
    assert sum(o.num_cached_tokens or 0 for o in outs) >= 3 * 64  # the 2 full blocks, for each later sample
