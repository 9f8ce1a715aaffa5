"""Per-token log-probs and entropy of the response tokens, computed on the positions the model kept.

The LM head runs on a micro-batch's kept positions only: (U, K, V) logits, at most `micro_batch_tokens`
x V whatever the layout (plain rows, shared-prompt units, one packed row). The loss wants (b, R) tensors
(rows x longest response); copying the logits into that shape first would cost b x R x V, which grows
with the longest row, not with the token budget (16 rows, one of them 8192 tokens long: 131k positions x
the vocabulary, twice with the gradient). So, as verl does on its padding-free tokens, everything with a
vocabulary axis stays on the kept positions, and only per-token results are padded to (b, R) through an
index: `index[k, t]` is the flat kept position (unit x K + column) whose logits predict row k's token t.

Several tokens may share a position (in the shared-prompt layout every response of a unit is predicted
from the prompt's last position): the label logit is gathered per token and the normaliser (logsumexp)
per position, so each position's vocabulary row is read once in the forward and written once in the
backward. The fp32 maths runs a chunk of positions at a time (`chunk_rows`: about CHUNK_ELEMENTS logits,
whatever the vocabulary), so no fp32 copy of bf16 logits exists whole and each fp32 temporary is at most
CHUNK_ELEMENTS x 4 bytes; the backward allocates one gradient of the logits' own size and dtype.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 2**25  # fp32 temporaries of 128 MiB: 682 positions of a 49k vocabulary, 220 of 152k


def chunk_rows(vocab: int) -> int:
    """Positions per chunk so a chunk's fp32 temporaries hold about CHUNK_ELEMENTS values."""
    return max(1, CHUNK_ELEMENTS // max(vocab, 1))


def _lse_and_entropy(chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logsumexp, entropy) of each position of one chunk from one fp32 upcast: H = lse - sum_i p_i z_i with
    p = exp(z - lse), the softmax computed once (the separate entropy pass upcasts, shifts and
    exponentiates again). Rows with -inf logits (0 x -inf) take the masked path of `_entropy_chunks`."""
    z = chunk.float()
    lse = torch.logsumexp(z, dim=-1)  # the same call as the log-probs alone: their values do not change
    p = (z - lse[:, None]).exp_()  # the second fp32 chunk temporary (vocab_peak_bytes counts four)
    entropy = lse - torch.linalg.vecdot(p, z)
    bad = torch.isnan(entropy)
    if bad.any():
        entropy[bad] = _entropy_chunks(chunk[bad], chunk.shape[0])[0]
    return lse, entropy


class _KeptLogProb(torch.autograd.Function):
    """log_softmax(logits[index])[label] per token, from (N, V) logits and (M,) token indices/labels; with
    `with_entropy`, also each position's entropy (not differentiated) from the same pass over the logits."""

    @staticmethod
    def forward(
        ctx,
        logits: torch.Tensor,
        index: torch.Tensor,
        labels: torch.Tensor,
        chunk_size: int,
        with_entropy: bool,
    ):
        if with_entropy:
            pairs = [_lse_and_entropy(c) for c in logits.split(chunk_size, dim=0)]
            lse = torch.cat([lse for lse, _ in pairs])
            entropy = torch.cat([h for _, h in pairs])
        else:
            lse = torch.cat([torch.logsumexp(c.float(), dim=-1) for c in logits.split(chunk_size, dim=0)])
            entropy = lse.new_empty(0)
        ctx.mark_non_differentiable(entropy)
        picked = logits[index, labels].float()
        ctx.save_for_backward(logits, index, labels, lse)
        ctx.chunk_size = chunk_size
        return picked - lse[index], entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor, _grad_entropy: torch.Tensor):
        logits, index, labels, lse = ctx.saved_tensors
        g = grad_out.float()
        g_position = torch.zeros(logits.shape[0], dtype=torch.float32, device=logits.device)
        g_position.index_add_(0, index, g)  # d loss / d lse of each position: its tokens' grads summed
        grad = torch.empty_like(logits)
        n = ctx.chunk_size
        for start in range(0, logits.shape[0], n):
            end = min(start + n, logits.shape[0])
            # -softmax * g, in place on one fp32 copy (a copy even of fp32 logits: they are saved); the same
            # values as -exp(z - lse) * g, with one chunk temporary instead of five
            chunk = logits[start:end].to(torch.float32, copy=True).sub_(lse[start:end, None]).exp_()
            chunk.mul_(g_position[start:end, None].neg())
            here = (index >= start) & (index < end)  # the tokens whose label logit lies in this chunk
            chunk.index_put_((index[here] - start, labels[here]), g[here], accumulate=True)
            grad[start:end].copy_(chunk)  # one rounding for bf16 logits, cast in the copy (no bf16 temporary)
        return grad, None, None, None, None


def kept_log_probs(
    logits: torch.Tensor, index: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None
) -> torch.Tensor:
    """(b, R) fp32 log p(labels) from the kept positions' logits.

    logits: (U, K, V) (any float dtype; the maths is fp32); index: (b, R) long, flat positions into
    U x K; labels: (b, R) long. Padded tokens need a valid index and label (their value is masked later).
    """
    return _kept(logits, index, labels, chunk_size, with_entropy=False)[0]


