"""Run under torchrun by test_sharded_state.py.

save DIR: one optimizer step on a fixed batch (this rank's half), then a checkpoint as training writes
it (train/checkpoint.py: DCP shards + HF export), a bf16 export in 1 MB shards, and (rank 0) the full
trained weights and optimizer state gathered the old way, for comparison.
load DIR: a fresh policy at this world size resumes from the checkpoint and dumps what it holds.
"""

import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from infra.checkpoint import layout as layout
from infra.process_exit import exit_now
from train import checkpoint as ckpt
from train.policy.distributed import init_distributed
from train.policy.fsdp import Policy
from train.policy.sharded_state import export_hf


def _loss(mb, log_probs, entropy):
    return -(log_probs * mb.response_mask).sum() / 100.0, {}


def main(model: str, folder: str, mode: str) -> None:
    rank, world = init_distributed()
    out = Path(folder)
    policy = Policy(model, lr=1e-2, grad_clip=1e9, pad_id=0)
    if mode == "save":
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(10, 4000, (6,), generator=g).tolist() for _ in range(8)]
        responses = [torch.randint(10, 4000, (5,), generator=g).tolist() for _ in range(8)]
        share = slice(rank * 8 // world, (rank + 1) * 8 // world)
        policy.train_step(prompts[share], responses[share], _loss, with_entropy=False)
        tokenizer = AutoTokenizer.from_pretrained(model)
        ckpt.save_checkpoint(out / "run", 1, policy, tokenizer, {"step": 1}, source_model=model)
        export_hf(policy, out / "hf-bf16", dtype="bfloat16", shard_mb=1)  # 1 MB shards: the index path runs
        weights = policy.full_state_dict()
        optim = policy.optimizer_state()
        if rank == 0:
            torch.save({"weights": weights, "optim": optim}, out / "expected.pt")
    else:
        step = layout.latest_checkpoint(out / "run")
        ckpt.restore_policy(step, policy, ckpt.load_trainer_state(step), rank)
        weights = policy.full_state_dict()
        optim = policy.optimizer_state()
        if rank == 0:
            torch.save({"weights": weights, "optim": optim}, out / f"loaded-{world}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:4])
    exit_now(0)  # results are on disk: no interpreter teardown (infra/process_exit.py says why)
