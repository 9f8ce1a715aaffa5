"""Worker for tests/test_paper_ranks.py (torchrun, gloo): the GPU path's structure at CPU size. A Qwen3-shaped
model of 2 layers with the real 151,936-token vocabulary, packed rows, GRPO groups split unevenly over the
ranks (so some ranks pad), LoRA off and on.

Args: MODEL OUT PHASE SRC. PHASE `first`: one update (its gradient recorded), a DCP save to
OUT/ckpt-<lora>; at world size 1 also the second update. PHASE `resume`: load SRC/ckpt-<lora> (saved at
another world size) and run the second update. Rank 0 writes OUT/result.pt; every rank OUT/rss<rank>.json.
"""

import json
import resource
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from infra.process_exit import exit_now
from tests.applied_grads import applied_grads
from tests.grpo_batch import grpo_batch
from train.batch import Batch
from train.policy.batching import plan_layout
from train.policy.distributed import init_distributed
from train.policy.fsdp import Policy
from train.policy.sharded_state import load_sharded, save_sharded
from train.stages.grpo import make_actor_loss_fn

N_GROUPS, N = 6, 2
SHARES = {1: [6], 2: [4, 2], 4: [3, 1, 1, 1]}  # groups per rank: uneven, as a step's real split can be
LORA = {"off": None, "on": {"rank": 4, "alpha": 8.0}}
LR = 1e-2
MICRO_BATCH_TOKENS = 40  # several micro-batches on the ranks with three groups, one on the others


def update(policy: Policy, part: Batch, width: int, world: int) -> dict:
    algo = SimpleNamespace(policy_loss_mode="vanilla", entropy_coeff=0.0, use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="k1",
                           clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, loss_agg_mode="token-mean")  # fmt: skip
    loss_fn = make_actor_loss_fn(algo, part, scale_factor=width, world=world)
    with applied_grads(policy) as grads:
        metrics = policy.train_step(part.prompt_ids, part.response_ids, loss_fn, with_entropy=False)
    return {"grads": dict(grads), "grad_norm": metrics["actor/grad_norm"],
            "micro_batches": metrics["actor/micro_batches"]}  # fmt: skip


def main(model: str, out: str, phase: str, src: str) -> None:
    rank, world = init_distributed()
    full = grpo_batch(N_GROUPS, N, 150000, (3, 9), (2, 14))
    width = full["response_mask"].shape[1]
    first = sum(SHARES[world][:rank]) * N
    part = full.select(list(range(first, first + SHARES[world][rank] * N)))
    result: dict = {}
    for name, lora in LORA.items():
        policy = Policy(model, lr=LR, grad_clip=1e9, micro_batch_tokens=MICRO_BATCH_TOKENS, pack_sequences=True, pad_id=0,
                        precision="fp32", fp32_matmul="torch",  # no start-up measurement
                        torch_compile=False, lora=lora)  # fmt: skip
        got: dict = {}
        if phase == "first":
            got["first"] = update(policy, part, width, world)
            save_sharded(policy, Path(out) / f"ckpt-{name}")
        else:
            load_sharded(policy, Path(src) / f"ckpt-{name}")
        if phase == "resume" or world == 1:
            got["second"] = update(policy, part, width, world)
            state = policy.optimizer_state().get("state", {})  # collective; full tensors on rank 0 only
            got["adam"] = {f"{n}.{k}": v for n, s in state.items() for k, v in s.items() if k != "step"}
        result[name] = got
        del policy
    real = len(plan_layout("packed", part.prompt_ids, part.response_ids, MICRO_BATCH_TOKENS, 0))
    rss = {"rank": rank, "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "real_micro_batches": real, "cpu_s": time.process_time()}  # fmt: skip
    (Path(out) / f"rss{rank}.json").write_text(json.dumps(rss))
    if rank == 0:
        torch.save(result, Path(out) / "result.pt")
    if world > 1:
        dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:5])
    exit_now(0)  # results are on disk: no interpreter teardown (infra/process_exit.py says why)