def kept_log_probs_and_entropy(
    logits: torch.Tensor, index: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`kept_log_probs` and the entropy metric (`kept_entropy` without grad) from one pass over the logits:
    each chunk is upcast and normalised once for both (the update reports the entropy every step)."""
    return _kept(logits, index, labels, chunk_size, with_entropy=True)


def _kept(
    logits, index, labels, chunk_size: int | None, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, R) log-probs and, with `with_entropy`, (b, R) entropy (else an empty tensor): the one call site of
    `_KeptLogProb` behind both public functions."""
    if index.shape != labels.shape:
        raise ValueError(f"index {tuple(index.shape)} and labels {tuple(labels.shape)} do not match")
    flat = logits.reshape(-1, logits.shape[-1])
    chunk = chunk_size or chunk_rows(flat.shape[-1])
    out, entropy = _KeptLogProb.apply(flat, index.reshape(-1), labels.reshape(-1).long(), chunk, with_entropy)
    return out.reshape(index.shape), entropy[index] if with_entropy else entropy


def _entropy_chunks(flat: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(entropy, logsumexp) per position, as `entropy_from_logits`, a chunk at a time."""
    entropy = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    lse = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    for start in range(0, flat.shape[0], chunk_size):
        c = flat[start : start + chunk_size]
        shift = c.amax(dim=-1, keepdim=True).float()
        z = c.float() - shift  # shift-invariant, as entropy_from_logits
        p = torch.softmax(z, dim=-1)
        lse_z = torch.logsumexp(z, dim=-1)
        z.masked_fill_(torch.isneginf(z), 0.0)  # p = 0 there: avoid 0 * -inf
        entropy[start : start + chunk_size] = lse_z - torch.linalg.vecdot(p, z)
        lse[start : start + chunk_size] = lse_z + shift.squeeze(-1)
    return entropy, lse


class _ChunkedEntropy(torch.autograd.Function):
    """Entropy per position from (N, V) logits, fp32 a chunk at a time in the forward and the backward.

    dH/dz_i = -p_i (z_i - sum_j p_j z_j) = -p_i (z_i - lse + H): the backward recomputes p per chunk from
    the saved logits and the fp32 (lse, H), so no (N, V) fp32 tensor is kept for it."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, chunk_size: int) -> torch.Tensor:
        entropy, lse = _entropy_chunks(logits, chunk_size)
        ctx.save_for_backward(logits, lse, entropy)
        ctx.chunk_size = chunk_size
        return entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits, lse, entropy = ctx.saved_tensors
        grad = torch.empty_like(logits)
        n = ctx.chunk_size
        for start in range(0, logits.shape[0], n):
            sl = slice(start, start + n)
            z = logits[sl].float()  # fp32 logits: a view of the saved tensor, so nothing in place on it
            p = torch.exp(z - lse[sl, None])
            centred = (z - (lse[sl] - entropy[sl])[:, None]).masked_fill_(p == 0, 0.0)  # z - sum p z
            grad[sl] = p.mul_(centred).mul_(-grad_out[sl, None].float()).to(grad.dtype)
        return grad, None


def kept_entropy(
    logits: torch.Tensor, index: torch.Tensor, with_grad: bool, chunk_size: int | None = None
) -> torch.Tensor:
    """(b, R) fp32 entropy of the kept positions' distributions, read per token through `index`.

    A chunk of positions is upcast at a time, with grad (entropy in the loss: the backward recomputes
    the softmax per chunk) or without (the entropy metric); never a (b, R, V) copy of the padded rows.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    chunk = chunk_size or chunk_rows(flat.shape[-1])
    if with_grad:
        per_position = _ChunkedEntropy.apply(flat, chunk)
    else:
        with torch.no_grad():
            per_position = _entropy_chunks(flat.detach(), chunk)[0]
    return per_position[index]


def vocab_peak_bytes(
    kept_positions: int, vocab: int, logit_bytes: int, backward: bool, entropy_grad: bool = False
) -> int:
    """The peak bytes of one micro-batch's vocabulary-sized tensors under this module.

    The logits of the kept positions (`logit_bytes` each: 2 under bf16, 4 under fp32), their gradient of
    the same size and dtype in a backward (one more with the entropy in the loss: its gradient and the
    log-probs' meet in autograd's sum), and at most four fp32 chunk temporaries (the forward's upcast and
    logsumexp, the entropy's shifted logits, softmax and logsumexp, the backward's softmax and product).
    `kept_positions` is at most the micro-batch's token budget, or one sequence longer than the budget; it
    never depends on how the rows' lengths are spread. For the planner and the tests.
    """
    logits = kept_positions * vocab * logit_bytes
    chunk = chunk_rows(vocab) * vocab * 4
    copies = 1 + (1 + entropy_grad if backward else 0)
    return copies * logits + 4 * chunk
