"""fp32 matrix products of a CPU policy through oneDNN, when they measure faster there than in torch's default.

torch's CPU build sends fp32 `mm`/`linear` to its BLAS (MKL on x86) and bf16 ones to oneDNN. MKL picks its
kernels by CPU vendor and leaves its AVX-512 code unused on AMD processors: on this project's 2-core Zen 5
machines fp32 linear layers ran at 210-225 GFLOP/s in MKL against 470-500 in oneDNN for the same IEEE fp32
products (bundled in torch and dispatched by CPU features; vLLM's CPU backend runs every linear there).
`policy.fp32_matmul=auto` takes oneDNN where the start-up probe (train/policy/precision.py) measured it at
least `MIN_SPEEDUP` times faster; every `nn.Linear` of the fp32 policy then runs its forward and both backward
products (input and weight gradients) in oneDNN. Under bf16, on a GPU, or with `torch`, nothing changes.

oneDNN runs these in strict fp32 (torch's `mkldnn.matmul.fp32_precision` is `ieee` unless a user sets
otherwise): no bf16 or TF32 rounding; only the summation order differs from MKL's (relative differences
around 1e-7 per product, tests/test_cpu_matmul.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

FP32_MATMUL = ("auto", "onednn", "torch")
MIN_SPEEDUP = 1.2  # below this the choice would follow noise


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's linear kernel (every x86/ARM CPU wheel of torch has)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def mm_t(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b.T (+ bias) in oneDNN; strided views are read in place (no transposed copies)."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    """y = x W^T + b with all three products (forward, dx = g W, dW = g^T x) in oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return mm_t(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = mm_t(g2, weight.t()).view(*grad.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            dw = mm_t(g2.t(), x2.t())
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g2.sum(0)
        return dx, dw, db


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` through oneDNN for fp32 CPU tensors; anything else (or an empty batch) takes F.linear."""
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu" or x.numel() == 0:
        return torch.nn.functional.linear(x, weight, bias)
    return _OneDNNLinear.apply(x, weight, bias)


class OneDNNLinear(torch.nn.Linear):
    """An `nn.Linear` whose products run in oneDNN (same parameters and state-dict keys)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_linear(x, self.weight, self.bias)


def route_linears(model: torch.nn.Module) -> int:
    """Turn every plain `nn.Linear` of `model` into a `OneDNNLinear` in place; returns how many."""
    n = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = OneDNNLinear
            n += 1
    return n


def pick_kernel(requested: str, torch_flops: float, onednn_flops: float) -> str:
    """`onednn` or `torch` for a CPU policy's fp32 products (`requested`: policy.fp32_matmul)."""
    if requested not in FP32_MATMUL:
        raise ValueError(f"policy.fp32_matmul={requested!r}: expected one of {', '.join(FP32_MATMUL)}")
    if requested == "onednn" and not onednn_available():
        raise ValueError(
            "policy.fp32_matmul=onednn: this torch build has no oneDNN (torch.backends.mkldnn); use torch or auto"
        )
    if requested == "auto":
        faster = onednn_flops > 0 and onednn_flops >= MIN_SPEEDUP * torch_flops  # unmeasured: torch
        return "onednn" if onednn_available() and faster else "torch"
    return requested
