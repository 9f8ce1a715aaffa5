"""Rollout/trainer mismatch: the rollout engine's log-probs (vLLM, often bf16 kernels) are not the
trainer's, so the "on-policy" samples are slightly off-policy. Measure it, and correct for it.

With rho_t = pi_train(y_t) / pi_rollout(y_t) (``log_ratio`` = train logp - rollout logp, per token):

- :func:`mismatch_metrics`: KL(rollout || train) estimates, the largest and smallest ratio, perplexities;
  cheap, logged every step whenever the rollout log-probs are available;
- :func:`truncated_is_weights` (TIS, Yao et al. 2025): weights min(rho, C) per token or per sequence
  (the product of the token ratios), detached; they multiply the per-token policy loss;
- :func:`masked_is_mask` (masked IS / rejection): tokens or sequences whose ratio leaves [lower, upper]
  are dropped from the loss instead of reweighted.

Semantics follow verl's ``rollout_corr_helper`` (token/sequence IS, token_k1/seq_sum_k1/seq_mean_k1
rejection); off by default (``algorithm.rollout_is=null``, ``algorithm.rollout_rs=null``).
"""

from __future__ import annotations

import math

import torch

from train.algorithms.aggregation import masked_mean
from train.algorithms.registry import Knob, register_step

__all__ = [
    "IS_LEVELS",
    "RS_LEVELS",
    "ROLLOUT_CORRECTION_KNOBS",
    "masked_is_mask",
    "mismatch_metrics",
    "rollout_correction",
    "truncated_is_weights",
]

SAFETY_BOUND = 20.0  # |log ratio| clamp before exp: exp(20) ~ 5e8 keeps weights finite
IS_LEVELS = ("token", "sequence")
RS_LEVELS = ("token", "sequence", "geometric")  # per token; sum of log ratios; mean of log ratios


def _seq_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(dim=-1)


