"""Run under torchrun by test_sharded_state.py.

save DIR: one optimizer step on a fixed batch (this rank's half), then the sharded checkpoint, the HF
export, and (rank 0) the full trained weights and optimizer state gathered the old way, for comparison.
load DIR: a fresh policy at this world size loads the sharded checkpoint and dumps what it holds.
"""

import sys
from pathlib import Path

import torch

from train.policy.distributed import init_distributed
from train.policy.fsdp import Policy
from train.policy.sharded_state import export_hf, load_sharded, save_sharded


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
        save_sharded(policy, out / "sharded")
        export_hf(policy, out / "hf", dtype="float32", shard_mb=1)  # 1 MB shards: the index path runs
        weights = policy.full_state_dict()
        optim = policy.optimizer_state()
        if rank == 0:
            torch.save({"weights": weights, "optim": optim}, out / "expected.pt")
    else:
        load_sharded(policy, out / "sharded")
        weights = policy.full_state_dict()
        optim = policy.optimizer_state()
        if rank == 0:
            torch.save({"weights": weights, "optim": optim}, out / f"loaded-{world}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:4])
