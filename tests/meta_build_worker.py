"""Worker for tests/test_meta_build.py (torchrun, gloo): host memory of each rank while the policy is built.

Args: WARM_MODEL BIG_MODEL OUT. A warm-up build of WARM_MODEL first (imports, FSDP2's first-use state), then
each rank's peak resident set (VmHWM, reset just before) while building BIG_MODEL; rank 0 then compares the
built weights with `from_pretrained`'s and writes both ranks' figures to OUT (JSON).
"""

import json
import re
import sys

import torch
from transformers import AutoModelForCausalLM

from infra.process_exit import exit_now
from train.policy.distributed import all_gather_objects, barrier, init_distributed
from train.policy.fsdp import Policy


def _status() -> dict[str, int]:
    text = open("/proc/self/status").read()
    return {k: int(re.search(rf"{k}:\s+(\d+) kB", text).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}


def main(warm: str, big: str, out: str) -> None:
    rank, world = init_distributed()
    Policy(warm, pad_id=0)
    barrier()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    before = _status()["VmRSS"]
    policy = Policy(big, pad_id=0)
    peak = _status()["VmHWM"] - before
    figures = all_gather_objects({"rank": rank, "build_peak_growth": peak})
    full = policy.full_state_dict()  # collective; the whole model on rank 0
    if rank == 0:
        ref = AutoModelForCausalLM.from_pretrained(big, dtype=torch.float32).state_dict()
        same = sorted(ref) == sorted(full) and all(torch.equal(ref[k], full[k]) for k in ref)
        model_bytes = sum(p.numel() * 4 for p in policy.model.parameters())  # fp32, a tied tensor once
        with open(out, "w") as f:
            json.dump({"ranks": figures, "model_bytes": model_bytes, "identical": same, "world": world}, f)
    barrier()


if __name__ == "__main__":
    main(*sys.argv[1:4])
    exit_now(0)  # results are on disk: no interpreter teardown (infra/process_exit.py says why)
