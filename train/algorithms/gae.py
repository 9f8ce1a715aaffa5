"""PPO with a critic: GAE advantages and returns, the clipped value loss, critic warm-up.

Pure tensor functions (verl ``compute_gae_advantage_return`` / ``compute_value_loss`` semantics). Shapes:
B responses, T padded response length; ``values[:, t]`` is the critic's estimate of the return from the
state before response token t (the value head read at the position that predicts token t).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from train.algorithms.advantages import masked_whiten, scores_to_token_rewards
from train.algorithms.aggregation import Number, agg_loss, masked_mean
from train.algorithms.registry import AdvantageOutput, Knob, register_adv_estimator

__all__ = [
    "GAE_KNOBS",
    "GaeResult",
    "actor_trains_at",
    "compute_gae_advantage_return",
    "value_loss",
]


class GaeResult(NamedTuple):
    advantages: torch.Tensor  # (B, T) whitened over the batch's valid tokens, zero on padding
    returns: torch.Tensor  # (B, T) the critic's regression targets: raw advantages + values, 0 on padding


@torch.no_grad()
def compute_gae_advantage_return(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> GaeResult:
    """Generalised advantage estimation (Schulman et al. 2015) over each response.

    token_rewards: (B, T) (or (B,) outcome scores, placed on the last valid token); values, response_mask:
    (B, T). delta_t = r_t + gamma * V_{t+1} - V_t; A_t = delta_t + gamma * lam * A_{t+1}, where "t+1" is
    the next *valid* token (masked positions are skipped, so a hole in the mask does not cut the
    recursion; after the last valid token V and A are 0). returns = A + V (before whitening); the
    advantages are then whitened with ``masked_whiten`` and zeroed on padding.
    """
    rewards = (
        token_rewards if token_rewards.dim() == 2 else scores_to_token_rewards(token_rewards, response_mask)
    )
    rewards = rewards.to(values.dtype)
    mask = response_mask.to(values.dtype)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    raw = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        raw[:, t] = adv_t
        valid = mask[:, t]
        next_value = valid * values[:, t] + (1 - valid) * next_value
        next_adv = valid * adv_t + (1 - valid) * next_adv
    return GaeResult(masked_whiten(raw, mask) * mask, (raw + values) * mask)


def value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    old_values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float = 0.5,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: Number | None = None,
    *,
    global_token_count: Number | None = None,
    global_seq_count: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss: 0.5 * agg(max((V - R)^2, (clip(V, V_old +- c) - R)^2)).

    vpreds: (B, T) the critic's current predictions (with grad); returns: (B, T) GAE targets; old_values:
    (B, T) the predictions made when the batch was collected; the clip keeps one update from moving a
    value further than ``cliprange_value`` from it. Metrics: ``critic/vf_loss``, ``critic/vf_clipfrac``
    (share of tokens where the clipped term is the larger), ``critic/vpred_mean``. Global normalisers as
    in ``aggregation.agg_loss`` (micro-batches).
    """
    clipped = torch.clamp(vpreds, old_values - cliprange_value, old_values + cliprange_value)
    unclipped_loss = (vpreds - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    per_token = torch.maximum(unclipped_loss, clipped_loss)
    loss = 0.5 * agg_loss(
        per_token,
        response_mask,
        loss_agg_mode,
        loss_scale_factor,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
    )
    with torch.no_grad():
        local = 0.5 * agg_loss(per_token.detach(), response_mask, loss_agg_mode, loss_scale_factor)
        metrics = {
            "critic/vf_loss": local.item(),
            "critic/vf_clipfrac": masked_mean((clipped_loss > unclipped_loss).float(), response_mask).item(),
            "critic/vpred_mean": masked_mean(vpreds.detach().float(), response_mask).item(),
        }
    return loss, metrics


def actor_trains_at(step: int, critic_warmup: int) -> bool:
    """Whether the actor updates at ``step`` (0-based): the first ``critic_warmup`` steps train the critic
    alone, so the advantages are not built on an untrained value head."""
    return step >= critic_warmup


# ---- method-table adapter: fn(cfg, ctx) -> GaeResult ----------------------------------------------------
def _unit(x: float) -> bool:
    return 0 <= x <= 1


GAE_KNOBS = {
    "gamma": Knob(1.0, "discount of later token rewards (GAE, REINFORCE++)", float, valid=_unit, rule="in [0, 1]"),
    "lam": Knob(1.0, "GAE lambda: 1 = Monte-Carlo returns minus V, 0 = one-step TD", float, valid=_unit, rule="in [0, 1]"),
}  # fmt: skip


@register_adv_estimator("gae", knobs=GAE_KNOBS, needs=("values",))
def gae_entry(cfg: Any, ctx: Any) -> AdvantageOutput:
    """``algorithm.adv_estimator=gae``: needs ``values`` (the critic's, (B, T)) in the context; returns
    the advantages and the critic's targets (``returns``)."""
    if ctx.values is None:
        raise ValueError(
            "algorithm.adv_estimator=gae needs the critic's values (the trainer builds the critic)"
        )
    result = compute_gae_advantage_return(ctx.rewards(), ctx.values, ctx.response_mask, cfg.gamma, cfg.lam)
    return AdvantageOutput(result.advantages, returns=result.returns)
