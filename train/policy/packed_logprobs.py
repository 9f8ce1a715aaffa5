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

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch

CHUNK_ELEMENTS = 2**25  # fp32 temporaries of 128 MiB: 682 positions of a 49k vocabulary, 220 of 152k


def chunk_rows(vocab: int) -> int:
    """Positions per chunk so a chunk's fp32 temporaries hold about CHUNK_ELEMENTS values."""
    return max(1, CHUNK_ELEMENTS // max(vocab, 1))


def chunk_slices(n_rows: int, chunk_size: int) -> list[slice]:
    """Row ranges of at most `chunk_size` rows, except that a last range of one row joins the one before: a
    compiled kernel is specialised on a size of 1 (torch's 0/1 specialisation), so a one-row chunk would
    compile it a second time mid-update."""
    starts = list(range(0, n_rows, chunk_size))
    if len(starts) > 1 and chunk_size > 1 and n_rows - starts[-1] == 1:
        starts.pop()
    return [slice(a, b) for a, b in zip(starts, [*starts[1:], n_rows], strict=True)]


# ---- row kernels: each reads a chunk of vocabulary rows once (one fused loop under torch.compile) ------
# Eager, each holds at most two fp32 chunk temporaries (`vocab_peak_bytes` counts four) and never writes to
# the saved logits (fp32 logits are their own `.float()`: the backward kernels work on a copy). Sums over the
# vocabulary accumulate in `acc`: eager fp32 (torch's pairwise sum, within an ulp; the same bits as
# torch.logsumexp), compiled fp64 (a compiled loop sums each SIMD lane sequentially: in fp32 that left lse 12
# ulps off over 49k entries; fp64 is within one, at 2.4x the compiled loop's time, still 6x under eager's).
def _fp32_copy(chunk: torch.Tensor) -> torch.Tensor:
    return chunk.to(torch.float32, copy=True)


def _row_lse(chunk: torch.Tensor, acc: torch.dtype = torch.float32) -> torch.Tensor:
    """(n,) fp32 logsumexp of each row of an (n, V) chunk of logits (any float dtype): log sum exp(z - m) + m
    with m each row's max (exact in any dtype), torch.logsumexp's steps in place on one fp32 copy."""
    m = chunk.amax(dim=-1, keepdim=True).float()
    s = torch.sum(_fp32_copy(chunk).sub_(m).exp_(), dim=-1, dtype=acc)
    return (s.log_() + m.squeeze(-1)).float()


def _row_lse_entropy(
    chunk: torch.Tensor, acc: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logsumexp, entropy) of each row, the exponentials computed once: with e = exp(z - m), s = sum e,
    lse = log s + m (as `_row_lse`) and H = log s - sum_i e_i (z_i - m) / s; a -inf logit contributes 0
    (its z - m is clamped to the lowest finite float: 0 x -inf would be NaN)."""
    m = chunk.amax(dim=-1, keepdim=True).float()
    shifted = _fp32_copy(chunk).sub_(m)
    e = shifted.exp()
    s = torch.sum(e, dim=-1, dtype=acc)
    weighted = torch.sum(e.mul_(shifted.clamp_(min=torch.finfo(torch.float32).min)), dim=-1, dtype=acc)
    log_s = s.log()
    return (log_s + m.squeeze(-1)).float(), (log_s - weighted / s).float()


def _row_logprob_grad(chunk: torch.Tensor, lse: torch.Tensor, g_row: torch.Tensor, out: torch.Tensor) -> None:
    """out = -softmax(z) x g_row, fp32 maths rounded once into `out` (the logits' dtype): d loss / d z of
    each row's logsumexp (the label entries get their + g in fp32 afterwards, `_KeptLogProb.backward`)."""
    out.copy_(_fp32_copy(chunk).sub_(lse[:, None]).exp_().mul_(g_row[:, None].neg()))


def _row_entropy_grad(
    chunk: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor, g_row: torch.Tensor, out: torch.Tensor
) -> None:
    """out = dH/dz x g = -p_i (z_i - sum_j p_j z_j) g = -p_i (z_i - lse + H) g, 0 at a -inf logit (p = 0
    there; its centred logit clamped finite), rounded once into `out`."""
    z = _fp32_copy(chunk)
    centred = (z - (lse - entropy)[:, None]).clamp_(min=torch.finfo(torch.float32).min)
    out.copy_(z.sub_(lse[:, None]).exp_().mul_(centred).mul_(g_row[:, None].neg()))


class RowKernels(NamedTuple):
    """The vocabulary-wide maths of this module, eager or compiled (`row_kernels`)."""

    lse: Callable
    lse_entropy: Callable
    logprob_grad: Callable
    entropy_grad: Callable


EAGER = RowKernels(_row_lse, _row_lse_entropy, _row_logprob_grad, _row_entropy_grad)


def _row_lse_fp64(chunk: torch.Tensor) -> torch.Tensor:
    """`_row_lse` summing in fp64: the compiled variant. Its own function, not a functools.partial: dynamo keys
    every compiled partial on one shared wrapper, so two partials count as recompiles of one function."""
    return _row_lse(chunk, torch.float64)


def _row_lse_entropy_fp64(chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_row_lse_entropy` summing in fp64: the compiled variant (see `_row_lse_fp64`)."""
    return _row_lse_entropy(chunk, torch.float64)


@functools.cache
def _compiled() -> RowKernels:
    kernels = (_row_lse_fp64, _row_lse_entropy_fp64, _row_logprob_grad, _row_entropy_grad)
    return RowKernels(*(torch.compile(f, dynamic=True) for f in kernels))


def row_kernels(compiled: bool) -> RowKernels:
    """The row kernels, each under `torch.compile` when `compiled` (verl's `actor.use_torch_compile` does the
    same to its entropy): eager, every step of the maths is its own pass over an fp32 copy of the chunk
    (upcast, shift, exp, product, sum); compiled, one loop reads the bf16 logits and writes the result. Measured
    on a 682 x 49152 bf16 chunk, 2 CPU threads: logsumexp + entropy 189 ms (the eager code before) -> 27 ms,
    log-prob backward 84 -> 8 ms. Under a TorchDispatchMode (the memory tracker, memory.py) torch runs the
    compiled ones' Python eagerly: what the tracker measures is then an upper bound of the compiled loops'."""
    return _compiled() if compiled else EAGER


@torch.no_grad()
def warm_up(kernels: RowKernels, vocab: int, dtype: torch.dtype, device: torch.device) -> None:
    """Run each kernel once on a small chunk, so compilation (and a missing compiler) happens at start-up,
    before any rollout, not inside the first update. Under no_grad, as every real call runs (the log-prob pass,
    and autograd Functions' forward and backward): grad mode is part of what a compiled graph is guarded on, so
    a warm-up with grad on compiled each kernel a second time in the first update (seen on an H100 with
    TORCH_LOGS=recompiles; tests/test_memory_bound.py runs a whole update with recompiles made errors)."""
    chunk = torch.randn(3, vocab, device=device).to(dtype)
    lse, entropy = kernels.lse_entropy(chunk)
    kernels.lse(chunk)
    g = torch.ones(3, device=device)
    kernels.logprob_grad(chunk, lse, g, torch.empty_like(chunk))
    kernels.entropy_grad(chunk, lse, entropy, g, torch.empty_like(chunk))


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
        kernels: RowKernels,
    ):
        flat = logits.detach()  # the kernels' inputs never require grad (a compiled graph is guarded on it)
        chunks = [flat[sl] for sl in chunk_slices(flat.shape[0], chunk_size)]
        if with_entropy:
            pairs = [kernels.lse_entropy(c) for c in chunks]
            lse = torch.cat([lse for lse, _ in pairs])
            entropy = torch.cat([h for _, h in pairs])
        else:
            lse = torch.cat([kernels.lse(c) for c in chunks])
            entropy = lse.new_empty(0)
        ctx.mark_non_differentiable(entropy)
        picked = logits[index, labels].float()
        ctx.save_for_backward(logits, index, labels, lse)
        ctx.chunk_size, ctx.kernels = chunk_size, kernels
        return picked - lse[index], entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor, _grad_entropy: torch.Tensor):
        logits, index, labels, lse = (t.detach() for t in ctx.saved_tensors)
        g = grad_out.float()
        g_position = torch.zeros(logits.shape[0], dtype=torch.float32, device=logits.device)
        g_position.index_add_(0, index, g)  # d loss / d lse of each position: its tokens' grads summed
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for sl in chunk_slices(logits.shape[0], ctx.chunk_size):
            ctx.kernels.logprob_grad(logits[sl], lse[sl], g_position[sl], grad[sl])
        # the label entries: -p g_position + (their tokens' g) summed in fp32 and rounded once (a bf16 -p g plus
        # g would lose 1 - p where p is near 1); several tokens may share a (position, label)
        vocab = logits.shape[1]
        entries, token_entry = torch.unique(index * vocab + labels, return_inverse=True)
        g_entry = torch.zeros(entries.shape[0], dtype=torch.float32, device=g.device).index_add_(
            0, token_entry, g
        )
        rows, cols = entries // vocab, entries % vocab
        p = (logits[rows, cols].float() - lse[rows]).exp()
        grad[rows, cols] = (g_entry - p * g_position[rows]).to(grad.dtype)
        return grad, None, None, None, None, None


def kept_log_probs(
    logits: torch.Tensor,
    index: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int | None = None,
    kernels: RowKernels = EAGER,
) -> torch.Tensor:
    """(b, R) fp32 log p(labels) from the kept positions' logits.

    logits: (U, K, V) (any float dtype; the maths is fp32); index: (b, R) long, flat positions into
    U x K; labels: (b, R) long. Padded tokens need a valid index and label (their value is masked later).
    `kernels`: `row_kernels(compiled)`, the policy's (`policy.torch_compile`).
    """
    return _kept(logits, index, labels, chunk_size, False, kernels)[0]


def kept_log_probs_and_entropy(
    logits: torch.Tensor,
    index: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int | None = None,
    kernels: RowKernels = EAGER,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`kept_log_probs` and the entropy metric (`kept_entropy` without grad) from one pass over the logits:
    each chunk is upcast and normalised once for both (the update reports the entropy every step)."""
    return _kept(logits, index, labels, chunk_size, True, kernels)


def _kept(
    logits, index, labels, chunk_size: int | None, with_entropy: bool, kernels: RowKernels
) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, R) log-probs and, with `with_entropy`, (b, R) entropy (else an empty tensor): the one call site of
    `_KeptLogProb` behind both public functions."""
    if index.shape != labels.shape:
        raise ValueError(f"index {tuple(index.shape)} and labels {tuple(labels.shape)} do not match")
    flat = logits.reshape(-1, logits.shape[-1])
    chunk = chunk_size or chunk_rows(flat.shape[-1])
    out, entropy = _KeptLogProb.apply(
        flat, index.reshape(-1), labels.reshape(-1).long(), chunk, with_entropy, kernels
    )
    return out.reshape(index.shape), entropy[index] if with_entropy else entropy


def _entropy_rows(
    flat: torch.Tensor, chunk_size: int, kernels: RowKernels
) -> tuple[torch.Tensor, torch.Tensor]:
    """(entropy, logsumexp) per position, a chunk at a time."""
    pairs = [kernels.lse_entropy(flat[sl]) for sl in chunk_slices(flat.shape[0], chunk_size)]
    return torch.cat([h for _, h in pairs]), torch.cat([lse for lse, _ in pairs])


class _ChunkedEntropy(torch.autograd.Function):
    """Entropy per position from (N, V) logits, fp32 a chunk at a time in the forward and the backward.

    The backward recomputes p per chunk from the saved logits and the fp32 (lse, H) (`_row_entropy_grad`), so
    no (N, V) fp32 tensor is kept for it."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, chunk_size: int, kernels: RowKernels) -> torch.Tensor:
        entropy, lse = _entropy_rows(logits.detach(), chunk_size, kernels)
        ctx.save_for_backward(logits, lse, entropy)
        ctx.chunk_size, ctx.kernels = chunk_size, kernels
        return entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        # detached: the kernels' inputs never require grad (a compiled graph is guarded on it)
        logits, lse, entropy = (t.detach() for t in ctx.saved_tensors)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for sl in chunk_slices(logits.shape[0], ctx.chunk_size):
            ctx.kernels.entropy_grad(logits[sl], lse[sl], entropy[sl], grad_out[sl].float(), grad[sl])
        return grad, None, None


def kept_entropy(
    logits: torch.Tensor,
    index: torch.Tensor,
    with_grad: bool,
    chunk_size: int | None = None,
    kernels: RowKernels = EAGER,
) -> torch.Tensor:
    """(b, R) fp32 entropy of the kept positions' distributions, read per token through `index`.

    A chunk of positions is upcast at a time, with grad (entropy in the loss: the backward recomputes
    the softmax per chunk) or without (the entropy metric); never a (b, R, V) copy of the padded rows.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    chunk = chunk_size or chunk_rows(flat.shape[-1])
    if with_grad:
        per_position = _ChunkedEntropy.apply(flat, chunk, kernels)
    else:
        with torch.no_grad():
            per_position = _entropy_rows(flat.detach(), chunk, kernels)[0]
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
    chunk = (chunk_rows(vocab) + 1) * vocab * 4  # + 1: a one-row tail joins the last chunk (chunk_slices)
    copies = 1 + (1 + entropy_grad if backward else 0)
    return copies * logits + 4 * chunk
