"""FlexAttention alone on the shared-prompt and packed masks, stage by stage: where a layout stalls.

    python -m bench.flex_probe [--cases shared:1x16384,shared:2x16384,packed:1x32768] [--stage-s 90] [--out FILE]

Each case draws a paper-like micro-batch (a 512-token prompt, responses long-tailed up to the unit's length)
and times, separately and synchronised: the block mask (the policy's `shared_prompt_block_mask`, or the
document mask transformers builds for packed rows), a second build of the same shape (recompiles show here),
the compiled FlexAttention forward (cold, then warm), and a forward + backward (cold, then warm), with
Qwen3-4B's heads (32 query, 8 key/value, head_dim 128) in bf16 on a GPU, fp32 and small heads on the CPU.
A stage that runs past `--stage-s` dumps every thread's Python stack (faulthandler) and the probe goes on
waiting, so the log says where the time went. The shared-prompt layout's first micro-batch stalled on an H200
inside the policy (docs/gpu.md); this separates the mask, the kernel's compilation and its run.
tests/test_flex_probe.py runs it on the CPU (forward only there: torch has no CPU FlexAttention backward).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import signal
import sys
import time
from pathlib import Path

import torch

from infra.process_exit import exit_now


def segments_for(units: int, length: int, prompt: int = 512, seed: int = 0) -> torch.Tensor:
    """(units, length) segment ids as `collate_shared` makes them: the prompt (0), then responses 1, 2, ...
    back to back with long-tailed lengths until the unit is full (the last one cut to fit)."""
    g = torch.Generator().manual_seed(seed)
    seg = torch.full((units, length), -1, dtype=torch.long)
    for u in range(units):
        seg[u, :prompt] = 0
        col, j = prompt, 1
        while col < length:
            n = int(torch.exp(torch.log(torch.tensor(1024.0)) + torch.randn(1, generator=g)).clamp(8, 8192))
            n = min(n, length - col)
            seg[u, col : col + n] = j
            col, j = col + n, j + 1
    return seg


def document_mask(doc: torch.Tensor):
    """The packed rows' block mask: causal within each document (what transformers builds from position ids)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[b, q_idx] == doc[b, kv_idx]) & (kv_idx <= q_idx)

    B, T = doc.shape
    return create_block_mask(mask_mod, B, None, T, T, device=doc.device, _compile=True)


class Stage:
    """Times one stage with the device synchronised; past `limit` seconds every thread's stack is dumped."""

    def __init__(self, name: str, limit: float, cuda: bool, record: dict) -> None:
        self.name, self.limit, self.cuda, self.record = name, limit, cuda, record

    def __enter__(self) -> Stage:
        faulthandler.dump_traceback_later(self.limit, repeat=False, file=sys.stderr, exit=False)
        if self.cuda:
            torch.cuda.synchronize()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.cuda and exc_type is None:
            torch.cuda.synchronize()
        faulthandler.cancel_dump_traceback_later()
        seconds = time.perf_counter() - self.t0
        first_line = str(exc).strip().splitlines()[0][:300] if exc is not None and str(exc).strip() else ""
        self.record[self.name] = (
            round(seconds, 4) if exc_type is None else f"error: {exc_type.__name__}: {first_line}"
        )
        print(f"    {self.name}: {self.record[self.name] if exc_type else f'{seconds:.3f}s'}", flush=True)
        return exc_type is not None and exc_type is not KeyboardInterrupt  # an error is recorded, not raised


def run_case(case: str, args, device: torch.device) -> dict:
    from torch.nn.attention.flex_attention import flex_attention

    from train.policy.attention import shared_prompt_block_mask

    kind, size = case.split(":")
    units, length = (int(x) for x in size.split("x"))
    cuda = device.type == "cuda"
    H, KV, D = (32, 8, 128) if cuda else (4, 2, 32)
    dtype = torch.bfloat16 if cuda else torch.float32
    seg = segments_for(units, length).to(device)
    record: dict = {"case": case, "units": units, "length": length, "segments": int(seg.max()) + 1}
    print(f"[{case}] {units} unit(s) x {length} tokens, {record['segments']} segments", flush=True)
    build = (
        (lambda: shared_prompt_block_mask(seg))
        if kind == "shared"
        else (lambda: document_mask(seg.clamp(min=0)))
    )
    mask = None
    with Stage("mask_cold_s", args.stage_s, cuda, record):
        mask = build()
    with Stage("mask_warm_s", args.stage_s, cuda, record):
        mask = build()
    if mask is None:
        return record
    record["mask_sparsity"] = round(float(mask.sparsity()), 2)
    attn = torch.compile(flex_attention)
    grad = cuda  # torch has no CPU backward for FlexAttention: inputs that need one are refused there
    q = torch.randn(units, H, length, D, device=device, dtype=dtype, requires_grad=grad)
    k, v = (
        torch.randn(units, KV, length, D, device=device, dtype=dtype, requires_grad=grad) for _ in range(2)
    )
    with torch.no_grad():
        for name in ("forward_cold_s", "forward_warm_s"):
            with Stage(name, args.stage_s, cuda, record):
                attn(q, k, v, block_mask=mask, enable_gqa=True)
    if grad:
        for name in ("backward_cold_s", "backward_warm_s"):
            with Stage(name, args.stage_s, cuda, record):
                attn(q, k, v, block_mask=mask, enable_gqa=True).float().sum().backward()
    return record


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="shared:1x16384,shared:2x16384,packed:1x32768")
    p.add_argument("--stage-s", type=float, default=90.0, help="dump the stacks of a stage this slow")
    p.add_argument("--out")
    args = p.parse_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)  # a timeout's USR1: where it sat
    for case in args.cases.split(","):
        kind, _, size = case.partition(":")
        if kind not in ("shared", "packed") or "x" not in size:
            raise SystemExit(f"--cases: {case!r}: expected shared:UNITSxLENGTH or packed:1xLENGTH")
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(json.dumps({"device": name, "torch": torch.__version__}), flush=True)
    rows = []
    for case in args.cases.split(","):
        rows.append(run_case(case, args, device))
        if args.out:
            Path(args.out).write_text(
                json.dumps({"device": name, "torch": torch.__version__, "cases": rows}, indent=1)
            )
    return rows


if __name__ == "__main__":
    main()
    exit_now(0)
