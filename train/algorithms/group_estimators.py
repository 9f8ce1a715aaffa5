"""Outcome estimators verl has beside GRPO/RLOO: REINFORCE++ with a group baseline, OPO, GPG, GRPO pass@k.

Same conventions as ``advantages.py``: ``scores`` (B,) outcome rewards (or (B, T) token-level rewards,
summed over the response), ``group_index`` (B,) (same value = same prompt), ``response_mask`` (B, T);
each returns the (B, T) per-token advantage, zero on padding. No gradients, no I/O.

The ``*_entry(cfg, ctx)`` functions are the method-table adapters (``cfg``: the algorithm config,
``ctx``: the trainer's advantage context with ``rewards()``, ``group_index``, ``response_mask``).
"""

from __future__ import annotations

from typing import Any

import torch

from train.algorithms.advantages import _group_ids, _group_stats, _sequence_scores, masked_whiten
from train.algorithms.registry import Knob, register_adv_estimator

__all__ = [
    "GPG_KNOBS",
    "PASSK_KNOBS",
    "compute_gpg_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
]


def _broadcast(per_response: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return per_response.unsqueeze(-1) * response_mask.to(per_response.dtype)


def _mean_baseline(s: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Group mean per response, 0 for a group of one (its own score is no baseline)."""
    count, mean, _ = _group_stats(s, group_index)
    return torch.where(count == 1, torch.zeros_like(mean), mean)


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    scores: torch.Tensor, group_index: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """REINFORCE++-baseline (arXiv 2501.03262): subtract the group mean, then whiten over the batch.

    A_i = s_i - mean_g (a group of one keeps s_i), broadcast over the response, then ``masked_whiten``
    (mean and unbiased std of all valid tokens of the batch) times the mask. Long responses weigh more
    in the batch statistics, as in verl.
    """
    s = _sequence_scores(scores, response_mask)
    centred = _broadcast(s - _mean_baseline(s, group_index), response_mask)
    mask = response_mask.to(centred.dtype)
    return masked_whiten(centred, mask) * mask


@torch.no_grad()
def compute_opo_outcome_advantage(
    scores: torch.Tensor, group_index: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """OPO (arXiv 2505.23585): baseline = the length-weighted mean of the group's scores.

    b_g = sum_i |y_i| s_i / sum_i |y_i| over the group (|y_i| = valid tokens); A_i = s_i - b_g. A group of
    one, or a group whose responses are all empty, has baseline 0 (verl: 0 and NaN respectively).
    """
    s = _sequence_scores(scores, response_mask)
    lengths = response_mask.to(s.dtype).sum(dim=-1)
    ids, n_groups = _group_ids(group_index, s.shape[0])
    weighted = torch.zeros(n_groups, dtype=s.dtype).scatter_add_(0, ids, lengths * s)
    total = torch.zeros(n_groups, dtype=s.dtype).scatter_add_(0, ids, lengths)
    count = torch.zeros(n_groups, dtype=s.dtype).scatter_add_(0, ids, torch.ones_like(s))
    baseline = torch.where((count > 1) & (total > 0), weighted / total.clamp(min=1), torch.zeros_like(total))
    return _broadcast(s - baseline[ids], response_mask)


@torch.no_grad()
def compute_gpg_outcome_advantage(
    scores: torch.Tensor, group_index: torch.Tensor, response_mask: torch.Tensor, f_norm: float = 1.0
) -> torch.Tensor:
    """GPG (arXiv 2504.02546): A_i = alpha * (s_i - mean_g) / f_norm with alpha = B / #(s != 0).

    alpha rescales the batch by the share of responses with a non-zero reward (at least one counted), so a
    batch where few responses score still gets a full-size gradient. A group of one has mean 0.
    """
    s = _sequence_scores(scores, response_mask)
    alpha = s.shape[0] / max(int(torch.count_nonzero(s)), 1)
    return _broadcast(alpha * (s - _mean_baseline(s, group_index)) / f_norm, response_mask)


@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    scores: torch.Tensor,
    group_index: torch.Tensor,
    response_mask: torch.Tensor,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> torch.Tensor:
    """GRPO for pass@k (arXiv 2503.19595): only each group's best response learns, by its margin.

    A_best = r_max - r_second (divided by the group's unbiased std + epsilon when
    ``norm_adv_by_std_in_grpo``); every other response gets 0. Ties for the best give 0. Needs at least
    two responses per group (ValueError otherwise, as in verl).
    """
    s = _sequence_scores(scores, response_mask)
    ids, n_groups = _group_ids(group_index, s.shape[0])
    count, _, std = _group_stats(s, group_index)
    if bool((count < 2).any()):
        raise ValueError("adv_estimator=grpo_passk needs at least 2 responses per prompt; set rollout.n >= 2")
    adv = torch.zeros_like(s)
    for g in range(n_groups):
        members = torch.nonzero(ids == g, as_tuple=True)[0]
        top = torch.topk(s[members], 2)
        best = members[top.indices[0]]
        margin = top.values[0] - top.values[1]
        adv[best] = margin / (std[best] + epsilon) if norm_adv_by_std_in_grpo else margin
    return _broadcast(adv, response_mask)


# ---- method-table adapters: fn(cfg, ctx) -> (B, T) -------------------------------------------------------
GPG_KNOBS = {"gpg_f_norm": Knob(1.0, "GPG: divide the advantage by this constant (verl never sets it: 1)")}
PASSK_KNOBS = {"norm_adv_by_std_in_grpo": Knob(True, "divide by the group std (False: Dr.GRPO-style)")}


@register_adv_estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline_entry(cfg: Any, ctx: Any) -> torch.Tensor:
    """``algorithm.adv_estimator=reinforce_plus_plus_baseline``."""
    return compute_reinforce_plus_plus_baseline_outcome_advantage(
        ctx.rewards(), ctx.group_index, ctx.response_mask
    )


@register_adv_estimator("opo")
def opo_entry(cfg: Any, ctx: Any) -> torch.Tensor:
    """``algorithm.adv_estimator=opo``."""
    return compute_opo_outcome_advantage(ctx.rewards(), ctx.group_index, ctx.response_mask)


@register_adv_estimator("gpg", knobs=GPG_KNOBS)
def gpg_entry(cfg: Any, ctx: Any) -> torch.Tensor:
    """``algorithm.adv_estimator=gpg`` (pair with ``algorithm.policy_loss_mode=gpg``)."""
    return compute_gpg_outcome_advantage(
        ctx.rewards(), ctx.group_index, ctx.response_mask, f_norm=cfg.gpg_f_norm
    )


@register_adv_estimator("grpo_passk", knobs=PASSK_KNOBS)
def grpo_passk_entry(cfg: Any, ctx: Any) -> torch.Tensor:
    """``algorithm.adv_estimator=grpo_passk``."""
    return compute_grpo_passk_outcome_advantage(
        ctx.rewards(), ctx.group_index, ctx.response_mask, norm_adv_by_std_in_grpo=cfg.norm_adv_by_std_in_grpo
    )
