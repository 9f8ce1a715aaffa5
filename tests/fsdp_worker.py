"""Run under torchrun by test_fsdp_ranks.py: one GRPO update on a fixed batch, this rank's share of it.

Writes the full gradient (rank 0) to argv[2]: gradients, not updated weights, because Adam's first
step is scale-invariant and would hide a normalisation error. Rows are split across ranks by whole groups,
as the trainer does, and the loss uses the trainer's own normalisation.
"""

import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist

from infra.process_exit import exit_now
from tests.applied_grads import applied_grads
from tests.grpo_batch import grpo_batch
from train.policy.distributed import init_distributed
from train.policy.fsdp import Policy
from train.stages.grpo import make_actor_loss_fn


def main(model: str, out: str, mode: str) -> None:
    rank, world = init_distributed()
    batch = grpo_batch(4, 4, 4000, (3, 9), (1, 12))
    width = batch["response_mask"].shape[1]
    per_rank = len(batch) // world
    mine = list(range(rank * per_rank, (rank + 1) * per_rank))
    # small token budget: several micro-batches per rank, so accumulation is exercised too
    policy = Policy(model, lr=1e-2, grad_clip=1e9, micro_batch_tokens=40, pad_id=0)
    algo = SimpleNamespace(policy_loss_mode="vanilla", entropy_coeff=0.0, use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="k1",
                           clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, loss_agg_mode=mode)  # fmt: skip
    part = batch.select(mine)
    loss_fn = make_actor_loss_fn(algo, part, scale_factor=width, world=world)
    with applied_grads(policy) as grads:
        metrics = policy.train_step(part.prompt_ids, part.response_ids, loss_fn)
    if rank == 0:
        torch.save({"grads": grads, "grad_norm": metrics["actor/grad_norm"]}, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
    exit_now(0)  # results are on disk: no interpreter teardown (infra/process_exit.py says why)
