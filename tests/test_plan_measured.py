"""The planner (train/plan.py) against what the code allocates: peak live tensor bytes of the policy's log-prob
pass and of its first optimizer step, measured on the CPU by a dispatch-mode tracker, beside the planner's
terms for the same shapes (issue 24 item 10). The planner may be conservative, never short."""

from __future__ import annotations

import json

import pytest
import torch

from train.plan import Arch, Workload, memory
from train.policy.memory import peak_tensor_bytes

pytestmark = pytest.mark.slow

T = 512  # micro_batch_tokens: 8 rows of 4 + 60 tokens are one micro-batch


def _loss(mb, log_probs, entropy):
    return -(log_probs * mb.response_mask).sum() / 100.0, {}


def test_planned_log_prob_pass_and_update_cover_the_measured_peaks(tiny_model, dist_group):
    from train.policy.fsdp import Policy

    policy = Policy(tiny_model, precision="bf16", pad_id=0, micro_batch_tokens=T, share_prompts=False)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 4000, (4,), generator=g).tolist() for _ in range(8)]
    responses = [torch.randint(10, 4000, (60,), generator=g).tolist() for _ in range(8)]
    _, logprob_peak = peak_tensor_bytes(policy.compute_log_probs, prompts, responses)
    _, update_peak = peak_tensor_bytes(policy.train_step, prompts, responses, _loss, with_entropy=False)

    arch = Arch.from_config(json.loads((tiny_model / "config.json").read_text()))
    w = Workload(
        world_size=1, samples_per_step=8, n=1, prompt_tokens=4, response_tokens=60, micro_batch_tokens=T,
        updates_per_step=1, epochs=1, old_logprob_pass=True, ref_pass=False, shared_prompts=False,
        compute_bytes=2, gradient_checkpointing=False, cpu_offload=False, gpu_memory_utilization=0.5,
        tensor_parallel_size=1, sleep_level=2, max_model_len=64, dense_attention=True,
    )  # fmt: skip
    m = {k: v * 2**30 for k, v in memory(arch, w, 80.0).items()}
    # what the call allocates above the fp32 parameter shards that existed before it
    planned_logprob = m["unsharded_layers"] + m["unsharded_root"] + m["logprob_pass"]
    planned_update = m["grads_fp32"] + m["adamw_fp32"] + m["unsharded_layers"] + m["unsharded_root"]
    planned_update += m["update_growth"]
    for what, measured, planned in (
        ("log-prob pass", logprob_peak, planned_logprob),
        ("first optimizer step", update_peak, planned_update),
    ):
        ratio = measured / planned
        print(
            f"{what}: measured {measured / 2**20:.1f} MiB, planned {planned / 2**20:.1f} MiB, ratio {ratio:.2f}"
        )
        assert ratio <= 1.1, (
            f"{what}: measured {measured / 2**20:.0f} MiB > planned {planned / 2**20:.0f} MiB"
        )
        assert ratio >= 0.6, f"{what}: planned {planned / 2**20:.0f} MiB is far above the measured"


def test_an_optimizer_step_leaves_weights_and_adamw_state_only(tiny_model, dist_group):
    """The gradients are freed once applied: what `train_step` leaves allocated is the AdamW moments (created
    by the first step, 8 bytes a parameter) and nothing of the gradients' 4 bytes a parameter, which would
    otherwise sit beside the engine's KV cache through the next rollout (the planner's peak_rollout and
    peak_logprobs count 12 bytes a parameter, not 16)."""
    from train.policy.fsdp import Policy
    from train.policy.memory import LiveTensorBytes

    policy = Policy(tiny_model, precision="bf16", pad_id=0, micro_batch_tokens=T, share_prompts=False)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 4000, (4,), generator=g).tolist() for _ in range(4)]
    responses = [torch.randint(10, 4000, (30,), generator=g).tolist() for _ in range(4)]
    params = list(policy.trainable_parameters())
    param_bytes = sum(p.numel() * 4 for p in params)  # fp32 shards (world size 1: the whole model)
    for step in range(2):
        with LiveTensorBytes() as live:
            metrics = policy.train_step(prompts, responses, _loss, with_entropy=False)
        assert metrics["actor/grad_norm"] > 0
        assert all(p.grad is None for p in params)
        left = live.current  # bytes allocated during the call and still alive after it
        adamw = 2 * param_bytes if step == 0 else 0  # the moments appear at the first step, then are reused
        assert left < adamw + param_bytes / 4, (
            f"step {step}: {left / 2**20:.1f} MiB left allocated, AdamW {adamw / 2**20:.1f} MiB, "
            f"gradients would add {param_bytes / 2**20:.1f} MiB"
        )
