"""Worker for tests/test_checkpoint_waits.py (torchrun, gloo): checkpoints saved while rank 0's file work
is slow, under a default process group whose timeout (TIMEOUT_S) is far shorter than that work, as NCCL's
10-minute watchdog is shorter than a large model's export or a pruned step's deletion on a slow file system.

Args: MODEL FOLDER MODE. MODE `export`: rank 0's safetensors writes take SLOW_S each; `prune`: rank 0's
deletions take SLOW_S each (two saves with keep_last=1, so the first step is pruned). Each rank writes the
seconds it spent in save_checkpoint to FOLDER/rank<r>.json; a timeout fails the worker.
"""

import datetime
import json
import shutil
import sys
import time
from pathlib import Path

import torch.distributed as dist
from transformers import AutoTokenizer

import train.policy.sharded_state as sharded_state
from infra.process_exit import exit_now
from train import checkpoint as ckpt
from train.policy.distributed import all_reduce_sum, init_distributed
from train.policy.fsdp import Policy

TIMEOUT_S, SLOW_S = 8, 20


def _slow(fn):
    def wrapped(*args, **kwargs):
        time.sleep(SLOW_S)
        return fn(*args, **kwargs)

    return wrapped


def _loss(mb, log_probs, entropy):
    return -(log_probs * mb.response_mask).sum() / 100.0, {}


def main(model: str, folder: str, mode: str) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank, world = init_distributed()
    policy = Policy(model, lr=1e-2, pad_id=0)
    tokenizer = AutoTokenizer.from_pretrained(model)
    if rank == 0 and mode == "export":
        sharded_state.save_file = _slow(sharded_state.save_file)
    if rank == 0 and mode == "prune":
        shutil.rmtree = _slow(shutil.rmtree)
    spent = []
    for step in (1, 2) if mode == "prune" else (1,):
        policy.train_step([[5, 6, 7]] * 2, [[8, 9]] * 2, _loss, with_entropy=False)
        t0 = time.perf_counter()
        ckpt.save_checkpoint(Path(folder) / "run", step, policy, tokenizer, {"step": step}, keep_last=1)
        spent.append(time.perf_counter() - t0)
        assert all_reduce_sum(1) == world  # the next collective on the default group: nobody is late
    (Path(folder) / f"rank{rank}.json").write_text(json.dumps({"save_s": spent}))
    ckpt.wait_for_pruning()  # rank 0's deletion ends before it exits (no collective waits for it)


if __name__ == "__main__":
    main(*sys.argv[1:4])
    exit_now(0)  # results are on disk: no interpreter teardown (infra/process_exit.py says why)
