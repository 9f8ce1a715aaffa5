"""Worker for tests/test_weight_sync_stream.py (torchrun, gloo, 2 ranks): one merged weight sync into a bf16
engine, recording each rank's extra peak memory during it and every all-gather it ran (op, dtype, elements).

Args: MODEL OUT. Writes OUT/rank<r>.json. The extra peak is the process's resident high-water mark during
the sync (reset first through /proc/self/clear_refs) less its resident size before.
"""

import ctypes
import json
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from infra.process_exit import exit_now
from train.policy.distributed import init_distributed
from train.policy.fsdp import Policy
from train.rollout.weight_sync import sync_weights


class Engine:
    """What sync_weights hands merged weights to: its own bf16 copy of every weight, filled in place."""

    weight_dtype = torch.bfloat16
    takes_adapters = False

    def __init__(self, shapes: dict[str, torch.Size]) -> None:
        self.weights = {n: torch.zeros(s, dtype=self.weight_dtype) for n, s in shapes.items()}

    def update_weights(self, named) -> None:
        for name, tensor in named:
            self.weights[name].copy_(tensor)


class Gathers(TorchDispatchMode):
    """Every all-gather dispatched while active: (op, dtype of what is sent, elements sent)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "all_gather" in str(func):
            self.seen.append([str(func), str(args[0].dtype), args[0].numel()])
        return func(*args, **(kwargs or {}))


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main(model: str, out: str) -> None:
    rank, _ = init_distributed()
    policy = Policy(model, pad_id=0, torch_compile=False, trainable=False)
    exact = {n: t.clone() for n, t in policy.full_weights()}  # fp32, the stored weights
    engine = Engine({n: t.shape for n, t in exact.items()})
    shapes = [t.numel() for t in exact.values()]
    del exact
    extras = []
    for _ in range(2):  # the first sync also pays one-time costs (gloo's buffers, code paths taken once)
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts at the current size
        before = _kib("VmRSS")
        with Gathers() as gathers:
            metrics = sync_weights(policy, engine)
        extras.append((_kib("VmHWM") - before) * 1024)
    extra = extras[-1]
    exact = dict(policy.full_weights())
    wrong = [n for n, t in exact.items() if not torch.equal(engine.weights[n], t.to(torch.bfloat16))]
    result = {"extra_bytes": extra, "first_extra_bytes": extras[0], "largest_bf16": 2 * max(shapes), "model_bf16": 2 * sum(shapes),
              "gathers": gathers.seen, "sync_bytes": metrics["perf/weight_sync_bytes"], "wrong": wrong}  # fmt: skip
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    exit_now(0)  # results are on disk: no interpreter teardown (infra/process_exit.py says why)
