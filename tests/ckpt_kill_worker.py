"""Run by test_checkpoint_kill.py: one `save_checkpoint` of a tiny model that stops at a named point and
waits there to be SIGKILLed (the pause points are patched in here, so the same worker kills the old and
the new train/checkpoint.py at the same spot).

    python tests/ckpt_kill_worker.py MODEL RUN_DIR STEP KEEP_LAST POINT PAUSE_FILE

POINT:
- `write`: mid-write of the temporary folder (its first shard file being written, trainer state not yet);
- `rename`: just before the temporary folder is renamed to the step folder (after any fsync); the
  fsyncs made so far are listed in PAUSE_FILE;
- `remove`: inside the removal of an old step folder (replacing the same step, or pruning with
  KEEP_LAST), right after its trainer state was unlinked.

At the point the worker writes PAUSE_FILE (JSON) and sleeps until it is killed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

from infra.checkpoint import layout as layout
from tests.standin_policy import StandInPolicy
from train import checkpoint as ckpt

_replace, _unlink, _fsync = os.replace, os.unlink, os.fsync
fsynced: list[str] = []


def pause(pause_file: Path, point: str, **info) -> None:
    part = pause_file.with_name(pause_file.name + ".part")
    part.write_text(json.dumps({"point": point, "fsynced": fsynced, **info}))
    _replace(part, pause_file)
    while True:
        time.sleep(60)


def install(point: str, pause_file: Path) -> None:
    def fsync(fd):
        try:
            fsynced.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
        return _fsync(fd)

    os.fsync = fsync
    if point == "write":

        def paused_save(obj, f, *a, **k):
            pause(pause_file, point, path=str(f))

        torch.save = paused_save
    elif point == "rename":

        def replace(src, dst, *a, **k):
            if Path(src).name.startswith(".tmp-") and Path(dst).name.startswith(layout.PREFIX):
                pause(pause_file, point, src=str(src), dst=str(dst))
            return _replace(src, dst, *a, **k)

        os.replace = replace
    elif point == "remove":

        def unlink(path, *a, **k):
            _unlink(path, *a, **k)
            if Path(os.fsdecode(path)).name == layout.TRAINER_STATE:
                pause(pause_file, point)

        os.unlink = unlink
    else:
        raise SystemExit(f"unknown point {point!r}")


def main(model: str, run_dir: str, step: str, keep_last: str, point: str, pause_file: str) -> None:
    config = AutoConfig.from_pretrained(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    torch.manual_seed(int(step))
    policy = StandInPolicy(LlamaForCausalLM(config))
    install(point, Path(pause_file))
    keep = int(keep_last) if keep_last != "none" else None
    ckpt.save_checkpoint(
        run_dir, int(step), policy, tokenizer, {"step": int(step)}, keep_last=keep, source_model=model
    )
    sys.exit(f"the save ended without reaching pause point {point!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
