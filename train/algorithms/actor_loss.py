"""The actor's loss (verl dp_actor): the policy-gradient term of the configured mode (``vanilla``: PPO
clip + dual clip, here; the other modes in policy_losses.py), minus the entropy bonus, plus the KL-to-
reference loss term, each aggregated with the one ``agg_loss`` (aggregation.py, whose micro-batching
contract applies) and optionally weighted by rollout-correction IS weights.

Pure tensor functions. Shapes: B sequences, T padded response length; ``response_mask`` is 1 on valid
response tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from train.algorithms.aggregation import Number, agg_loss
from train.algorithms.kl import kl_penalty
from train.algorithms.registry import Knob, policy_loss_from
from train.algorithms.surrogate import clip_metrics, clipped_surrogate, log_ratio

__all__ = [
    "CLIP_KNOBS",
    "actor_loss",
    "policy_loss",
    "vanilla_policy_loss",
]


def policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: Number | None = None,
    *,
    global_token_count: Number | None = None,
    global_seq_count: Number | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with dual clip (verl ``compute_policy_loss_vanilla``).

    old_log_prob, log_prob, advantages, response_mask: (B, T) -> (pg_loss scalar, metrics).
    rho = exp(clamp(logp - old_logp, -20, 20)); L = max(-A*rho, -A*clip(rho, 1-low, 1+high)); for A < 0
    L = min(-A*clip_ratio_c, L) (bounds the loss when rho explodes on a negative advantage).
    Metrics (token means over this call's mask): ``pg_clipfrac`` share of tokens where the clipped term
    is the larger one, ``ppo_kl`` mean(old_logp - logp) (clamped), ``pg_clipfrac_lower`` share of A < 0
    tokens where the dual clip is active.
    """
    pg_losses, metrics = _ppo_terms(
        old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c
    )
    pg_loss = agg_loss(
        pg_losses,
        response_mask,
        loss_agg_mode,
        loss_scale_factor,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
    )
    return pg_loss, metrics


def _ppo_terms(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token dual-clip PPO loss (B, T) and the clip metrics of ``policy_loss``."""
    if not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip bound) must be > 1.0, got {clip_ratio_c}")
    log_r = log_ratio(old_log_prob, log_prob)
    surrogate = clipped_surrogate(advantages, torch.exp(log_r), clip_ratio_low, clip_ratio_high)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(dual_bound, surrogate.loss), surrogate.loss)
    with torch.no_grad():
        dual_clipped = (surrogate.loss > dual_bound) & negative
        metrics = clip_metrics(surrogate.clip_mask(), log_r, response_mask, dual_clipped)
    return pg_losses, metrics


CLIP_KNOBS = {  # shared by every clipped mode (policy_losses.py)
    "clip_ratio_low": Knob(0.2, "PPO clip: ratio >= 1 - clip_ratio_low"),
    "clip_ratio_high": Knob(0.2, "PPO clip: ratio <= 1 + clip_ratio_high"),
}
vanilla_policy_loss = policy_loss_from(
    "vanilla",
    _ppo_terms,  # the PPO clip + dual clip loss: per-token (B, T) loss and clip metrics
    {
        **CLIP_KNOBS,
        "clip_ratio_c": Knob(3.0, "dual-clip bound for negative advantages", float, valid=lambda c: c > 1, rule="> 1"),
    },
)  # fmt: skip


def actor_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    pg_loss_fn: Callable | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coeff: float = 0.0,
    ref_log_prob: torch.Tensor | None = None,
    use_kl_loss: bool = False,
    kl_loss_coef: float = 0.001,
    kl_loss_type: str = "low_var_kl",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: Number | None = None,
    global_token_count: Number | None = None,
    global_seq_count: Number | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Actor loss = pg - entropy_coeff * agg(H) + kl_loss_coef * agg(kl(logp, ref)) (verl dp_actor).

    ``is_weights`` (B, T), detached: rollout/trainer importance weights (TIS, ``rollout_correction``)
    multiplying the per-token policy loss of whatever mode before aggregation; masked IS is applied by
    passing its mask as ``response_mask``.

    All tensors (B, T). ``pg_loss_fn(old_log_prob, log_prob, advantages, response_mask) -> (per-token
    loss, metrics)`` is the policy-loss mode (a registered entry with its config bound); without it,
    PPO clip + dual clip with the ``clip_ratio_*`` given here. ``entropy`` (B, T) is required when ``entropy_coeff != 0`` (it must carry grad
    then) and only reported otherwise; ``ref_log_prob`` is required when ``use_kl_loss``. Every term
    uses the same ``loss_agg_mode`` and normalisers (see the module docstring for micro-batches).
    Returns (loss, metrics) with metric keys ``actor/pg_loss``, ``actor/pg_clipfrac``, ``actor/ppo_kl``,
    ``actor/pg_clipfrac_lower``, plus ``actor/entropy`` when ``entropy`` is given and ``actor/kl_loss``,
    ``actor/kl_coef`` when ``use_kl_loss``. Metric values are this call's own aggregates (local
    normalisers), so averaging them over micro-batches gives the mini-batch value.
    """
    if entropy_coeff != 0 and entropy is None:
        raise ValueError("entropy_coeff != 0 needs the per-token entropy (B, T)")
    if use_kl_loss and ref_log_prob is None:
        raise ValueError("use_kl_loss=True needs ref_log_prob (B, T)")
    if pg_loss_fn is None:
        pg_losses, pg_metrics = _ppo_terms(
            old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c
        )
    else:
        pg_losses, pg_metrics = pg_loss_fn(old_log_prob, log_prob, advantages, response_mask)
    if is_weights is not None:
        pg_losses = pg_losses * is_weights.detach()
    term = _Aggregate(response_mask, loss_agg_mode, loss_scale_factor, global_token_count, global_seq_count)
    loss = term.loss(pg_losses)
    metrics = {"actor/pg_loss": term.local(pg_losses), **{f"actor/{k}": v for k, v in pg_metrics.items()}}
    if entropy is not None:
        if entropy_coeff != 0:
            loss = loss - entropy_coeff * term.loss(entropy)
        metrics["actor/entropy"] = term.local(entropy)
    if use_kl_loss:
        kld = kl_penalty(log_prob, ref_log_prob, kl_loss_type)
        loss = loss + kl_loss_coef * term.loss(kld)
        metrics["actor/kl_loss"] = term.local(kld)
        metrics["actor/kl_coef"] = float(kl_loss_coef)
    return loss, metrics


class _Aggregate:
    """One ``agg_loss`` setting for every term of the actor loss: ``loss`` with the global normalisers
    (what the gradient sees), ``local`` with this call's own (the metric, detached)."""

    def __init__(
        self, response_mask, mode: str, scale: Number | None, tokens: Number | None, seqs: Number | None
    ):
        self.mask, self.mode, self.scale = response_mask, mode, scale
        self.norms = {"global_token_count": tokens, "global_seq_count": seqs}

    def loss(self, values: torch.Tensor) -> torch.Tensor:
        return agg_loss(values, self.mask, self.mode, self.scale, **self.norms)

    def local(self, values: torch.Tensor) -> float:
        with torch.no_grad():
            return agg_loss(values.detach(), self.mask, self.mode, self.scale).item()
