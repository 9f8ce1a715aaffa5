"""Loss aggregation (verl ``agg_loss``) and masked means: how a per-token loss (B, T) becomes a scalar.

Pure tensor functions. Shapes: B sequences, T padded response length; ``response_mask`` is 1 on valid
response tokens.

Micro-batching contract (gradient accumulation). Every loss that averages over tokens or sequences takes
optional *global* normalisers. Compute them once on the whole mini-batch with :func:`global_normalisers`,
pass them (``**norms``) to every micro-batch call, and call ``backward()`` on each micro-batch loss as is
(do NOT divide by the number of micro-batches): the sum of the micro-batch losses is then exactly the
mini-batch loss, so the accumulated gradient equals the one-big-batch gradient for every
``loss_agg_mode``, whatever the split (token-budget micro-batches included). Without them each call
normalises by its own inputs (right for a single batch).
"""

from __future__ import annotations

import torch

__all__ = [
    "LOSS_AGG_MODES",
    "Number",
    "agg_loss",
    "global_normalisers",
    "masked_mean",
    "masked_normalize",
]

Number = int | float | torch.Tensor


LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1, over all elements or along ``dim`` (CS336's
    ``masked_mean``). An empty mask (a fully masked row along ``dim``) gives 0, where the course's
    definition gives NaN (0/0): 0 keeps a padding row from poisoning a loss. Any shape."""
    keep = mask.bool()
    masked = torch.where(keep, values, torch.zeros_like(values))
    if dim is None:
        return masked.sum() / keep.sum().clamp(min=1)
    return masked.sum(dim=dim) / keep.sum(dim=dim).clamp(min=1)


def masked_normalize(
    values: torch.Tensor, mask: torch.Tensor, normalize_constant: float = 1.0, dim: int | None = None
) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1, over all elements or along ``dim``, divided by
    ``normalize_constant`` (CS336's ``masked_normalize``; a fully masked row gives 0)."""
    keep = mask.bool()
    masked = torch.where(keep, values, torch.zeros_like(values))
    return (masked.sum() if dim is None else masked.sum(dim=dim)) / normalize_constant


def _check_mode(loss_agg_mode: str) -> None:
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {list(LOSS_AGG_MODES)}")


def global_normalisers(
    response_mask: torch.Tensor, loss_scale_factor: Number | None = None
) -> dict[str, Number]:
    """Denominators of the whole mini-batch, to pass to every micro-batch's loss call.

    response_mask: (B, T) of the full mini-batch (before splitting). Returns
    ``global_token_count`` (valid tokens), ``global_seq_count`` (sequences with >= 1 valid token) and
    ``loss_scale_factor`` (the given one, else the mini-batch's padded length T: pass it explicitly, e.g.
    the configured max response length, if micro-batches are re-padded to their own lengths).
    """
    mask = response_mask.bool()
    return {
        "global_token_count": int(mask.sum().item()),
        "global_seq_count": int(mask.any(dim=-1).sum().item()),
        "loss_scale_factor": mask.shape[-1] if loss_scale_factor is None else loss_scale_factor,
    }


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    loss_scale_factor: Number | None = None,
    *,
    global_token_count: Number | None = None,
    global_seq_count: Number | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss into a scalar, one of verl's ``loss_agg_mode`` s.

    loss_mat, loss_mask: (B, T) -> scalar. With ML = loss_mat * loss_mask and M = loss_mask:

    - ``token-mean``: sum(ML) / N_tok, N_tok = ``global_token_count`` or sum(M) of this call;
    - ``seq-mean-token-sum``: sum_b sum_t ML / N_seq;
    - ``seq-mean-token-mean``: sum_b (sum_t ML / sum_t M) / N_seq;
    - ``seq-mean-token-sum-norm`` (Dr.GRPO): sum(ML) / ``loss_scale_factor`` (default T, the padded length).

    N_seq = ``global_seq_count`` or the number of sequences of this call with at least one valid token
    (fully masked rows, e.g. micro-batch padding rows, count nowhere and contribute 0). An empty
    denominator gives a 0 loss that still has a graph.
    """
    _check_mode(loss_agg_mode)
    mask = loss_mask.to(loss_mat.dtype)
    # where(), not a product: a non-finite value on a padded token must not leak into the loss (inf * 0).
    masked = torch.where(loss_mask.bool(), loss_mat, torch.zeros_like(loss_mat))
    zero = masked.sum() * 0.0
    if loss_agg_mode == "token-mean":
        denom = mask.sum() if global_token_count is None else global_token_count
        return zero if float(denom) == 0 else masked.sum() / denom
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        if float(scale) <= 0:
            raise ValueError(f"loss_scale_factor must be > 0, got {scale}")
        return masked.sum() / scale
    tokens_per_seq = mask.sum(dim=-1)
    seq_sum = masked.sum(dim=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_loss = seq_sum / tokens_per_seq.clamp(min=1)
    else:  # seq-mean-token-sum
        seq_loss = seq_sum
    denom = (tokens_per_seq > 0).sum() if global_seq_count is None else global_seq_count
    return zero if float(denom) == 0 else seq_loss.sum() / denom
