"""KL between the policy and a frozen reference: the per-token estimators (k1, abs, k2, k3 and their
straight-through variants; verl ``kl_penalty``) and the in-reward KL penalty (verl ``apply_kl_penalty``).

Used as a loss term by the actor loss (``use_kl_loss``, actor_loss.py) and in the reward by the
``kl_in_reward`` step plug-in (kl_control.py). Shapes: (B, T).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from train.algorithms.advantages import scores_to_token_rewards

__all__ = [
    "KL_PENALTIES",
    "apply_kl_in_reward",
    "kl_penalty",
]


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference policy (verl ``kl_penalty``).

    log_prob, ref_log_prob: (B, T) -> (B, T). ``k1``/``kl``: logp - ref; ``abs``: |logp - ref|;
    ``k2``/``mse``: 0.5 (logp - ref)^2; ``k3``/``low_var_kl``: x = clamp(ref - logp, -20, 20),
    clamp(exp(x) - x - 1, -10, 10) (unbiased, non-negative, low variance; clamped for stability).
    A ``+`` suffix (``k1+``, ``k3+``, ...) is the straight-through variant: the value of the named
    estimator, the gradient of k2 (whose expected gradient is the true KL gradient; k1's and k3's are not).
    """
    straight_through = kind.endswith("+")
    base = kind[:-1] if straight_through else kind
    try:
        fn = KL_PENALTIES[base]
    except KeyError:
        valid = sorted(KL_PENALTIES) + [f"{k}+" for k in sorted(KL_PENALTIES)]
        raise ValueError(f"unknown KL penalty {kind!r}; valid: {valid}") from None
    value = fn(log_prob, ref_log_prob)
    if not straight_through:
        return value
    k2 = _kl_k2(log_prob, ref_log_prob)
    return k2 - k2.detach() + value.detach()


def _kl_k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return log_prob - ref_log_prob


def _kl_abs(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return (log_prob - ref_log_prob).abs()


def _kl_k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (log_prob - ref_log_prob).square()


def _kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    x = torch.clamp(ref_log_prob - log_prob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(x) - x - 1.0, min=-10.0, max=10.0)


KL_PENALTIES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _kl_k1,
    "kl": _kl_k1,
    "abs": _kl_abs,
    "k2": _kl_k2,
    "mse": _kl_k2,
    "k3": _kl_k3,
    "low_var_kl": _kl_k3,
}


def apply_kl_in_reward(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
    kl_penalty_type: str = "k1",
) -> tuple[torch.Tensor, dict[str, float]]:
    """In-reward KL (``use_kl_in_reward``): rewards = scores - beta * kl(old_logp, ref) on valid tokens.

    token_level_scores: (B, T), or (B,) outcome scores (placed on the last valid token); old_log_prob,
    ref_log_prob, response_mask: (B, T) -> (token_level_rewards (B, T), metrics) with
    ``actor/reward_kl_penalty`` = batch mean of the per-sequence mean KL and
    ``actor/reward_kl_penalty_coeff`` = beta. Feed the rewards (B, T) to the advantage estimator.
    """
    with torch.no_grad():
        if token_level_scores.dim() == 1:
            token_level_scores = scores_to_token_rewards(token_level_scores, response_mask)
        mask = response_mask.to(old_log_prob.dtype)
        kld = kl_penalty(old_log_prob, ref_log_prob, kl_penalty_type) * mask
        rewards = token_level_scores - beta * kld
        per_seq = kld.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
        metrics = {
            "actor/reward_kl_penalty": per_seq.mean().item(),
            "actor/reward_kl_penalty_coeff": float(beta),
        }
    return rewards, metrics
