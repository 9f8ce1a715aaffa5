"""Sharded checkpoint round trip on whatever device torch sees (the GPU check runs it on CUDA + NCCL).

    python -m bench.dcp_check MODEL_DIR

One optimizer step, `save_sharded`, a fresh policy `load_sharded`s it (weights and AdamW state must be
identical), and the bf16 HF export must equal the trained weights cast to bf16 and load in transformers.
Exit status 1 when any of the three is not so. It uses the public Policy / sharded_state API only
(Policy(...), train_step, full_state_dict, optimizer_state, save_sharded, load_sharded, export_hf);
tests/test_bench_checks.py runs it on the CPU.
"""

import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from infra.process_exit import exit_now
from train.policy.distributed import init_distributed
from train.policy.fsdp import Policy
from train.policy.sharded_state import export_hf, load_sharded, save_sharded


def _loss(mb, log_probs, entropy):
    return -(log_probs * mb.response_mask).sum() / 100.0, {}


def check(model: str) -> dict:
    """The round trip's figures; `resumed_identical`, `adamw_identical` and `export_equals_bf16` must be True."""
    init_distributed()
    policy = Policy(model, precision="auto", lr=1e-4, pad_id=0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 4000, (40,), generator=g).tolist() for _ in range(8)]
    responses = [torch.randint(10, 4000, (60,), generator=g).tolist() for _ in range(8)]
    policy.train_step(prompts, responses, _loss, with_entropy=False)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        save_sharded(policy, Path(tmp) / "sharded")
        t1 = time.perf_counter()
        export_hf(policy, Path(tmp) / "export", dtype="bfloat16")
        t2 = time.perf_counter()
        fresh = Policy(model, precision="auto", lr=1e-4, pad_id=0)
        load_sharded(fresh, Path(tmp) / "sharded")
        want, got = policy.full_state_dict(), fresh.full_state_dict()
        same = all(torch.equal(want[k], got[k]) for k in want)
        opt_a, opt_b = policy.optimizer_state()["state"], fresh.optimizer_state()["state"]
        same_opt = all(torch.equal(opt_a[k]["exp_avg_sq"], opt_b[k]["exp_avg_sq"]) for k in opt_a)
        hf = AutoModelForCausalLM.from_pretrained(Path(tmp) / "export").state_dict()
        same_hf = all(torch.equal(hf[k].cpu(), want[k].to(torch.bfloat16)) for k in want)
        size = sum(p.stat().st_size for p in (Path(tmp) / "sharded").iterdir()) / 2**20
    return {
        "device": str(policy.device), "saved_mib": size, "save_s": t1 - t0, "export_s": t2 - t1,
        "resumed_identical": same, "adamw_identical": same_opt, "export_equals_bf16": same_hf,
    }  # fmt: skip


def main(model: str) -> int:
    r = check(model)
    print(
        f"dcp on {r['device']}: saved {r['saved_mib']:.0f} MiB in {r['save_s']:.2f}s, bf16 HF export "
        f"{r['export_s']:.2f}s; resumed weights identical {r['resumed_identical']}, AdamW state identical "
        f"{r['adamw_identical']}, HF export == bf16(weights) {r['export_equals_bf16']}"
    )
    return 0 if r["resumed_identical"] and r["adamw_identical"] and r["export_equals_bf16"] else 1


if __name__ == "__main__":
    exit_now(main(sys.argv[1]))
