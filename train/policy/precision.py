"""`policy.precision=auto|fp32|bf16`: which compute dtype the policy (and the rollout engine) use.

`bf16` means mixed precision: fp32 master weights, gradients reduced in fp32 and an fp32 optimizer,
with the forward and backward matmuls in bf16 (FSDP2 `MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)`). It pays only where bf16 matrix products are faster: on GPUs (tensor cores) and on
CPUs with AVX512-BF16/AMX; on AVX2-only CPUs torch's bf16 matmul is a slow fallback (measured 100x slower
than fp32 on this project's first CI machine). `auto` therefore measures both rates for a fraction of a
second at start and takes bf16 only when it multiplies at least `BF16_MIN_SPEEDUP` times faster. Every
rank measures; the ranks agree on the summed rates, so all shard the model the same way.

On a CPU the probe also times oneDNN's fp32 product, which `policy.fp32_matmul=auto` takes over torch's
default (MKL) where it is faster (train/policy/cpu_matmul.py); the fp32 rate `auto` weighs against bf16 is
then oneDNN's.

The best rates ever measured on a machine are kept in `$RLPOST_CACHE/precision/<machine key>.json` (CPU
model or GPU name, thread count, torch version), and each start decides from the best of those and its
own: a measurement taken while another process loads the CPUs neither flips the choice nor gets logged
as the machine's rate. Delete the file to start afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

PRECISIONS = ("auto", "fp32", "bf16")
ENGINE_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # the rollout engine computes in the policy's dtype
BF16_MIN_SPEEDUP = 1.2  # below this the bf16 rounding is not worth it


@dataclass(frozen=True)
class PrecisionChoice:
    precision: str  # fp32 | bf16
    requested: str  # auto | fp32 | bf16
    device: str  # cpu | cuda
    fp32_flops: float | None  # measured rate of the fp32 kernel in use (None when not measured)
    bf16_flops: float | None
    fp32_kernel: str = "torch"  # CPU fp32 products: torch (its BLAS, MKL on x86) | onednn
    fp32_torch_flops: float | None = None  # torch.mm's fp32 rate, when oneDNN's was measured beside it

    @property
    def engine_dtype(self) -> str:
        return ENGINE_DTYPES[self.precision]

    @property
    def onednn_linears(self) -> bool:
        """Whether the policy's linear layers run in oneDNN (an fp32 CPU policy where it measured faster)."""
        return self.precision == "fp32" and self.device == "cpu" and self.fp32_kernel == "onednn"

    def describe(self) -> str:
        rates = ""
        if self.fp32_flops and self.bf16_flops:
            kernel = ""
            if self.device == "cpu" and self.fp32_torch_flops:
                kernel = f" in {self.fp32_kernel} (torch.mm {self.fp32_torch_flops / 1e9:.0f})"
            rates = (
                f" (matmul on {self.device}: fp32 {self.fp32_flops / 1e9:.0f} GFLOP/s{kernel}, "
                f"bf16 {self.bf16_flops / 1e9:.0f} GFLOP/s, {self.bf16_flops / self.fp32_flops:.2f}x)"
            )
        elif self.device == "cpu" and self.precision == "fp32":
            rates = f" (fp32 products in {self.fp32_kernel})"
        return f"policy.precision={self.requested} -> {self.precision}{rates}"

    def as_params(self) -> dict[str, object]:
        """What a tracker logs once per run."""
        out: dict[str, object] = {"policy.precision_resolved": self.precision}
        if self.device == "cpu" and self.precision == "fp32":
            out["policy.fp32_matmul_resolved"] = self.fp32_kernel
        if self.fp32_flops and self.bf16_flops:
            out["perf.matmul_fp32_gflops"] = round(self.fp32_flops / 1e9, 1)
            out["perf.matmul_bf16_gflops"] = round(self.bf16_flops / 1e9, 1)
        if self.fp32_torch_flops:
            out["perf.matmul_fp32_torch_gflops"] = round(self.fp32_torch_flops / 1e9, 1)
        return out


def choose(fp32_flops: float, bf16_flops: float, min_speedup: float = BF16_MIN_SPEEDUP) -> str:
    """bf16 when it multiplies at least `min_speedup` times faster than fp32, else fp32."""
    return "bf16" if bf16_flops >= min_speedup * fp32_flops else "fp32"


