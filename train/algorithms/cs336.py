"""CS336 assignment 5's policy-gradient variants: the `no_baseline` estimator (the raw reward is the advantage).

The course's three losses map onto the method table (presets in train/algorithms/presets.py):
`no_baseline` = this estimator + `policy_loss_mode=gpg` (-A log pi, no ratio); `reinforce_with_baseline` =
the `grpo` estimator (r - group mean) / (group std + 1e-6), unbiased std as `torch.std`) + `gpg`;
`grpo_clip` = `grpo` + the textbook PPO clip (`vanilla` with `clip_ratio_c=inf`: no dual clip). All three
average each sequence's tokens, then the sequences (`loss_agg_mode=seq-mean-token-mean`, the course's
`masked_mean(..., dim=-1)` then the batch mean).
"""

from __future__ import annotations

import torch

from train.algorithms.advantages import _float, _sequence_scores
from train.algorithms.registry import register_adv_estimator

__all__ = ["compute_no_baseline_advantage"]


def compute_no_baseline_advantage(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A_i = r_i (no baseline, no normalisation), broadcast over the response tokens, zero on padding."""
    mask = _float(response_mask)
    return _sequence_scores(scores, response_mask).to(mask.dtype).unsqueeze(-1) * mask


@register_adv_estimator("no_baseline")
def no_baseline(cfg, ctx) -> torch.Tensor:
    return compute_no_baseline_advantage(ctx.rewards(), ctx.response_mask)
