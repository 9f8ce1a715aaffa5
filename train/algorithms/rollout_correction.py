"""Rollout/trainer mismatch: the rollout engine's log-probs (vLLM, often bf16 kernels) are not the
trainer's, so the "on-policy" samples are slightly off-policy. Measure it, and correct for it.

With rho_t = pi_train(y_t) / pi_rollout(y_t) (``log_ratio`` = train logp - rollout logp, per token):

- :func:`rollout_correction`: the one entry point the trainer calls: IS weights and the rejection mask
  from the algorithm config, as verl's ``compute_rollout_correction_and_rejection_mask``;
- :func:`mismatch_metrics`: KL(rollout || train) estimates, the largest and smallest ratio, perplexities;
  cheap, logged every step whenever the rollout log-probs are available;
- :func:`truncated_is_weights` (TIS, Yao et al. 2025): weights min(rho, C) per token or per sequence
  (the product of the token ratios), detached; they multiply the per-token policy loss;
- :func:`rejection_mask` (rejection sampling, "masked IS"): tokens or sequences whose divergence
  statistic leaves its bounds are dropped from the loss instead of reweighted; verl's criteria
  (``token_k1..3``, ``seq_sum_k1..3``, ``seq_mean_k1..3``, ``seq_max_k2/k3``), chained with commas.

Semantics follow verl's ``rollout_corr_helper``: the IS weights are computed over the full response mask
and rejection only shrinks the loss mask (rejection is independent of IS weighting). Off by default
(``algorithm.rollout_is=null``, ``algorithm.rollout_rs=null``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from train.algorithms.aggregation import masked_mean
from train.algorithms.registry import Knob, register_step

__all__ = [
    "IS_LEVELS",
    "IS_NORMALIZE_MASKS",
    "ROLLOUT_CORRECTION_KNOBS",
    "RS_ALIASES",
    "RS_OPTIONS",
    "Criterion",
    "masked_is_mask",
    "mismatch_metrics",
    "parse_rejection",
    "rejection_mask",
    "rollout_correction",
    "truncated_is_weights",
]

SAFETY_BOUND = 20.0  # |log ratio| clamp before exp: exp(20) ~ 5e8 keeps weights finite
IS_LEVELS = ("token", "sequence")
# which tokens batch normalisation averages the weights over: verl's (every valid response token) or the
# loss mask left after rejection (the tokens the loss actually sees)
IS_NORMALIZE_MASKS = ("response", "loss")
# verl's rejection criteria: <where>_<estimator>; k1 = -log rho, k2 = (log rho)^2 / 2, k3 = rho - 1 - log rho
RS_OPTIONS = (
    "token_k1", "token_k2", "token_k3",
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
    "seq_max_k2", "seq_max_k3",
)  # fmt: skip
# the project's earlier names: k1 criteria bounded on rho itself by rollout_rs_lower / rollout_rs_upper
RS_ALIASES = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}


def _seq_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(dim=-1)


@torch.no_grad()
def mismatch_metrics(
    train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout engine's distribution is from the trainer's, on the sampled tokens.

    All (B, T). Keys (``rollout_corr/`` prefix): ``kl`` = mean(rollout logp - train logp) (k1 estimate
    of KL(rollout || train), the sampling distribution being the rollout's), ``k3_kl`` = mean(rho - 1 -
    log rho) computed exactly (no clamp, as verl: the metric exists to expose extreme tokens),
    ``ratio_max`` / ``ratio_min`` over valid tokens, ``training_ppl`` / ``rollout_ppl`` (batch mean of
    per-sequence exp(-mean logp)), ``log_ppl_abs_diff``, ``chi2_token`` = mean(rho^2) - 1. ``ratio_*`` and
    ``chi2_token`` use log rho clamped to +-20 (verl's safety bound), so they stay finite.
    """
    mask = response_mask.bool()
    if not bool(mask.any()):
        raise ValueError("mismatch_metrics: the response mask has no valid token")
    train, rollout = train_log_prob.double(), rollout_log_prob.double()
    raw_log_ratio = torch.where(mask, train - rollout, torch.zeros_like(train))
    log_ratio = torch.clamp(raw_log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    ratio = torch.exp(log_ratio)
    lengths = mask.sum(dim=-1).clamp(min=1)
    train_seq = _seq_sum(train, mask) / lengths
    rollout_seq = _seq_sum(rollout, mask) / lengths
    prefix = "rollout_corr/"
    return {
        prefix + "kl": masked_mean(rollout - train, mask).item(),
        prefix + "k3_kl": masked_mean(torch.exp(raw_log_ratio) - 1 - raw_log_ratio, mask).item(),
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
    normalize_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights (B, T), zero on padding, and their metrics.

    log_ratio, response_mask: (B, T). ``token``: w_t = min(rho_t, threshold); ``sequence``: every token of
    a sequence gets min(prod_t rho_t, threshold) over all its valid tokens (unbiased before truncation,
    high variance). Log ratios (token) or their sequence sums are clamped to +-20 before exp.
    ``batch_normalize`` rescales the weights to mean 1 over the valid tokens (token level) or sequences
    (sequence level) of ``normalize_mask`` (B, T), by default ``response_mask`` (verl); pass the loss mask
    left after rejection to average over the tokens the loss sees. Metrics (``rollout_corr/`` prefix),
    over ``response_mask``: ``is_mean`` (after truncation, before normalising), ``is_fraction_truncated``
    (share of tokens, or sequences, over the threshold), ``is_batch_norm_factor`` when normalising.
    """
    if level not in IS_LEVELS:
        raise ValueError(f"algorithm.rollout_is={level!r} is unknown: use token or sequence (or null: off)")
    if not threshold > 0:
        raise ValueError(f"algorithm.rollout_is_threshold={threshold} must be > 0")
    mask = response_mask.to(log_ratio.dtype)
    if level == "token":
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
        over_mask = response_mask if normalize_mask is None else normalize_mask
        if level == "token":
            mean = masked_mean(weights, over_mask)
        else:
            has_token = over_mask.bool().any(dim=-1)
            per_seq = weights.amax(dim=-1)  # one weight per sequence (all its tokens carry it)
            mean = per_seq[has_token].mean() if bool(has_token.any()) else torch.zeros(())
        if float(mean) > 1e-8:
            weights = weights / mean
        metrics["rollout_corr/is_batch_norm_factor"] = float(mean) if float(mean) > 1e-8 else 1.0
    return weights, metrics


@dataclass(frozen=True)
class Criterion:
    """One rejection criterion: verl's option name and its bounds on the statistic.

    k1 options keep lower_log <= stat <= upper_log (stat a sum/mean of -log rho, so the bounds are logs
    of bounds on pi_rollout / pi_train); k2/k3 options keep stat <= upper (``lower_log`` None).
    """

    option: str
    upper: float
    lower_log: float | None = None
    upper_log: float | None = None


def _bad_rs(rollout_rs: Any, why: str) -> ValueError:
    return ValueError(f"algorithm.rollout_rs={rollout_rs!r}: {why}")


def parse_rejection(
    rollout_rs: str,
    rollout_rs_threshold: str | float | None = None,
    lower: float = 0.5,
    upper: float = 2.0,
) -> list[Criterion]:
    """The criteria of ``algorithm.rollout_rs``, each with its bounds.

    verl's spelling: a comma list of :data:`RS_OPTIONS` (duplicates dropped, every one must pass) and
    ``rollout_rs_threshold`` with one entry per option or one shared entry (comma separated); a k1 entry is
    ``lower_upper`` on pi_rollout / pi_train, or one number u meaning [1/u, u]; k2/k3 take one upper bound.
    The project's names ``token`` / ``sequence`` / ``geometric`` (alone) are ``token_k1`` /
    ``seq_sum_k1`` / ``seq_mean_k1`` with ``lower <= rho <= upper`` on rho = pi_train / pi_rollout itself.
    Raises ValueError with one line naming the key.
    """
    if not isinstance(rollout_rs, str) or not rollout_rs.strip():
        raise _bad_rs(rollout_rs, f"give a comma list of {', '.join(RS_OPTIONS)} (or null: off)")
    names = list(dict.fromkeys(p.strip() for p in rollout_rs.split(",") if p.strip()))
    if any(n in RS_ALIASES for n in names):
        return [_alias_criterion(rollout_rs, names, lower, upper)]
    unknown = [n for n in names if n not in RS_OPTIONS]
    if unknown:
        raise _bad_rs(
            rollout_rs,
            f"unknown {unknown[0]!r}; use {', '.join(RS_OPTIONS)} (or token | sequence | geometric)",
        )
    if rollout_rs_threshold is None:
        raise ValueError(
            f"algorithm.rollout_rs={rollout_rs} needs algorithm.rollout_rs_threshold (e.g. 2.0, or 0.5_2.0 for k1)"
        )
    specs = [s.strip() for s in str(rollout_rs_threshold).split(",") if s.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(
            f"algorithm.rollout_rs_threshold={rollout_rs_threshold!r} needs one entry or {len(names)} "
            f"(one per criterion of rollout_rs={rollout_rs})"
        )
    specs = specs * len(names) if len(specs) == 1 else specs
    return [_threshold_criterion(name, spec) for name, spec in zip(names, specs)]


def _alias_criterion(rollout_rs: str, names: list[str], lower: float, upper: float) -> Criterion:
    """``token`` / ``sequence`` / ``geometric`` (alone): ``lower <= rho <= upper`` as a k1 criterion."""
    if len(names) > 1:
        raise _bad_rs(
            rollout_rs,
            "token | sequence | geometric (bounded by rollout_rs_lower/upper) cannot be chained; "
            "write them as token_k1 | seq_sum_k1 | seq_mean_k1 with rollout_rs_threshold",
        )
    if not 0 < lower <= upper:
        raise ValueError(f"algorithm.rollout_rs_lower/upper need 0 < lower <= upper, got {lower}, {upper}")
    # lower <= rho <= upper  <=>  -log(upper) <= k1 = -log rho <= -log(lower)
    return Criterion(RS_ALIASES[names[0]], 1.0 / lower, -math.log(upper), -math.log(lower))


def _threshold_criterion(name: str, spec: str) -> Criterion:
    """One verl criterion with its ``rollout_rs_threshold`` entry: k1 ``lower_upper`` or u = [1/u, u];
    k2/k3 one upper bound."""
    where = f"algorithm.rollout_rs_threshold entry {spec!r} for {name}"
    try:  # (float() itself reads "0.5_2" as 52.0: split first, refuse "_" for k2/k3)
        if "_" in spec and not name.endswith("k1"):
            raise ValueError(spec)
        parts = [float(p) for p in spec.split("_")]
    except ValueError:
        shape = "a number u or lower_upper" if name.endswith("k1") else "one number (no lower bound)"
        raise ValueError(f"{where}: must be {shape}") from None
    if len(parts) > 2 or any(not p > 0 for p in parts):
        raise ValueError(f"{where}: bounds must be positive numbers")
    if name.endswith("k1"):
        lo, hi = parts if len(parts) == 2 else (1.0 / parts[0], parts[0])
        return Criterion(name, hi, math.log(lo), math.log(hi))
    return Criterion(name, parts[0])


@torch.no_grad()
def rejection_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, criteria: list[Criterion]
) -> tuple[torch.Tensor, dict[str, float]]:
    """The response mask with the tokens or sequences that fail any criterion removed (verl semantics).

    log_ratio, response_mask: (B, T). Token log ratios are clamped to +-20 first (as verl), then
    k1 = -log rho, k2 = (log rho)^2 / 2, k3 = rho - 1 - log rho per token; ``token_*`` tests each token,
    ``seq_sum_*`` / ``seq_mean_*`` / ``seq_max_*`` the sum / mean / max over a sequence's valid tokens (a
    failing sequence loses all its tokens). Returns (mask, same dtype as response_mask; metrics
    ``rollout_corr/rs_masked_fraction`` = share of valid tokens removed, ``rs_seq_masked_fraction`` =
    share of non-empty sequences that lost a token, and per criterion ``rs_<option>_masked_fraction``).
    """
    valid = response_mask.bool()
    lr = torch.where(valid, torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND), torch.zeros_like(log_ratio))
    per_token = {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}
    lengths = valid.sum(dim=-1).clamp(min=1)
    kept = valid.clone()
    metrics: dict[str, float] = {}
    for c in criteria:
        where, estimator = c.option.rsplit("_", 1)
        stat = per_token[estimator]
        if where == "seq_sum":
            stat = _seq_sum(stat, valid).unsqueeze(-1)
        elif where == "seq_mean":
            stat = (_seq_sum(stat, valid) / lengths).unsqueeze(-1)
        elif where == "seq_max":
            stat = torch.where(valid, stat, torch.full_like(stat, -math.inf)).amax(dim=-1, keepdim=True)
        if c.lower_log is not None:
            passes = (stat >= c.lower_log) & (stat <= c.upper_log)
        else:
            passes = stat <= c.upper
        passes = passes.expand_as(valid)
        metrics[f"rollout_corr/rs_{c.option}_masked_fraction"] = masked_mean((~passes).float(), valid).item()
        kept &= passes
    has_token = valid.any(dim=-1)
    lost = (valid & ~kept).any(dim=-1)
    metrics["rollout_corr/rs_masked_fraction"] = masked_mean((~kept).float(), valid).item()
    metrics["rollout_corr/rs_seq_masked_fraction"] = (
        lost.float().sum() / has_token.sum().clamp(min=1)
    ).item()
    return kept.to(response_mask.dtype), metrics


def masked_is_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    lower: float = 0.5,
    upper: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Rejection with the project's names: keep where lower <= ratio <= upper, the ratio being rho_t per
    token (``token``), prod_t rho_t (``sequence``) or exp(mean_t log rho_t) (``geometric``); see
    :func:`rejection_mask` (log_ratio, response_mask: (B, T))."""
    return rejection_mask(log_ratio, response_mask, parse_rejection(level, None, lower, upper))


def rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: Any,
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, float]]:
    """IS weights and rejection on pi_train(old) / pi_rollout, as configured: (loss_mask, is_weights, metrics).

    old_log_prob: (B, T) the trainer's log-probs of the sampled tokens (verl's old_log_prob; the current
    policy's in bypass mode); rollout_log_prob: (B, T) the rollout engine's; response_mask: (B, T) 1 on
    valid tokens. ``cfg``: the algorithm config (attribute access: ``rollout_is``, ``rollout_is_threshold``,
    ``rollout_is_batch_normalize``, ``rollout_is_batch_normalize_mask``, ``rollout_rs``,
    ``rollout_rs_threshold``, ``rollout_rs_lower``, ``rollout_rs_upper``).

    As verl: the IS weights are computed over the full ``response_mask`` (a sequence weight is the product
    over all its tokens, rejected ones included); rejection only removes tokens from the returned
    ``loss_mask`` (same dtype as ``response_mask``); batch normalisation averages over the response mask
    unless ``rollout_is_batch_normalize_mask=loss``. ``is_weights`` (B, T), detached, zero on padding, or
    None when ``rollout_is`` is null. Metrics: those of :func:`truncated_is_weights` and
    :func:`rejection_mask` (``rollout_corr/`` prefix); the mismatch itself is :func:`mismatch_metrics`.
    """
    with torch.no_grad():
        valid = response_mask.bool()
        log_ratio = torch.where(
            valid, old_log_prob.detach() - rollout_log_prob, torch.zeros_like(old_log_prob)
        )
        loss_mask, weights, metrics = response_mask, None, {}
        if cfg.rollout_rs is not None:
            criteria = parse_rejection(
                cfg.rollout_rs, cfg.rollout_rs_threshold, cfg.rollout_rs_lower, cfg.rollout_rs_upper
            )
            loss_mask, rs_metrics = rejection_mask(log_ratio, response_mask, criteria)
            metrics.update(rs_metrics)
        if cfg.rollout_is is not None:
            if cfg.rollout_is_batch_normalize_mask not in IS_NORMALIZE_MASKS:
                raise ValueError(
                    f"algorithm.rollout_is_batch_normalize_mask={cfg.rollout_is_batch_normalize_mask!r}: "
                    "use response or loss"
                )
            weights, is_metrics = truncated_is_weights(
                log_ratio,
                response_mask,
                cfg.rollout_is,
                cfg.rollout_is_threshold,
                cfg.rollout_is_batch_normalize,
                loss_mask if cfg.rollout_is_batch_normalize_mask == "loss" else response_mask,
            )
            metrics.update(is_metrics)
    return loss_mask, weights, metrics


