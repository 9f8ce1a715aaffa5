"""The pieces every ratio-based policy loss is built from, written once: the log-ratio and importance ratio
of the current to the old policy, PPO's clipped surrogate, and the clip / KL metrics the actor logs.

vanilla (actor_loss.py) and gspo, clip_cov, kl_cov, cispo, sapo, geo_mean, bypass_mode (policy_losses.py)
compose these; each mode's own rule (sequence ratios, covariance selection, smooth gates) stays in its
function. Shapes (B, T); ``mask`` is 1 on valid response tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from train.algorithms.aggregation import masked_mean

Metrics = dict[str, float]
LOG_RATIO_BOUND = 20.0  # exp stays finite when the policies drift apart (verl clamps the same)


def log_ratio(
    old_log_prob: torch.Tensor, log_prob: torch.Tensor, bound: float | None = LOG_RATIO_BOUND
) -> torch.Tensor:
    """logp - old_logp, clamped to +-bound (None: raw, as verl's clip_cov, kl_cov and geo_mean)."""
    diff = log_prob - old_log_prob
    return diff if bound is None else torch.clamp(diff, min=-bound, max=bound)


class ClippedSurrogate(NamedTuple):
    unclipped: torch.Tensor  # -A * ratio
    clipped: torch.Tensor  # -A * clip(ratio, 1 - low, 1 + high)
    loss: torch.Tensor  # the larger of the two (PPO's pessimistic bound), per token

    def clip_mask(self) -> torch.Tensor:
        """Tokens where the clipped term is the larger one (no gradient through them)."""
        return self.clipped > self.unclipped


def clipped_surrogate(
    advantages: torch.Tensor, ratio: torch.Tensor, clip_ratio_low: float, clip_ratio_high: float
) -> ClippedSurrogate:
    """PPO's clipped surrogate max(-A r, -A clip(r, 1 - low, 1 + high)) and its two terms."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    return ClippedSurrogate(unclipped, clipped, torch.maximum(unclipped, clipped))


def ppo_kl(log_ratio: torch.Tensor, mask: torch.Tensor) -> float:
    """The ``ppo_kl`` metric: mean(old_logp - logp) over the valid tokens of the log-ratio given (clamped
    or raw, as each mode's verl counterpart reports it)."""
    return masked_mean(-log_ratio.detach().float(), mask).item()


def clip_metrics(
    clipped: torch.Tensor,
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    clipped_lower: torch.Tensor | None = None,
) -> Metrics:
    """``pg_clipfrac`` (share of valid tokens in ``clipped``), ``ppo_kl`` and ``pg_clipfrac_lower`` (share
    in ``clipped_lower``; 0 for a mode without a lower / dual clip)."""
    lower = 0.0 if clipped_lower is None else masked_mean(clipped_lower.float(), mask).item()
    return {
        "pg_clipfrac": masked_mean(clipped.float(), mask).item(),
        "ppo_kl": ppo_kl(log_ratio, mask),
        "pg_clipfrac_lower": lower,
    }
