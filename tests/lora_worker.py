"""Run under torchrun by test_lora.py: LoRA on FSDP2 over gloo ranks.

step DIR: a LoRA policy trains one step on this rank's share of a fixed batch (loss x world: FSDP averages
gradients over ranks), writes a checkpoint as training does, and rank 0 dumps the adapters, their AdamW state
and the log-probs of the frozen base (adapters off) and of a separately built reference.
load DIR: a fresh LoRA policy at this world size resumes from that checkpoint and dumps what it holds.
"""

import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from infra.process_exit import exit_now
from train import checkpoint as ckpt
from train.policy.distributed import init_distributed
from train.policy.fsdp import Policy

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def main(model: str, folder: str, mode: str) -> None:
    rank, world = init_distributed()
    out = Path(folder)
    policy = Policy(model, precision="fp32", lr=1e-2, grad_clip=1e9, pad_id=0, lora=LORA)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 4000, (6,), generator=g).tolist() for _ in range(8)]
    responses = [torch.randint(10, 4000, (5,), generator=g).tolist() for _ in range(8)]
    if mode == "step":
        share = slice(rank * 8 // world, (rank + 1) * 8 // world)

        def loss(mb, log_probs, entropy):
            return -(log_probs * mb.response_mask).sum() / 100.0 * world, {}

        policy.train_step(prompts[share], responses[share], loss, with_entropy=False)
        ckpt.save_checkpoint(out / "run", 1, policy, AutoTokenizer.from_pretrained(model), {"step": 1},
                             source_model=model)  # fmt: skip
        base = policy.frozen_base().compute_log_probs(prompts, responses)[0]
        reference = Policy(model, precision="fp32", trainable=False).compute_log_probs(prompts, responses)[0]
        extra = {"base": base, "reference": reference}
    else:
        step = ckpt.latest_checkpoint(out / "run")
        ckpt.restore_policy(step, policy, ckpt.load_trainer_state(step), rank)
        extra = {}
    adapters = dict(policy.adapter_weights())
    optim = policy.optimizer_state()
    if rank == 0:
        torch.save({"adapters": adapters, "optim": optim, **extra}, out / f"{mode}-{world}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:4])
    exit_now(0)  # results are on disk: no interpreter teardown (infra/process_exit.py says why)
