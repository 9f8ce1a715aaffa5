"""The log-prob kernels over the vocabulary (train/policy/packed_logprobs.py), eager against compiled, on this
machine's device: accuracy against fp64 and time, kernel by kernel and for a whole micro-batch.

    python -m bench.logprob_kernels [--vocab 151936] [--positions 32768] [--dtypes bf16,fp32] [--chunk-scales 1,8]
                                    [--out FILE]              (make bench-kernels OVERRIDES="...")

Kernels: each of the four row kernels on one chunk (`chunk_rows(vocab)` positions, as the policy runs them),
from fresh random logits (scale 3, one -inf entry) for every check, outputs poisoned with NaN first so an
unwritten element shows. Error is ||out - ref|| / ||ref|| against the same maths in fp64 on the same inputs.
Micro-batch: `kept_log_probs_and_entropy` forward and backward of `--positions` kept positions (a packed
micro-batch of `policy.micro_batch_tokens`; every fourth position shared by two tokens, as the shared-prompt
layout's prompt ends are) with its peak device memory on CUDA; log-probs and gradients against eager.
Times are medians of `--reps` after a warm-up (compilation outside the figures, its time printed apart).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch

from train.policy.packed_logprobs import chunk_rows, kept_log_probs_and_entropy, row_kernels

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
GIB = 2**30


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_s(fn, device: torch.device, reps: int) -> float:
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def random_logits(n: int, vocab: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    z = torch.randn(n, vocab, generator=g, device=device, dtype=torch.float32).mul_(3).to(dtype)
    z[0, 1] = float("-inf")  # a masked logit: its probability, entropy term and gradient are 0
    return z


def reference(z: torch.Tensor, g_row: torch.Tensor) -> dict[str, torch.Tensor]:
    """The four kernels' outputs in fp64 from the same (rounded) inputs."""
    x = z.double()
    lse = torch.logsumexp(x, dim=-1)
    p = (x - lse[:, None]).exp()
    xl = x.clamp(min=torch.finfo(torch.float64).min)
    entropy = lse - (p * xl).sum(-1)
    g = g_row.double()[:, None]
    return {
        "lse": lse,
        "entropy": entropy,
        "logprob_grad": -p * g,
        "entropy_grad": -p * (xl - (lse - entropy)[:, None]) * g,
    }


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    if not torch.isfinite(out).all():
        return float("nan")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def kernel_rows(vocab: int, dtype: torch.dtype, device: torch.device, reps: int) -> list[dict]:
    """Each kernel on one chunk, eager and compiled: error against fp64, median time."""
    n = chunk_rows(vocab)
    rows = []
    for name, kernels in (("eager", row_kernels(False)), ("compiled", row_kernels(True))):
        z = random_logits(n, vocab, dtype, device, seed=len(rows) + 1)
        g = torch.randn(n, device=device)
        ref = reference(z, g)
        t0 = time.perf_counter()
        lse, entropy = kernels.lse_entropy(z)
        _sync(device)
        first_s = time.perf_counter() - t0
        lse_only = kernels.lse(z)
        out_lp = torch.full_like(z, float("nan"))
        kernels.logprob_grad(z, lse, g, out_lp)
        out_h = torch.full_like(z, float("nan"))
        kernels.entropy_grad(z, lse, entropy, g, out_h)
        _sync(device)
        errors = {
            "lse": rel_err(lse_only, ref["lse"]),
            "lse_entropy.lse": rel_err(lse, ref["lse"]),
            "lse_entropy.entropy": rel_err(entropy, ref["entropy"]),
            "logprob_grad": rel_err(out_lp, ref["logprob_grad"]),
            "entropy_grad": rel_err(out_h, ref["entropy_grad"]),
        }
        calls = {
            "lse": (kernels.lse, (z,)),
            "lse_entropy": (kernels.lse_entropy, (z,)),
            "logprob_grad": (kernels.logprob_grad, (z, lse, g, out_lp)),
            "entropy_grad": (kernels.entropy_grad, (z, lse, entropy, g, out_h)),
        }
        times = {key: median_s(functools.partial(fn, *a), device, reps) for key, (fn, a) in calls.items()}
        rows.append({
            "kernels": name, "dtype": str(dtype).removeprefix("torch."), "vocab": vocab, "chunk_rows": n,
            "first_call_s": first_s, "rel_err": errors, "ms": {k: v * 1e3 for k, v in times.items()},
        })  # fmt: skip
    return rows


