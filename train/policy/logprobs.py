"""Log-probs and entropies of the sampled tokens from a model's logits, memory-bounded: what the
policy's forward (train/policy/fsdp.py) computes for the losses.

Shapes: logits (B, T, V), labels (B, T). Chunked over rows so a (B, T, V) float32 copy is never made.
"""

from __future__ import annotations

import torch

__all__ = [
    "entropy_from_logits",
    "entropy_from_logits_chunked",
    "logprobs_from_logits",
]


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: logsumexp(z) - sum softmax(z) * z, computed in fp32.

    logits: (..., V) -> (...,) float32 (B, T, V -> B, T). Stable for large logits (no log of a
    probability that underflowed) and for -inf logits (masked vocabulary entries). Upcasts the whole tensor; see ``entropy_from_logits_chunked``.
    """
    z = logits.float()
    z = z - z.amax(dim=-1, keepdim=True).detach()  # shift-invariant; keeps fp32 precision for big logits
    finite_z = torch.where(torch.isneginf(z), torch.zeros_like(z), z)  # p = 0 there; avoids 0 * -inf = NaN
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * finite_z).sum(dim=-1)


def entropy_from_logits_chunked(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Same as ``entropy_from_logits`` but upcasts ``chunk_size`` positions at a time.

    logits: (..., V) -> (...,) float32. Peak extra memory is chunk_size * V floats instead of a full fp32
    copy; meant for the entropy metric under ``torch.no_grad()`` (with grad, each chunk is kept for backward).
    """
    flat = _rows(logits)
    if flat.shape[0] == 0:
        return torch.zeros(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    out = torch.cat([entropy_from_logits(c) for c in flat.split(chunk_size, dim=0)])
    return out.reshape(logits.shape[:-1])


class _ChunkedLogProb(torch.autograd.Function):
    """log_softmax(logits)[label] with fp32 maths per chunk, keeping only the logits for backward.

    Backward recomputes softmax chunk by chunk from the saved (low precision) logits and the fp32
    logsumexp, so no (N, V) fp32 tensor outlives a chunk.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_size: int) -> torch.Tensor:
        lse = torch.cat([torch.logsumexp(c.float(), dim=-1) for c in logits.split(chunk_size, dim=0)])
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_size = chunk_size
        return picked - lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        n = ctx.chunk_size
        for start in range(0, logits.shape[0], n):
            sl = slice(start, start + n)
            g = grad_out[sl].float().unsqueeze(-1)
            chunk = -torch.exp(logits[sl].float() - lse[sl].unsqueeze(-1)) * g
            chunk.scatter_add_(-1, labels[sl].unsqueeze(-1), g)
            grad[sl] = chunk.to(grad.dtype)
        return grad, None, None


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """log p(label) under softmax(logits), per position.

    logits: (..., V) e.g. (B, T, V); labels: (...) long e.g. (B, T) -> (...) float32 (float64 for
    float64 logits). fp32/fp64: ``gather - logsumexp`` (backward keeps no (B, T, V) output tensor, unlike
    log_softmax). bf16/fp16: fp32 maths ``chunk_size`` positions at a time, never materialising a full
    fp32 copy of the logits, in forward or backward (precision matters: ratios exp(logp - old_logp)).
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not match")
    labels = labels.long()
    if logits.dtype in (torch.float32, torch.float64):
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    out = _ChunkedLogProb.apply(_rows(logits), labels.reshape(-1), chunk_size)
    return out.reshape(labels.shape)