@torch.no_grad()
def mismatch_metrics(
    train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout engine's distribution is from the trainer's, on the sampled tokens.

    All (B, T). Keys (``rollout_corr/`` prefix): ``kl`` = mean(rollout logp - train logp) (k1 estimate
    of KL(rollout || train), the sampling distribution being the rollout's), ``k3_kl`` = mean(rho - 1 -
    log rho), ``ratio_max`` / ``ratio_min`` over valid tokens, ``training_ppl`` / ``rollout_ppl`` (batch
    mean of per-sequence exp(-mean logp)), ``log_ppl_abs_diff``, ``chi2_token`` = mean(rho^2) - 1.
    """
    mask = response_mask.bool()
    if not bool(mask.any()):
        raise ValueError("mismatch_metrics: the response mask has no valid token")
    train, rollout = train_log_prob.double(), rollout_log_prob.double()
    log_ratio = torch.clamp(train - rollout, -SAFETY_BOUND, SAFETY_BOUND)
    ratio = torch.exp(log_ratio)
    lengths = mask.sum(dim=-1).clamp(min=1)
    train_seq = _seq_sum(train, mask) / lengths
    rollout_seq = _seq_sum(rollout, mask) / lengths
    prefix = "rollout_corr/"
    return {
        prefix + "kl": masked_mean(rollout - train, mask).item(),
        prefix + "k3_kl": masked_mean(ratio - 1 - log_ratio, mask).item(),
        prefix + "ratio_max": ratio[mask].max().item(),
        prefix + "ratio_min": ratio[mask].min().item(),
        prefix + "training_ppl": torch.exp(-train_seq).mean().item(),
        prefix + "rollout_ppl": torch.exp(-rollout_seq).mean().item(),
        prefix + "log_ppl_abs_diff": (rollout_seq - train_seq).abs().mean().item(),
        prefix + "chi2_token": (masked_mean(ratio.square(), mask) - 1.0).item(),
    }


@torch.no_grad()
def truncated_is_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    threshold: float = 2.0,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights (B, T), zero on padding, and their metrics.

    log_ratio, response_mask: (B, T). ``token``: w_t = min(rho_t, threshold); ``sequence``: every token of
    a sequence gets min(prod_t rho_t, threshold) (unbiased before truncation, high variance). Log ratios
    are clamped to +-20 before exp. ``batch_normalize`` rescales the weights to mean 1 over valid tokens
    (token level) or sequences (sequence level). Metrics (``rollout_corr/`` prefix): ``is_mean`` (after
    truncation, before normalising), ``is_fraction_truncated`` (share of tokens, or sequences, over the
    threshold), ``is_batch_norm_factor`` when normalising.
    """
    if level not in IS_LEVELS:
        raise ValueError(f"algorithm.rollout_is={level!r} is unknown: use token or sequence (or null: off)")
    if not threshold > 0:
        raise ValueError(f"algorithm.rollout_is_threshold={threshold} must be > 0")
    mask = response_mask.to(log_ratio.dtype)
    if level == "token":
        raw_log = log_ratio
        weights = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
        over = masked_mean((log_ratio > math.log(threshold)).float(), response_mask)
    else:
        raw_log = _seq_sum(log_ratio, response_mask)
        weights = (
            torch.exp(torch.clamp(raw_log, -SAFETY_BOUND, SAFETY_BOUND)).unsqueeze(-1).expand_as(log_ratio)
        )
        over = (raw_log > math.log(threshold)).float().mean()
    weights = weights.clamp(max=threshold) * mask
    metrics = {
        "rollout_corr/is_mean": masked_mean(weights, response_mask).item(),
        "rollout_corr/is_fraction_truncated": over.item(),
    }
    if batch_normalize:
        if level == "token":
            mean = masked_mean(weights, response_mask)
        else:
            has_token = response_mask.bool().any(dim=-1)
            per_seq = _seq_sum(weights, response_mask) / mask.sum(dim=-1).clamp(min=1)
            mean = per_seq[has_token].mean() if bool(has_token.any()) else torch.zeros(())
        if float(mean) > 1e-8:
            weights = weights / mean
        metrics["rollout_corr/is_batch_norm_factor"] = float(mean) if float(mean) > 1e-8 else 1.0
    return weights, metrics


@torch.no_grad()
def masked_is_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    lower: float = 0.5,
    upper: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Masked importance sampling: the response mask with out-of-range tokens or sequences removed.

    log_ratio, response_mask: (B, T); keep where lower <= ratio <= upper, the ratio being rho_t per token
    (``token``), prod_t rho_t (``sequence``) or its geometric mean exp(mean_t log rho_t) (``geometric``),
    a rejected sequence losing all its tokens. Returns (new mask, same dtype as response_mask; metrics
    ``rollout_corr/rs_masked_fraction`` = share of valid tokens removed, ``rs_seq_masked_fraction``).
    """
    if level not in RS_LEVELS:
        raise ValueError(
            f"algorithm.rollout_rs={level!r} is unknown: use token, sequence or geometric (or null)"
        )
    if not 0 < lower <= upper:
        raise ValueError(f"algorithm.rollout_rs bounds need 0 < lower <= upper, got {lower}, {upper}")
    lo, hi = math.log(lower), math.log(upper)
    valid = response_mask.bool()
    if level == "token":
        inside = (log_ratio >= lo) & (log_ratio <= hi)
    else:
        stat = _seq_sum(log_ratio, response_mask)
        if level == "geometric":
            stat = stat / valid.sum(dim=-1).clamp(min=1)
        inside = ((stat >= lo) & (stat <= hi)).unsqueeze(-1).expand_as(valid)
    kept = valid & inside
    has_token = valid.any(dim=-1)
    lost = (valid & ~kept).any(dim=-1)
    metrics = {
        "rollout_corr/rs_masked_fraction": masked_mean((~kept).float(), valid).item(),
        "rollout_corr/rs_seq_masked_fraction": (lost.float().sum() / has_token.sum().clamp(min=1)).item(),
    }
    return kept.to(response_mask.dtype), metrics


ROLLOUT_CORRECTION_KNOBS = {
    "rollout_is": Knob(None, "rollout/trainer TIS weights: token | sequence | null (off)", str, choices=(None, *IS_LEVELS)),
    "rollout_is_threshold": Knob(2.0, "TIS: weights truncated at this value", float, valid=lambda c: c > 0, rule="> 0"),
    "rollout_is_batch_normalize": Knob(False, "TIS: rescale the weights to mean 1 over the batch"),
    "rollout_rs": Knob(None, "masked IS: drop tokens/sequences whose ratio leaves [lower, upper]: token | sequence | geometric | null (off)", str, choices=(None, *RS_LEVELS)),
    "rollout_rs_lower": Knob(0.5, "masked IS: lowest kept ratio pi_train / pi_rollout", float, valid=lambda x: x > 0, rule="> 0"),
    "rollout_rs_upper": Knob(2.0, "masked IS: highest kept ratio pi_train / pi_rollout", float, valid=lambda x: x > 0, rule="> 0"),
}  # fmt: skip


# ==== the step plug-ins: rollout correction before the update, mismatch figures after it ============
def rollout_correction(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor, cfg
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
    """The one entry point of rollout/trainer correction: (loss mask, IS weights or None, metrics).

    old_log_prob (the trainer's), rollout_log_prob (the engine's), response_mask: (B, T); ``cfg`` the
    algorithm config (``rollout_rs*``, ``rollout_is*``). Masked IS (``rollout_rs``) first, then TIS weights
    (``rollout_is``) over the tokens it kept."""
    log_ratio = (old_log_prob - rollout_log_prob) * response_mask
    loss_mask, is_weights, metrics = response_mask, None, {}
    if cfg.rollout_rs is not None:
        loss_mask, rs_metrics = masked_is_mask(
            log_ratio, response_mask, cfg.rollout_rs, cfg.rollout_rs_lower, cfg.rollout_rs_upper
        )
        metrics.update(rs_metrics)
    if cfg.rollout_is is not None:
        is_weights, is_metrics = truncated_is_weights(
            log_ratio, loss_mask, cfg.rollout_is, cfg.rollout_is_threshold, cfg.rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    return loss_mask, is_weights, metrics


@register_step(
    "rollout_correction",
    "before_update",
    enabled=lambda cfg: cfg.rollout_is is not None or cfg.rollout_rs is not None,
    knobs=ROLLOUT_CORRECTION_KNOBS,
    needs=("old_log_probs", "rollout_log_probs"),
)
def rollout_correction_step(cfg, batch, ctx) -> dict[str, float]:
    """``batch["loss_mask"]`` and ``batch["is_weights"]`` from :func:`rollout_correction`."""
    loss_mask, is_weights, metrics = rollout_correction(
        batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"], cfg
    )
    batch["loss_mask"] = loss_mask
    if is_weights is not None:
        batch["is_weights"] = is_weights
    return metrics


@register_step("mismatch_metrics", "after_update", enabled=lambda cfg: True)
def mismatch_step(cfg, batch, ctx) -> dict[str, float]:
    """:func:`mismatch_metrics` every step where both log-probs exist (the trainer's: its old log-probs,
    or those the single on-policy update saw)."""
    if "rollout_log_probs" not in batch or "old_log_probs" not in batch:
        return {}
    return mismatch_metrics(batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"])