def micro_batch(
    positions: int,
    vocab: int,
    dtype: torch.dtype,
    device: torch.device,
    reps: int,
    scales: tuple[int, ...] = (1,),
) -> list[dict]:
    """`kept_log_probs_and_entropy` forward + backward on a whole micro-batch, eager against compiled; the
    compiled kernels also at `scales` x the policy's chunk (they hold no fp32 chunk temporaries, so on a GPU a
    larger chunk costs no memory and fewer launches: what a next lease should measure)."""
    z = random_logits(positions, vocab, dtype, device, seed=7)
    gen = torch.Generator(device=device).manual_seed(8)
    index = torch.arange(positions, device=device)
    index = torch.cat([index, index[::4]])  # every fourth position predicts two tokens (shared-prompt ends)
    labels = torch.randint(0, vocab, index.shape, generator=gen, device=device)
    weights = torch.randn(index.shape, generator=gen, device=device)
    results, rows = {}, []
    chunk = chunk_rows(vocab)
    runs = [("eager", row_kernels(False), chunk), ("compiled", row_kernels(True), chunk)]
    runs += [(f"compiled x{s}", row_kernels(True), chunk * s) for s in scales if s != 1]
    for name, kernels, chunk_size in runs:
        leaf = z.detach().requires_grad_(True)

        def step(leaf=leaf, kernels=kernels, chunk_size=chunk_size):
            leaf.grad = None
            lp, entropy = kept_log_probs_and_entropy(leaf, index, labels, chunk_size, kernels=kernels)
            (lp * weights).sum().backward()
            return lp, entropy

        step()  # compilation and the allocator's first blocks outside the figures
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        lp, entropy = step()
        _sync(device)
        peak = (torch.cuda.max_memory_allocated() - base) / GIB if device.type == "cuda" else None
        results[name] = (lp.detach(), entropy, leaf.grad[::16].clone())  # every 16th row: no second full copy
        rows.append({
            "kernels": name, "chunk_rows": chunk_size, "dtype": str(dtype).removeprefix("torch."), "positions": positions,
            "tokens": int(index.numel()), "vocab": vocab, "fwd_bwd_ms": median_s(step, device, reps) * 1e3,
            "peak_above_logits_gib": peak,
        })  # fmt: skip
        leaf.grad = None
    lp_e, h_e, g_e = results["eager"]
    for row in rows[1:]:
        lp_c, h_c, g_c = results[row["kernels"]]
        row["vs_eager"] = {
            "log_probs_max_abs": (lp_c - lp_e).abs().max().item(),
            "entropy_max_abs": (h_c - h_e).abs().max().item(),
            "grad_rel": rel_err(g_c.float(), g_e.double()),
        }
    return rows


p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--vocab", default="49152,151936", help="comma list: SmolLM2's and Qwen3's")
p.add_argument("--positions", type=int, default=32768, help="kept positions of the micro-batch (0: skip)")
p.add_argument("--dtypes", default="bf16,fp32")
p.add_argument("--reps", type=int, default=10)
p.add_argument(
    "--chunk-scales", default="1", help="comma list: the compiled micro-batch also at these x the chunk"
)
p.add_argument("--out")


def main(argv: list[str] | None = None) -> dict:
    args = p.parse_args(argv)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    header = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)",
        "torch": torch.__version__,
    }  # fmt: skip
    print(json.dumps(header), flush=True)
    vocabs = [int(v) for v in args.vocab.split(",")]
    scales = tuple(int(s) for s in args.chunk_scales.split(","))
    result: dict = {"header": header, "kernels": [], "micro_batch": []}
    for dtype in (DTYPES[d] for d in args.dtypes.split(",")):
        for vocab in vocabs:
            for row in kernel_rows(vocab, dtype, device, args.reps):
                result["kernels"].append(row)
                print(json.dumps(row), flush=True)
        if args.positions:
            for row in micro_batch(args.positions, vocabs[-1], dtype, device, max(3, args.reps // 3), scales):
                result["micro_batch"].append(row)
                print(json.dumps(row), flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
    print(
        "\n| kernels | dtype | vocab | lse | lse+entropy | logprob grad | entropy grad (ms, one chunk) | worst rel err |"
    )
    for r in result["kernels"]:
        ms = r["ms"]
        print(
            f"| {r['kernels']} | {r['dtype']} | {r['vocab']} | {ms['lse']:.2f} | {ms['lse_entropy']:.2f} |"
            f" {ms['logprob_grad']:.2f} | {ms['entropy_grad']:.2f} | {max(r['rel_err'].values()):.1e} |"
        )
    for r in result["micro_batch"]:
        print(
            f"micro-batch {r['kernels']} {r['dtype']} {r['positions']}x{r['vocab']}: fwd+bwd {r['fwd_bwd_ms']:.1f} ms,"
            f" peak above logits {r['peak_above_logits_gib']} GiB {r.get('vs_eager', '')}"
        )
    return result


if __name__ == "__main__":
    main()