def matmul_flops_per_s(
    dtype: torch.dtype, device: torch.device, size: int, min_time_s: float, product=torch.mm
) -> float:
    """Sustained square-matmul rate (FLOP/s) of `product` (torch.mm, or another kernel's a x b) on `device`."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    return product_flops_per_s(product, a, b, 2.0 * size**3, min_time_s)


def product_flops_per_s(product, a: torch.Tensor, b: torch.Tensor, flops: float, min_time_s: float) -> float:
    """Sustained rate (FLOP/s) of `product(a, b)`, a product of `flops` FLOPs: repeated until at least
    min_time_s has passed, after one warm-up call (kernel selection, lazy init); GPU work is synchronised."""
    device = a.device

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    product(a, b)
    sync()
    reps, t0 = 0, time.perf_counter()
    while True:
        product(a, b)
        reps += 1
        if reps % 4 == 0 or device.type != "cuda":
            sync()
            elapsed = time.perf_counter() - t0
            if elapsed >= min_time_s:
                return flops * reps / elapsed


def onednn_flops_per_s(size: int, min_time_s: float) -> float:
    """oneDNN's sustained fp32 rate for the same square product (cpu_matmul.py's kernel), 0.0 without oneDNN."""
    from train.policy.cpu_matmul import mm_t, onednn_available

    if not onednn_available():
        return 0.0
    return matmul_flops_per_s(torch.float32, torch.device("cpu"), size, min_time_s, product=mm_t)


ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def machine_key(device_type: str) -> str:
    """What the two rates depend on: the processor (or GPU), the thread count, the instruction sets the
    kernels may use (ISA_CAPS) and torch's version."""
    if device_type == "cuda":
        what = torch.cuda.get_device_name()
    else:
        what = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    what = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        what += f"-{torch.get_num_threads()}threads"
        # kernels capped below what the processor has (e.g. an AVX2 machine reproduced on an AVX-512 one)
        what += "".join(f"-{k}={os.environ[k]}" for k in ISA_CAPS if os.environ.get(k))
    digest = hashlib.sha1(f"{what}|{torch.__version__}".encode()).hexdigest()[:12]
    return f"{device_type}-{digest}"


def _cache_file(device_type: str) -> Path:
    from infra.models import cache_dir

    return cache_dir() / "precision" / f"{machine_key(device_type)}.json"


@cache
def _measure(device_type: str) -> tuple[float, float, float]:
    """(fp32 torch.mm, bf16, fp32 oneDNN) FLOP/s of this machine: the best ever seen here (oneDNN 0.0 on a GPU).
    Every start measures (the best of 5 alternating trials each, so a load spike hits all; ~0.9 s on a CPU) and
    keeps the per-rate maximum of this and every earlier measurement on disk: load only ever lowers a rate, so
    the kept figures rise to the idle machine's and every run on the machine decides from (nearly) the same
    rates."""
    keys = ("fp32_flops", "bf16_flops", "fp32_onednn_flops")
    path = _cache_file(device_type)
    try:
        kept_file = json.loads(path.read_text())
        kept = tuple(float(kept_file.get(k, 0.0)) for k in keys)
    except (OSError, ValueError, AttributeError):
        kept = (0.0, 0.0, 0.0)
    device = torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else None
    device = device or torch.device("cpu")
    size, seconds = (4096, 0.05) if device.type == "cuda" else (512, 0.06)
    fp32 = bf16 = onednn = 0.0
    for _trial in range(5):
        fp32 = max(fp32, matmul_flops_per_s(torch.float32, device, size, seconds))
        bf16 = max(bf16, matmul_flops_per_s(torch.bfloat16, device, size, seconds))
        if device.type == "cpu":
            onednn = max(onednn, onednn_flops_per_s(size, seconds))
    best = tuple(max(m, k) for m, k in zip((fp32, bf16, onednn), kept))
    if best != kept:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps({**dict(zip(keys, best)), "measured": time.time()}))
            os.replace(tmp, path)
        except OSError:  # a read-only cache: this run's own measurement still counts
            pass
    return best


def resolve_precision(requested: str, device: torch.device, fp32_matmul: str = "auto") -> PrecisionChoice:
    """The precision to train in, and on a CPU which kernel multiplies fp32 matrices (`policy.fp32_matmul`).
    Collective when torch.distributed is initialised and anything is measured."""
    from train.policy.cpu_matmul import pick_kernel

    if requested not in PRECISIONS:
        raise ValueError(f"policy.precision={requested!r}: expected one of {', '.join(PRECISIONS)}")
    unmeasured = pick_kernel(fp32_matmul, 0.0, 0.0)  # a bad value fails here; auto without rates: torch
    on_cpu = device.type == "cpu"
    measure = requested == "auto" or (on_cpu and requested == "fp32" and fp32_matmul == "auto")
    if not measure:
        return PrecisionChoice(
            requested, requested, device.type, None, None, unmeasured if on_cpu else "torch"
        )
    from train.policy.distributed import all_reduce_sum

    # one decision for all ranks: every rank measures and they agree on the summed rates
    fp32, bf16, onednn = (all_reduce_sum(r) for r in _measure(device.type))
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    kernel = pick_kernel(fp32_matmul, fp32, onednn) if on_cpu else "torch"
    fp32_used = onednn if kernel == "onednn" else fp32
    precision = choose(fp32_used, bf16) if requested == "auto" else requested
    torch_rate = fp32 / world if on_cpu and onednn > 0 else None
    return PrecisionChoice(
        precision, requested, device.type, fp32_used / world, bf16 / world, kernel, torch_rate
    )