def _valid_rs(value: Any) -> bool:
    try:
        parse_rejection(value, "1.0")
    except ValueError:
        return False
    return True


ROLLOUT_CORRECTION_KNOBS = {
    "rollout_is": Knob(None, "rollout/trainer TIS weights over the full response mask: token | sequence | null (off)", str, choices=(None, *IS_LEVELS)),
    "rollout_is_threshold": Knob(2.0, "TIS: weights truncated at this value", float, valid=lambda c: c > 0, rule="> 0"),
    "rollout_is_batch_normalize": Knob(False, "TIS: rescale the weights to mean 1 over the batch"),
    "rollout_is_batch_normalize_mask": Knob("response", "TIS batch normalisation averages over: response (every valid token, verl) | loss (the tokens left after rejection)", str, choices=IS_NORMALIZE_MASKS),
    "rollout_rs": Knob(None, "rejection (masked IS): verl's criteria token_k1|k2|k3, seq_sum_k*, seq_mean_k*, seq_max_k2|k3, comma-chained, with rollout_rs_threshold; or token | sequence | geometric bounded by rollout_rs_lower/upper; null (off)", str, valid=_valid_rs, rule="a comma list of token_k1..k3, seq_sum_k1..k3, seq_mean_k1..k3, seq_max_k2|k3, or one of token | sequence | geometric"),
    "rollout_rs_threshold": Knob(None, "rejection bounds of verl's criteria, one entry or one per criterion: lower_upper on pi_rollout/pi_train (or u = [1/u, u]) for k1, an upper bound for k2/k3", str),
    "rollout_rs_lower": Knob(0.5, "rejection token|sequence|geometric: lowest kept ratio pi_train / pi_rollout", float, valid=lambda x: x > 0, rule="> 0"),
    "rollout_rs_upper": Knob(2.0, "rejection token|sequence|geometric: highest kept ratio pi_train / pi_rollout", float, valid=lambda x: x > 0, rule="> 0"),
}  # fmt: skip


# ==== the step plug-ins: rollout correction before the update, mismatch figures after it ============


@register_step(
    "rollout_correction",
    "before_update",
    # bypass mode corrects inside its loss (on pi_current / pi_rollout), not here
    enabled=lambda cfg: (
        (cfg.rollout_is is not None or cfg.rollout_rs is not None) and cfg.policy_loss_mode != "bypass_mode"
    ),
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
